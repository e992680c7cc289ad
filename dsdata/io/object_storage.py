"""The object-storage flags every command that takes a location accepts: Beam's own S3Options
(tests/test_object_storage_flags.py checks the names), declared without importing Beam, so that they
mean the same everywhere.  GCS (gs://) takes no flags: Google's application-default credentials.
"""
from __future__ import annotations

import argparse

# (flag, metavar, help); the values Beam's S3 file system gives boto3's client.
S3_VALUE_FLAGS = (
    ("--s3_endpoint_url", "URL", "the S3 endpoint (MinIO, SeaweedFS, Ceph, a private AWS endpoint), "
     "e.g. https://s3.example.internal:8333; default: AWS's, from boto3's configuration"),
    ("--s3_region_name", "REGION", "the endpoint's region, e.g. us-east-1"),
    ("--s3_access_key_id", "KEY", "access key id (default: boto3's chain: AWS_ACCESS_KEY_ID, ~/.aws, an "
     "instance or pod role; prefer it: flags show in the runner's UI, run.json shows them <redacted>)"),
    ("--s3_secret_access_key", "SECRET", "secret access key (default: boto3's chain, as above)"),
    ("--s3_session_token", "TOKEN", "session token of temporary credentials"),
    ("--s3_verify", "CA_BUNDLE", "a CA bundle (.pem) to check the endpoint's TLS certificate with"),
    ("--s3_api_version", "VERSION", "the S3 API version boto3 asks for (rarely needed)"),
)
S3_SWITCHES = (("--s3_disable_ssl", "no TLS (an http:// --s3_endpoint_url is plain HTTP already)"),)


class ObjectStorageError(Exception):
    """An object store that cannot be used at all (its endpoint unreachable, no credentials): one line,
    found before anything runs."""


class EndpointUnreachable(ObjectStorageError):
    """The S3 endpoint stopped answering while the run used it (refused, no route, a timeout): an
    environment error that stops the run in one line naming the endpoint, never a record's row
    (dsdata/beam/errors.py); raised by dsdata/beam/location.py's bounded S3 client."""


def add_object_storage_flags(parser: argparse.ArgumentParser) -> None:
    """Add the S3 endpoint and credential flags to `parser`, as one group in its --help."""
    group = parser.add_argument_group(
        "object storage (s3://, gs://)",
        "S3's endpoint and credentials (Beam's S3Options; `dsdata run` forwards them to every worker). "
        "An endpoint that does not answer is one line within seconds. gs:// uses Google's "
        "application-default credentials.")
    for flag, metavar, help_ in S3_VALUE_FLAGS:
        group.add_argument(flag, default=None, metavar=metavar, help=help_)
    for flag, help_ in S3_SWITCHES:
        group.add_argument(flag, action="store_true", default=False, help=help_)


def object_storage_beam_args(args: argparse.Namespace) -> list[str]:
    """The parsed object-storage flags, written back as Beam options (`--s3_endpoint_url=URL`, …)."""
    out = []
    for flag, _, _ in S3_VALUE_FLAGS:
        value = getattr(args, flag[2:], None)
        if value is not None:
            out.append(f"{flag}={value}")
    for flag, _ in S3_SWITCHES:
        if getattr(args, flag[2:], False):
            out.append(flag)
    return out
