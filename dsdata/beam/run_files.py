"""The Beam side of the report: a run's remote output read through Beam's FileSystems, and the
run information (runner, options, versions) only a Beam run knows.

Importing this module registers the store for `scheme://` paths with dsdata.report.files, so the
report package itself never imports Beam.
"""
from __future__ import annotations

import dataclasses

import datetime as _dt
import json
import platform
import re
from typing import IO, Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from dsdata.core.names import shown_path
from dsdata.report.files import register_remote_files


class BeamFiles:
    """dsdata.report.files.RunFiles over Beam's FileSystems (gs://, s3://, hdfs://, local)."""

    def join(self, base: str, *parts: str) -> str:
        return FileSystems.join(base, *parts)

    def exists(self, path: str) -> bool:
        return FileSystems.exists(path)

    def open(self, path: str) -> IO[bytes]:
        # Uncompressed and seekable: pyarrow reads a Parquet footer and the column chunks it needs.
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)

    def create(self, path: str) -> IO[bytes]:
        return FileSystems.create(path)

    def files_in(self, folder: str, suffix: str) -> list[str]:
        return [m.path for m in FileSystems.match([FileSystems.join(folder, "*" + suffix)])[0].metadata_list]

    def delete(self, paths: list[str]) -> None:
        FileSystems.delete(paths)


register_remote_files(BeamFiles())


# Credentials given as Beam flags (--s3_secret_access_key, --s3_session_token, …) are shown as this
# in run.json and the report, which are shared with the outputs.
REDACTED = "<redacted>"
_CREDENTIAL_OPTION = re.compile(r"secret|password|token|access_key|credential", re.IGNORECASE)


def run_info(recipe, stages, options, seconds: float | None = None) -> dict[str, Any]:
    """What the report shows as 'the recipe as run': stages with resolved parameters, runner, inputs, versions."""
    import apache_beam

    from dsdata import __version__

    try:
        from apache_beam.options.pipeline_options import StandardOptions

        runner = options.view_as(StandardOptions).runner
        flags = options.get_all_options(drop_default=True, retain_unknown_options=True)
    except Exception:  # noqa: BLE001 - a custom options object: record what we can
        runner, flags = None, {}
    return {
        "recipe": recipe.name,
        "recipe_path": recipe.path,
        "inputs": [shown_path(p) for p in recipe.inputs],  # UTF-8 whatever the names' bytes
        "input_format": recipe.input_format,
        # Each stage's declared charts travel with the run: the report draws them from this file alone.
        "stages": [{"name": s.name, "params": _jsonable(s.parameter_values()),
                    "charts": [dataclasses.asdict(c) for c in s.charts]} for s in stages],
        "runner": str(runner) if runner is not None else None,
        "pipeline_options": _jsonable({k: REDACTED if _CREDENTIAL_OPTION.search(k) else v
                                       for k, v in flags.items() if v is not None}),
        "dsdata_version": __version__,
        "beam_version": apache_beam.__version__,
        "python_version": platform.python_version(),
        "finished_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": seconds,
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
