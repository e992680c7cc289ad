"""Checkpoints: model + optimizer through torch.distributed.checkpoint (sharded, reshardable), the
rest of the run's state (step, LR schedule, loss scaler, clipper history, loader position, RNG) as
one JSON file written last — a directory without it is incomplete and ignored.

RUN_DIR/checkpoints/step_00000040/{__0_0.distcp, .metadata, trainer_state.json}

Resume runs no code a checkpoint file could carry (DCP itself would unpickle in full); what is
admitted is docs/train.md's ("What resume trusts"), anything else is one `CheckpointError` line.
"""
from __future__ import annotations

import base64
import io
import json
import os
import pickle
import re
import shutil
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from dsdata.io.storage_errors import OutOfSpace, free_bytes, tree_bytes
from dsdata.io.untrusted_files import UntrustedFileError, confined_file, load_json_file

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d{8})\Z")  # \Z: "$" also matches before a final newline


class CheckpointError(Exception):
    """A checkpoint that cannot be trusted or read (printed as one line)."""


# ---------------------------------------------------------------- reading DCP files without running code

METADATA_MAX_BYTES = 256 << 20  # a DCP `.metadata` of 1,000 tensors is ~0.2 MB
# What a DCP `.metadata` pickle refers to (torch 2.6-2.13): its dataclasses, and how torch pickles
# sizes, layouts and the checkpoint path.  dtypes and memory formats are admitted by type below.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format)):
            return getattr(torch, name)
        raise CheckpointError(f"refers to {module}.{name}, which DCP metadata never holds")


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose `.metadata` is read by `_MetadataUnpickler` and checked to name only files
    inside the checkpoint directory."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        file_name = os.path.basename(path)  # the caller names the checkpoint directory
        with open(path, "rb") as fh:  # _check_confined made sure it is a regular file of the folder's own
            data = fh.read(METADATA_MAX_BYTES + 1)
        if len(data) > METADATA_MAX_BYTES:
            raise CheckpointError(f"{file_name} is over {METADATA_MAX_BYTES} bytes: not DCP metadata, which is far smaller")
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except CheckpointError as exc:
            raise CheckpointError(f"{file_name} {exc}; refusing to load it") from None
        except Exception as exc:  # truncated or garbled: pickle raises many kinds
            raise CheckpointError(f"{file_name} is not readable DCP metadata ({type(exc).__name__}: {exc})") from None
        if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
            raise CheckpointError(f"{file_name} is not DCP metadata (it holds a {type(metadata).__name__})")
        for info in metadata.storage_data.values():
            name = getattr(info, "relative_path", None)
            if (not isinstance(info, _StorageInfo) or not isinstance(name, str) or not name
                    or name != os.path.basename(name) or name in (".", "..")):
                raise CheckpointError(f"{file_name} names a data file outside its checkpoint directory ({name!r})")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner reading non-tensor values (param-group numbers, names) with weights_only=True."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as exc:
            lines = str(exc).splitlines() or [type(exc).__name__]
            # torch's message is a page of advice; its one fact is the "WeightsUnpickler error" line.
            detail = next((line.split("error:", 1)[1] for line in lines if "WeightsUnpickler error:" in line), lines[0])
            detail = detail.split(" was not an allowed global")[0].strip()
            raise CheckpointError(f"the value of {read_item.dest_index.fqn} is not plain data ({detail}); "
                                  "refusing to load it") from None
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes, with the value read safely
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class GlobalRng:
    """torch's global generators (CPU, and CUDA when in use) as a checkpointable part of the trainer."""

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode("ascii")
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
        if "cuda" in state and torch.cuda.is_available():
            cuda = bytearray(base64.b64decode(state["cuda"]))
            torch.cuda.set_rng_state(torch.frombuffer(cuda, dtype=torch.uint8))


class Checkpointer:
    def __init__(self, directory: str, keep: int, layout):
        self.directory, self.keep, self.layout = directory, max(1, keep), layout
        if layout.writes_metrics:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        layout.barrier()

    def complete_steps(self) -> list[int]:
        if not os.path.isdir(self.directory):
            return []
        steps = []
        for name in os.listdir(self.directory):
            match = _STEP_DIR.match(name)
            # lexists: a state file that is a FIFO or a link is refused by load(), not skipped unseen
            if match and os.path.lexists(os.path.join(self.directory, name, STATE_FILE)):
                steps.append(int(match.group(1)))
        return sorted(steps)

    def latest(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"step_{step:08d}")

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> str:
        tmp = os.path.join(self.directory, f".tmp_step_{step:08d}")
        try:
            return self._save(step, tmp, model, optimizer, state)
        except BaseException as exc:
            # A full disk (or a stop) half-way: no partial checkpoint is left to fill the disk.
            if not self.layout.writes_metrics:
                raise
            needed = _state_bytes(model, optimizer)
            room = free_bytes(self.directory)
            room = None if room is None else room + tree_bytes(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            # torch's writer reports a full disk as "unexpected pos N vs M", inside a CheckpointException
            # (a BaseException): say what it was.
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)) and room is not None and room < needed:
                raise OutOfSpace(tmp, needed) from exc
            raise

    def _save(self, step: int, tmp: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              state: dict[str, Any]) -> str:
        final = self.path(step)
        if self.layout.writes_metrics:
            shutil.rmtree(tmp, ignore_errors=True)
        self.layout.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        optim_sd = self.layout.optimizer_state_to_save(optim_sd)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
        self.layout.barrier()
        names = self.layout.names_on_any_rank(
            [name for name, param in _named_parameters(model) if optimizer.state.get(param)])
        if self.layout.writes_metrics:
            state = dict(state, optimizer_state_keys=names)
            with open(os.path.join(tmp, STATE_FILE + ".part"), "w") as fh:
                json.dump(state, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(os.path.join(tmp, STATE_FILE + ".part"), os.path.join(tmp, STATE_FILE))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for old in self.complete_steps()[:-self.keep]:
                shutil.rmtree(self.path(old), ignore_errors=True)
        self.layout.barrier()
        return final

    def load(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Load model and optimizer; returns the trainer state (JSON).  Refuses an untrusted or damaged
        checkpoint with a CheckpointError naming it."""
        path = self.path(step)
        self._check_confined(path)
        try:
            state = load_json_file(os.path.join(path, STATE_FILE), STATE_FILE)
            if not isinstance(state, dict):
                raise ValueError(f"{STATE_FILE} holds a {type(state).__name__}, not an object")
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {path}: {STATE_FILE} is unreadable ({exc}); delete the checkpoint "
                                  "to resume from an earlier one") from None
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

        try:
            self._load_dcp(path, model, optimizer, state)
        except (Exception, CheckpointException) as exc:
            cause = _checkpoint_error_in(exc)
            if cause is not None:
                raise CheckpointError(f"checkpoint {path}: {cause}") from None
            # A shape that changed since the save, a truncated file: the user's to fix, in one line.
            raise CheckpointError(f"checkpoint {path} does not load into this run ({_first_line(exc)}); it was "
                                  "saved for another model, or is damaged: use another --run-dir, or delete it to "
                                  "resume from an earlier checkpoint") from None
        return state

    def _check_confined(self, path: str) -> None:
        """A checkpoint's folder and every file in it are its own: a step folder that is a link, or a
        file that links out of the folder (or is a FIFO or device) is refused before anything is read."""
        if os.path.islink(path):
            raise CheckpointError(f"checkpoint {path} is a symbolic link to {os.path.realpath(path)}; checkpoints "
                                  "are folders the trainer wrote: remove the link")
        for folder, dirs, names in os.walk(path):
            for name in dirs + names:
                relative = os.path.relpath(os.path.join(folder, name), path)
                try:
                    if name in names:
                        confined_file(path, relative, f"checkpoint {path}")
                    elif os.path.islink(os.path.join(folder, name)):
                        raise UntrustedFileError(f"checkpoint {path}: {relative!r} is a link to a folder")
                except UntrustedFileError as exc:
                    raise CheckpointError(f"{exc}; a checkpoint's files must lie in its own folder") from None

    def _load_dcp(self, path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  state: dict[str, Any]) -> None:
        # get_state_dict gives every parameter optimizer state (a zero-lr step) so DCP has a target
        # for each saved tensor; parameters that had no state when saved (frozen, never stepped) may
        # be absent from the checkpoint, and their state is dropped again after loading.
        # Checked here first: inside dcp.load a failed metadata read is retold as an AssertionError.
        SafeFileSystemReader(path).read_metadata()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        target = {"model": model_sd, "optim": optim_sd}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(target, storage_reader=SafeFileSystemReader(path),
                     planner=_WeightsOnlyLoadPlanner(allow_partial_load=True))
        set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
        keep = set(state.get("optimizer_state_keys", []))
        keep = self.layout.after_checkpoint_load(model, optimizer, keep)
        for name, param in _named_parameters(model):
            if name not in keep:
                optimizer.state.pop(param, None)


def _rank_failures(exc: BaseException) -> list[BaseException]:
    """What each rank raised, when `exc` is DCP's CheckpointException (rank -> (exception, traceback))."""
    return [f[0] if isinstance(f, tuple) else f for f in (getattr(exc, "failures", None) or {}).values()]


def _first_line(exc: BaseException) -> str:
    """`Type: message` of what went wrong, taken from inside DCP's per-rank wrapper when there is one."""
    exc = next(iter(_rank_failures(exc)), exc)
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _checkpoint_error_in(exc: BaseException) -> CheckpointError | None:
    """The CheckpointError behind `exc`: DCP wraps what a rank raised in a CheckpointException."""
    if isinstance(exc, CheckpointError):
        return exc
    for inner in _rank_failures(exc):
        if isinstance(inner, CheckpointError):
            return inner
    context = exc.__cause__ or exc.__context__
    return _checkpoint_error_in(context) if context is not None else None


def _named_parameters(model: torch.nn.Module):
    seen = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        name = name.removeprefix("module.").replace("_orig_mod.", "")
        if id(param) in seen:
            continue
        seen.add(id(param))
        yield name, param


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """About what a checkpoint of this model and optimizer takes on disk: its tensors' bytes."""
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values() if isinstance(t, torch.Tensor))
    for per_param in optimizer.state.values():
        total += sum(t.numel() * t.element_size() for t in per_param.values() if isinstance(t, torch.Tensor))
    return total
