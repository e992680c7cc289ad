import os
import shutil
from pathlib import Path

import pytest

# Assertions in the shared S3 test helpers (tests/object_store.py) report their operands as in a test.
pytest.register_assert_rewrite("object_store")

REPO = Path(__file__).resolve().parents[1]
# The real dev data lives beside the checkout (../shared/data); DSDATA_SHARED_DATA names it elsewhere
# (a worktree whose sibling folder is not `shared`).
SHARED_DATA = Path(os.environ.get("DSDATA_SHARED_DATA") or REPO.parent / "shared" / "data")

# torch.compile on CPU builds C++ (Inductor's CPU backend): tests that compile skip without a compiler.
needs_compiler = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("c++") is None,
                                    reason="torch.compile on CPU needs a C++ compiler (gcc / c++ not on PATH)")

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real dev data in ../shared/data (beside the checkout, not part of it): every test that
    reads it asks for this fixture, so that without the folder it skips and says why."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared dev data not found at {SHARED_DATA} (it lives beside the checkout, not in it)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server on 127.0.0.1 for the whole session (tests/object_store.py)."""
    pytest.importorskip("boto3", reason="boto3 (apache-beam[aws], the s3 extra) is not installed")
    from object_store import start_s3_server

    try:
        server = start_s3_server()
    except RuntimeError as exc:
        pytest.skip(f"no S3 server: {exc}")
    try:
        yield server
    finally:
        server.stop()
