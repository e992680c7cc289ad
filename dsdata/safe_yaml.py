"""YAML from files users share, bounded before anything is built from it: `load_bounded` refuses
a file over `MAX_BYTES`, alias expansion past `MAX_NODES` (a "billion laughs") and too deep nesting.
"""
from __future__ import annotations

from typing import Any

import yaml

MAX_BYTES = 1 << 20
MAX_NODES = 100_000


class YamlBoundError(ValueError):
    """A YAML document over the size, expansion or nesting bounds."""


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes of the document with every alias expanded, computed over its distinct nodes (so a
    bomb is measured, not expanded); stops counting past `limit`."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes and not children_done:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children = (
            [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        )
        if not children_done:
            sizes[key] = 0  # in progress: a recursive alias counts as nothing more
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        sizes[key] = min(limit + 1, 1 + sum(sizes.get(id(c), 0) for c in children))
    return sizes[id(root)]


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """A PyYAML error in one line: its problem and where (`line 3, column 9`), without the quoted
    source and caret lines PyYAML's str() adds."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        text = " ".join(part for part in (exc.context, exc.problem) if part)
        return " ".join(f"{text}{where}".split())
    return " ".join(str(exc).split())


def load_bounded(text: str | bytes, what: str, max_bytes: int = MAX_BYTES, max_nodes: int = MAX_NODES) -> Any:
    """`yaml.safe_load` of one document, refusing oversized, alias-bomb and over-deep documents."""
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    if size > max_bytes:
        raise YamlBoundError(f"{what}: {size} bytes; a YAML file here may hold at most {max_bytes}")
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlBoundError(f"{what}: nested too deeply to read") from None
        if node is None:
            return None
        expanded = _expanded_size(node, max_nodes)
        if expanded > max_nodes:
            raise YamlBoundError(
                f"{what}: its aliases expand to over {max_nodes} YAML nodes (an alias bomb?); refusing to load it"
            )
        try:
            return loader.construct_document(node)
        except RecursionError:
            raise YamlBoundError(f"{what}: nested too deeply to read") from None
    finally:
        loader.dispose()
