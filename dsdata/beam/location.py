"""Where a run's files go: a local directory or an object-store prefix (s3://, gs://, …), one API.

Outputs go through Beam's FileSystems, which picks the file system by the path's scheme.  A local
file is written under a temporary name, fsynced and renamed, so a final name is never partial; an
object appears only when its upload completes, so it is written under its final name.  Files that
mark a finished result (stats.json, shards/manifest.json) are written last, with `write_bytes`.
Object stores have no folders: removing one removes the objects under its prefix.
"""
from __future__ import annotations

import functools
import glob
import logging
import os
import re
import shutil
import sys
import uuid
from contextlib import contextmanager

from apache_beam.io.filesystem import CompressionTypes, FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.utils.retry import PermanentException

from dsdata.io.inputs import InputPathError, glob_match
from dsdata.io.object_storage import EndpointUnreachable
from dsdata.io.outlock import OutputDirError
from dsdata.io.outfiles import atomic_write_bytes
from dsdata.core.names import is_remote

_COPY_CHUNK = 8 << 20


def write_bytes(path: str, data: bytes) -> None:
    """Write a whole file so that no reader ever sees it partial (see the module docstring)."""
    if is_remote(path):
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            fh.write(data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write_bytes(path, data)


def upload(local_path: str, path: str) -> None:
    """Copy the finished local file `local_path` to the remote `path`, streamed in chunks."""
    with open(local_path, "rb") as src, \
            FileSystems.create(path, "application/octet-stream", CompressionTypes.UNCOMPRESSED) as dst:
        while block := src.read(_COPY_CHUNK):
            dst.write(block)


def download(path: str, local_path: str, max_bytes: int | None = None) -> int:
    """Copy the remote file `path` to `local_path` (a new file); at most `max_bytes` + 1 bytes, so the
    caller sees an untrusted object's surplus byte.  Returns the bytes written."""
    written = 0
    limit = None if max_bytes is None else max_bytes + 1
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as src, \
            open(local_path, "xb") as dst:
        while limit is None or written < limit:
            block = src.read(_COPY_CHUNK if limit is None else min(_COPY_CHUNK, limit - written))
            if not block:
                break
            dst.write(block)
            written += len(block)
    return written


def storage_error(exc: BaseException) -> str:
    """One line for what a file system raised: Beam wraps a client's error (S3's AccessDenied,
    NoSuchBucket, a refused connection) in a BeamIOError holding it per path."""
    details = getattr(exc, "exception_details", None)
    while isinstance(details, dict) and details:  # a match wraps an exists() wraps the client's error
        exc = next(iter(details.values()))
        details = getattr(exc, "exception_details", None)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def use_object_storage(paths: list[str], options) -> None:
    """Give Beam's file systems the run's PipelineOptions (or flags) before its Pipeline exists, and
    when `paths` name s3:// objects, check once that the endpoint answers (`probe_s3_endpoint`)."""
    if isinstance(options, (list, tuple)):
        from apache_beam.options.pipeline_options import PipelineOptions

        options = PipelineOptions(list(options))
    FileSystems.set_options(options)
    s3 = [p for p in paths if p.startswith("s3://")]
    if s3:
        bound_s3_requests()
        probe_s3_endpoint(options, s3[0][len("s3://"):].split("/", 1)[0])


# How long the launch probe waits for the S3 endpoint to accept a connection and answer.
PROBE_TIMEOUT_S = 5


def probe_s3_endpoint(options, bucket: str) -> None:
    """One HEAD of `bucket` at the options' S3 endpoint, short timeout, no retry: ObjectStorageError in
    one line when it is unreachable or no credentials are found; any answer (even 403, 404) passes.
    Why: Beam retries a call that fails without an HTTP status for ~10 minutes of silence."""
    import boto3
    from apache_beam.options.pipeline_options import S3Options
    from botocore import exceptions as boto_errors
    from botocore.config import Config

    from dsdata.io.object_storage import ObjectStorageError

    s3 = options.view_as(S3Options)
    given = s3.s3_endpoint_url or "AWS's default"
    try:
        # The same settings Beam's S3 client (apache_beam/io/aws/clients/s3/boto3_client.py) is made with.
        client = boto3.session.Session().client(
            "s3", region_name=s3.s3_region_name, api_version=s3.s3_api_version, use_ssl=not s3.s3_disable_ssl,
            verify=s3.s3_verify, endpoint_url=s3.s3_endpoint_url, aws_access_key_id=s3.s3_access_key_id,
            aws_secret_access_key=s3.s3_secret_access_key, aws_session_token=s3.s3_session_token,
            config=Config(connect_timeout=PROBE_TIMEOUT_S, read_timeout=PROBE_TIMEOUT_S,
                          retries={"total_max_attempts": 1}))
    except (ValueError, boto_errors.BotoCoreError) as exc:
        raise ObjectStorageError(f"S3 endpoint {given}: {_first_line(exc)} (check --s3_endpoint_url)") from None
    endpoint = client.meta.endpoint_url
    try:
        client.head_bucket(Bucket=bucket)
    except boto_errors.ClientError:
        return  # the server answered
    except (boto_errors.NoCredentialsError, boto_errors.PartialCredentialsError) as exc:
        raise ObjectStorageError(
            f"no S3 credentials for {endpoint} ({_first_line(exc)}): pass --s3_access_key_id and "
            "--s3_secret_access_key, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws, an "
            "instance role)") from None
    except (boto_errors.ConnectionError, boto_errors.HTTPClientError) as exc:
        raise ObjectStorageError(
            f"cannot reach the S3 endpoint {endpoint}: {_first_line(exc)} (check --s3_endpoint_url and that "
            "the server runs)") from None
    except boto_errors.BotoCoreError as exc:  # an invalid bucket name, region, …: Beam would retry these too
        raise ObjectStorageError(f"S3 endpoint {endpoint}: {_first_line(exc)}") from None


# Every S3 request after the launch: a connection within CONNECT_TIMEOUT_S, a first byte of the answer
# within READ_TIMEOUT_S, botocore's own retry once.
CONNECT_TIMEOUT_S, READ_TIMEOUT_S, S3_ATTEMPTS = 5, 20, 2
S3_CLIENT_MODULE = "apache_beam.io.aws.clients.s3.boto3_client"
_S3_CLIENT_METHODS = ("get_object_metadata", "get_stream", "list", "create_multipart_upload", "upload_part",
                      "complete_multipart_upload", "delete", "delete_batch", "copy")


def bound_s3_requests() -> None:
    """Make every S3 request of this process fail fast, in one line, when the endpoint stops answering:
    Beam's S3 client is replaced by one with short timeouts whose calls raise a PermanentException
    (not retried) on a connection-level failure; a server's answer keeps Beam's handling.  Idempotent;
    a no-op without boto3, and until Beam's client module is imported (mlimport defers it to the first
    S3 file opened, and calls this then)."""
    boto3_client = sys.modules.get(S3_CLIENT_MODULE)
    if boto3_client is None or boto3_client.boto3 is None or getattr(boto3_client.Client, "dsdata_bounded", False):
        return
    boto3_client.Client = _bounded_client_class(boto3_client.Client)
    # Beam's S3 uploader logs the failure's traceback before raising it: the run's one line says it.
    logging.getLogger().addFilter(lambda record: not isinstance(sys.exc_info()[1], EndpointUnreachable))


class S3EndpointUnreachable(EndpointUnreachable, PermanentException):
    """EndpointUnreachable as Beam's retry decorators see it: permanent, raised at once."""


def _bounded_client_class(beam_client: type) -> type:
    from apache_beam.utils import retry

    def fail_fast(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - only a connection-level failure is turned
                cause = _connection_failure(exc)
                if cause is None:
                    raise
                if isinstance(cause, EndpointUnreachable):
                    raise cause from None
                raise S3EndpointUnreachable(f"the S3 endpoint {self.client.meta.endpoint_url} stopped answering "
                                  f"({_first_line(cause)}); check that the server runs") from None
        return call

    class BoundedS3Client(beam_client):
        dsdata_bounded = True

        def __init__(self, options):
            import boto3
            from apache_beam.io.aws.clients import client_options
            from apache_beam.options.pipeline_options import S3Options
            from botocore.config import Config

            super().__init__(options)
            api_version = client_options.view_options(options, S3Options).s3_api_version
            self.client = boto3.session.Session().client(
                "s3", api_version=api_version, **client_options.get_client_kwargs(options, S3Options),
                config=Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                              retries={"total_max_attempts": S3_ATTEMPTS}))

    for name in _S3_CLIENT_METHODS:
        setattr(BoundedS3Client, name, fail_fast(getattr(beam_client, name)))
    # Beam's get_range retries under its own backoff: the undecorated body, fast-failing, under the
    # same decorator (which retries a 5xx answer, not EndpointUnreachable).
    BoundedS3Client.get_range = retry.with_exponential_backoff()(fail_fast(beam_client.get_range.__wrapped__))
    return BoundedS3Client


def _connection_failure(exc: BaseException) -> BaseException | None:
    """The connection-level failure behind `exc` (itself, a cause or context), or None."""
    from botocore import exceptions as boto_errors

    seen, current = set(), exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (EndpointUnreachable, boto_errors.ConnectionError, boto_errors.HTTPClientError)):
            return current
        current = current.__cause__ or current.__context__
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def check_remote_output(path: str) -> str:
    """A remote OUT (s3://, gs://): one probe object written and deleted, so a missing bucket,
    refused credentials or an unreachable endpoint are one line (OutputDirError) before anything
    runs; returns `path` without a trailing /.  Not locked: docs/engines.md "Object storage"."""
    path = path.rstrip("/")
    probe = join(path, f".dsdata-write-probe-{uuid.uuid4().hex}")
    try:
        with _one_line_errors():
            write_bytes(probe, b"x")
            remove_file(probe)
    except OSError as exc:
        raise OutputDirError(f"--output {path} is not writable: {exc}") from None
    return path


def check_remote_inputs(patterns: list[str]) -> dict[str, list[str]]:
    """The objects each remote input pattern names, listed once: the run reads exactly these, so one
    deleted later is an `unreadable_file` row.  InputPathError when a pattern cannot be listed or
    names no object."""
    found: dict[str, list[str]] = {}
    for pattern in patterns:
        try:
            with _one_line_errors():
                matched = list_objects(pattern)
        except OSError as exc:
            raise InputPathError(f"cannot list input '{pattern}': {exc}") from None
        if not matched:
            raise InputPathError(f"no files match input '{pattern}'; check the path or pass --input GLOB")
        found[pattern] = [m.path for m in matched]
    return found


def _list_prefix(prefix: str) -> list[FileMetadata]:
    """Every object whose name starts with `prefix` (taken literally), at any depth: one listing."""
    return FileSystems.match([glob.escape(prefix) + "**"])[0].metadata_list


def _visible(relative: str, size: int) -> bool:
    """An object under a folder that is an input: no level of its name hidden ('.'), not a folder
    placeholder (an empty object whose key ends in '/')."""
    return (bool(relative) and not (relative.endswith("/") and size == 0)
            and not any(n.startswith(".") for n in relative.split("/") if n))


def list_objects(pattern: str) -> list[FileMetadata]:
    """The objects a remote input names, sorted: the object whose key is exactly the pattern, else for
    a pattern without *, ? or [ every object under PATTERN/, else those the glob matches (** across
    levels).  Hidden levels ('.') are left out unless the pattern names one."""
    literal = re.match(r"[^*?\[]*", pattern).group(0)
    found = _list_prefix(literal)
    exact = [m for m in found if m.path == pattern and not pattern.endswith("/")]
    if exact:
        return exact
    if literal == pattern:
        folder = pattern.rstrip("/") + "/"
        chosen = [m for m in found if m.path.startswith(folder) and _visible(m.path[len(folder):], m.size_in_bytes)]
    else:
        base = literal[:literal.rfind("/") + 1]
        wanted = pattern[len(base):].split("/")
        hidden_ok = any(part.startswith(".") for part in wanted)
        chosen = [m for m in found if m.path.startswith(base) and glob_match(wanted, m.path[len(base):].split("/"))
                  and (hidden_ok or _visible(m.path[len(base):], m.size_in_bytes))]
    return sorted(chosen, key=lambda m: m.path)


class ObjectSizes:
    """Size and time of named objects from one listing per folder; None for an object that is gone."""

    def __init__(self):
        self._listed: dict[str, dict[str, FileMetadata]] = {}

    def metadata(self, path: str) -> FileMetadata | None:
        for prefix, found in self._listed.items():
            if path.startswith(prefix):
                return found.get(path)
        folder = path[:path.rfind("/") + 1]
        self._listed[folder] = {m.path: m for m in _list_prefix(folder)}
        return self._listed[folder].get(path)


@contextmanager
def _one_line_errors():
    """What a file system raises inside the block → OSError(one line); Beam's own error log held back."""
    logging.disable(logging.ERROR)
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - every file system raises its own kinds
        raise OSError(storage_error(exc)) from None
    finally:
        logging.disable(logging.NOTSET)


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def size(path: str) -> int:
    if not is_remote(path):
        return os.path.getsize(path)
    return FileSystems.match([path], [1])[0].metadata_list[0].size_in_bytes


def make_dirs(path: str) -> None:
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def join(base: str, *names: str) -> str:
    return FileSystems.join(base, *names) if is_remote(base) else os.path.join(base, *names)


def remove_tree(folder: str) -> None:
    """Delete `folder` and everything in it (remote: every object under its prefix); absent is fine."""
    if not is_remote(folder):
        shutil.rmtree(folder, ignore_errors=True)
        return
    found = FileSystems.match([folder.rstrip("/") + "/**"])[0].metadata_list
    if found:
        FileSystems.delete([m.path for m in found])


def remove_file(path: str) -> None:
    """Delete one file if it is there."""
    if not is_remote(path):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return
    if FileSystems.exists(path):
        FileSystems.delete([path])
