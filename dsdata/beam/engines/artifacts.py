"""Where the engine artifacts that are not Python packages live: Flink's job-server jar (and its cache).

`.ci/engines-setup` fetches them into one cache directory; the tests and benchmarks look them up here.
"""
from __future__ import annotations

import os
from importlib.metadata import version

# From the installed distribution's metadata: importing apache_beam here would slow every CLI command.
BEAM_VERSION = version("apache-beam")
# The Flink versions Beam 2.77's FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS lists; the jar must match
# both the Beam SDK version and the Flink cluster's minor version.
FLINK_VERSION = "1.20"
# The Flink release whose distribution .ci/engines-setup assembles from PyPI: bin/ and conf/ from the
# apache-flink wheel, lib/ opt/ plugins/ from the apache-flink-libraries sdist.
FLINK_DIST_VERSION = "1.20.3"


def engines_cache_dir() -> str:
    """$DSDATA_ENGINES_CACHE, else /work/.cache/engines where /work/.cache exists, else ~/.cache/dsdata/engines."""
    explicit = os.environ.get("DSDATA_ENGINES_CACHE")
    if explicit:
        return explicit
    if os.path.isdir("/work/.cache"):
        return "/work/.cache/engines"
    return os.path.join(os.path.expanduser("~"), ".cache", "dsdata", "engines")


# Beam publishes no Flink job-server jar that Maven Central serves for Beam 2.77, so .ci/engines-setup
# assembles one from what is served (.ci/flink-job-server/pom.xml): the Flink runner of this Beam release
# with every Flink module at FLINK_DIST_VERSION.  The Python SDK talks to it over the portable job API.
FLINK_JOB_SERVER_BEAM_VERSION = "2.70.0"


def assembled_flink_job_server_jar() -> str:
    """Where .ci/engines-setup puts the job server it assembles with Maven."""
    name = f"beam-runners-flink-{FLINK_DIST_VERSION}-job-server-{FLINK_JOB_SERVER_BEAM_VERSION}.jar"
    return os.path.join(engines_cache_dir(), "flink-job-server", name)


def flink_job_server_jar(flink_version: str = FLINK_VERSION, beam_version: str = BEAM_VERSION) -> str | None:
    """$DSDATA_FLINK_JOB_SERVER_JAR, else the published jar in the engines cache's Maven repository (if
    it was ever served), else the one .ci/engines-setup assembles."""
    explicit = os.environ.get("DSDATA_FLINK_JOB_SERVER_JAR")
    artifact = f"beam-runners-flink-{flink_version}-job-server"
    candidates = [explicit, os.path.join(engines_cache_dir(), "m2", "org", "apache", "beam", artifact, beam_version,
                                         f"{artifact}-{beam_version}.jar"), assembled_flink_job_server_jar()]
    return next((candidate for candidate in candidates if candidate and os.path.isfile(candidate)), None)


def flink_defaults(args: list[str]) -> list[str]:
    """`--flink_job_server_jar=JAR` for a FlinkRunner run that names none, when the engines cache has
    the assembled job server: Maven Central does not serve this Beam's published jar (docs/flink.md)."""
    from dsdata.beam.engines.options import last_option

    if (last_option(args, "flink_job_server_jar") or last_option(args, "job_endpoint")
            or last_option(args, "flink_version") != FLINK_VERSION):
        return []
    jar = flink_job_server_jar()
    return [f"--flink_job_server_jar={jar}"] if jar else []
