"""The sample run's report in a real browser: headless Chromium with no network loads it without
errors, shows the funnel and the histograms (decoded images with non-zero natural sizes), and
takes a screenshot.  Skipped where Chromium is absent (.ci/browser-setup installs it)."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dsdata.beam.pipeline import run_recipe
from dsdata.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)

# Runs in the page after load and writes what it finds into the DOM, which --dump-dom prints.
# The error listener is installed first (capture phase), so failed resource loads count too.
_ERRORS = ("<script>window.__errors=[];window.addEventListener('error',e=>window.__errors.push("
           "String(e.message||(e.target&&(e.target.src||e.target.href))||e)),true);</script>")
_CHECK = """<script>window.addEventListener('load',()=>{
const images={};for(const i of document.images){images[i.id]=[i.naturalWidth,i.naturalHeight,i.complete];}
const p=document.createElement('pre');p.id='dsdata-browser-check';
p.textContent=JSON.stringify({images,errors:window.__errors,title:document.title,
  ids:[...document.querySelectorAll('[id]')].map(e=>e.id)});
document.body.appendChild(p);});</script>"""


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    """The default recipe on pipelines/samples (what `dsdata run` does with no arguments)."""
    out = tmp_path_factory.mktemp("sample") / "out"
    stats = run_recipe(load_recipe(str(REPO / "pipelines" / "pretrain.yaml")), str(out))
    return out, stats


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    # No network: every host resolves to nothing and every proxied request goes to a closed port,
    # so a report that fetched anything would log a failed load.
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
            f"--user-data-dir={profile}", "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr", "--v=0", "--hide-scrollbars"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed: run .ci/browser-setup (Debian package 'chromium')")
def test_sample_report_renders_in_headless_chromium(sample_run, tmp_path):
    out, stats = sample_run
    report = out / "report.html"
    page = report.read_text(encoding="utf-8")
    # The check page is the report plus the two scripts; the report itself has none.
    assert "<script" not in page
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("<head>", "<head>" + _ERRORS, 1).replace("</body>", _CHECK + "</body>", 1),
                       encoding="utf-8")
    dom = _chromium(["--virtual-time-budget=10000", "--dump-dom", checked.as_uri()], tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="dsdata-browser-check">(.*?)</pre>', dom.stdout, re.S)
    assert found, "the check script did not run: " + dom.stderr[-2000:]
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                        .replace("&gt;", ">"))
    assert result["errors"] == []
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert result["title"] == "dsdata run report: pretrain"
    images = result["images"]
    expected = {"funnel", "hist-length", "hist-lang", "hist-lang-score", "hist-relevance", "hist-perplexity",
                "hist-dup-cluster"}
    assert expected <= set(images), images
    for element_id, (width, height, complete) in images.items():
        assert complete and width > 100 and height > 100, (element_id, width, height)
    assert {"funnel-table", "reasons", "recipe", "reasons-lang", "reasons-rules"} <= set(result["ids"])

    shot = tmp_path / "report.png"
    taken = _chromium([f"--screenshot={shot}", "--window-size=1000,2400", report.as_uri()], tmp_path / "profile2")
    assert taken.returncode == 0 and shot.stat().st_size > 10_000, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("DSDATA_REPORT_SCREENSHOT"):  # how docs/report.png is made
        shutil.copy(shot, os.environ["DSDATA_REPORT_SCREENSHOT"])


@pytest.mark.slow
def test_sample_report_draws_the_difficulty_cutoffs_and_cluster_sizes(sample_run):
    out, stats = sample_run
    difficulty = json.loads((out / "difficulty.json").read_text())
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="hist-perplexity"' in page and 'id="hist-dup-cluster"' in page
    caption = re.search(r'<p id="perplexity-cutoffs"[^>]*>(.*?)</p>', page).group(1)
    for lang, info in difficulty["languages"].items():
        c = info["cutoffs"]
        assert f"{lang}: easy &lt; {c['easy_below']}, hard &gt; {c['hard_above']}" in caption
    info = json.loads((out / "run.json").read_text())
    assert [s["name"] for s in info["stages"]] == stats["stage_order"][1:]
    assert any(s["name"] == "relevance" and s["params"]["threshold"] == 0.5 for s in info["stages"])
