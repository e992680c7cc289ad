"""Test tooling: the Prism runner binary .ci/engines-setup builds (users pass --prism_location)."""
from __future__ import annotations

import os
import shutil

from dsdata.beam.engines.artifacts import engines_cache_dir


def prism_binary() -> str | None:
    """The Prism runner binary built by `go install .../cmd/prism@v<beam version>`, if any."""
    for candidate in (os.environ.get("DSDATA_PRISM"), os.path.join(engines_cache_dir(), "gobin", "prism"),
                      shutil.which("prism")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
