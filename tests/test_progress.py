"""Live progress: worker tallies seen while a real Beam pipeline runs, on the in-process and the
multi-process runner, and the line/bar the launching process prints."""
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from dsdata.beam.pipeline import DEFAULT_RUNNER
from dsdata.beam.counters import StageCounter
from dsdata.report.progress import Progress, ProgressWatcher, counts_from_metrics, format_line, resolve_mode

REPO = Path(__file__).resolve().parents[1]

# The in-process test's DoFn finds the watcher here (same process, so the same module globals).
_WATCHERS: dict[str, ProgressWatcher] = {}


class _CountAndWaitForProgress(beam.DoFn):
    """Counts like a stage DoFn; at element `hold_at` it waits until a progress line shows it.

    That makes "progress is visible while the pipeline runs" deterministic: the pipeline cannot
    finish before the watcher has printed a line with a non-zero count.
    """

    def __init__(self, hold_at: int, line_file: str | None = None, watcher_key: str | None = None,
                 shown: str = r"busy: .*slow"):
        self.hold_at, self.line_file, self.watcher_key, self.shown = hold_at, line_file, watcher_key, shown

    def setup(self):
        self.n_in = StageCounter("dsdata.slow", "in")
        self.n_kept = StageCounter("dsdata.slow", "kept")
        self.n_rejected = StageCounter("dsdata.slow", "rejected.odd")
        self.seen = 0

    def _progress_text(self) -> str:
        if self.watcher_key is not None:
            watcher = _WATCHERS[self.watcher_key]
            return "\n".join(watcher.lines) + watcher.stream.getvalue()
        return Path(self.line_file).read_text() if os.path.exists(self.line_file) else ""

    def process(self, x):
        self.n_in.inc()
        self.seen += 1
        if self.seen == self.hold_at:
            deadline = time.time() + 60
            while time.time() < deadline and not re.search(self.shown, self._progress_text()):
                time.sleep(0.05)
        if x % 2:
            self.n_rejected.inc()
        else:
            self.n_kept.inc()
            yield x


def _pipeline(options, hold_at, **kw):
    p = beam.Pipeline(options=PipelineOptions(options))
    _ = p | beam.Create(range(400), reshuffle=False) | beam.ParDo(_CountAndWaitForProgress(hold_at, **kw))
    return p


@pytest.mark.parametrize("flags", [
    [f"--runner={DEFAULT_RUNNER}"],
    pytest.param(["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"],
                 marks=pytest.mark.slow, id="portable-loopback"),
], ids=lambda f: "in-process" if len(f) == 1 else None)
def test_runner_in_this_process_shows_counts_while_running(flags):
    stream = io.StringIO()
    watcher = ProgressWatcher("lines", ["slow"], interval=0.2, stream=stream)
    _WATCHERS["in-process"] = watcher
    with watcher:
        with _pipeline(flags, hold_at=150, watcher_key="in-process") as p:
            watcher.attach(p)
        final = watcher.totals()
    # A line printed mid-run: the DoFn was still holding element 150 when it was written.
    mid = [line for line in watcher.lines if "busy: slow" in line]
    assert mid, watcher.lines
    read = int(re.search(r"read (\d+)", mid[0]).group(1))
    assert 0 < read < 400
    assert stream.getvalue().splitlines()[: len(watcher.lines)] == watcher.lines
    # The tally agrees with the runner's own Metrics (what remote runners are read from).  The
    # embedded portable job service hands back no user Metrics at all: there the tally is all there is.
    if "--runner=PortableRunner" not in flags:
        assert counts_from_metrics(p.result.metrics()) == {("slow", "in"): 400, ("slow", "kept"): 200,
                                                           ("slow", "rejected.odd"): 200}
    assert final.stages["slow"] == {"in": 400, "kept": 200, "rejected": 200}
    assert final.read == 400 and final.kept == 200 and final.rejected == 200


@pytest.mark.slow
def test_multi_process_workers_report_through_their_tally_files(tmp_path, monkeypatch):
    # The worker subprocesses unpickle the DoFn above: they must import this test module.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), str(REPO),
                                                      os.environ.get("PYTHONPATH", "")]))
    lines = tmp_path / "progress.txt"
    stream = open(lines, "w", buffering=1)
    watcher = ProgressWatcher("lines", ["slow"], interval=0.5, stream=stream)
    flags = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    with watcher:
        with _pipeline(flags, hold_at=50, line_file=str(lines)) as p:
            watcher.attach(p)
        time.sleep(1.5)  # workers flush their tally about once a second; they have exited by now
        progress_dir = watcher._dir
        files = [f for f in os.listdir(progress_dir) if f.endswith(".json")]
    stream.close()
    # Worker subprocesses wrote the counts, not this process.
    assert any(not f.endswith(f"-{os.getpid()}.json") for f in files), files
    mid = [line for line in watcher.lines if "busy: slow" in line]
    assert mid, watcher.lines
    assert 0 < int(re.search(r"read (\d+)", mid[0]).group(1)) <= 400
    assert not os.path.exists(progress_dir)  # the watcher cleans up after itself


def test_format_line_names_the_front_stage_and_its_rate():
    order = ["read", "clean", "lang", "dedup"]
    before = Progress({("read", "in"): 100, ("read", "kept"): 100, ("clean", "in"): 90, ("clean", "kept"): 90,
                       ("lang", "in"): 80, ("lang", "kept"): 70, ("lang", "rejected.lang_not_kept"): 10}, order)
    now = Progress({("read", "in"): 300, ("read", "kept"): 299, ("read", "rejected.bad_json"): 1,
                    ("clean", "in"): 290, ("clean", "kept"): 290, ("lang", "in"): 280, ("lang", "kept"): 250,
                    ("lang", "rejected.lang_not_kept"): 30}, order)
    line = format_line(now, before, elapsed=75, dt=10)
    assert line == ("dsdata: 0:01:15 read 300, kept 0, rejected 31, 20 docs/s, busy: read → clean → lang")
    idle = format_line(now, now, elapsed=85, dt=10)
    assert "0 docs/s" in idle and "no stage counting" in idle


def test_resolve_mode():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert resolve_mode("auto", stream=io.StringIO()) == "lines"
    assert resolve_mode("auto", stream=Tty()) == "bar"
    assert resolve_mode("bar", quiet=True) == "off"
    assert resolve_mode("lines") == "lines"
    with pytest.raises(ValueError):
        resolve_mode("fancy")


def test_bar_mode_draws_a_tqdm_bar():
    stream = io.StringIO()
    watcher = ProgressWatcher("bar", ["slow"], interval=0.2, stream=stream)
    _WATCHERS["bar"] = watcher
    with watcher:
        with _pipeline([f"--runner={DEFAULT_RUNNER}"], hold_at=120, watcher_key="bar",
                       shown=r"busy: slow") as p:
            watcher.attach(p)
    drawn = stream.getvalue()
    assert watcher.lines == []
    assert re.search(r"dsdata: *\d+ docs", drawn), drawn
    # drawn mid-run (the DoFn waited for it), and once more complete when the run ended
    assert re.search(r"kept \d+, rejected \d+, busy: slow", drawn.split("kept 200, rejected 200")[0])
    assert "kept 200, rejected 200" in drawn


def test_cli_progress_flag_is_checked_and_quiet_run_prints_no_progress(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DSDATA_PROGRESS_INTERVAL": "0.01"}
    bad = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", "--progress", "fancy"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'fancy'" in bad.stderr
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"id": str(i), "text": f"doc {i}"}) + "\n" for i in range(50)))
    (tmp_path / "r.yaml").write_text("name: t\ninput: {paths: ['*.jsonl']}\nstages:\n  - rules: {}\n")
    quiet = subprocess.run([sys.executable, "-m", "dsdata.cli", "run", str(tmp_path / "r.yaml"), "--output",
                            str(tmp_path / "out"), "--quiet", "--progress", "lines"], cwd=REPO, env=env,
                           capture_output=True, text=True)
    assert quiet.returncode == 0, quiet.stderr
    assert "busy:" not in quiet.stderr
    assert json.loads(quiet.stdout.splitlines()[-1])["input"] == 50
