"""`soakmatrix bisect --builds` through the real CLI: a regression planted from the fourth of eight
builds in a hang model is found in virtual time; real builds are refused plainly (not wired yet)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, REPO, free_port

pytestmark = pytest.mark.slow   # every test runs `soakmatrix bisect --builds` as a subprocess

DEMO = EXAMPLES / "demo.yaml"
CELL = "tiny-moe|H200|async_scheduling=false,cudagraph_mode=FULL_DECODE_ONLY,mtp=1,tp=1|staggered"
HANGS = """
seed: 11
hangs:
  - id: regression
    style: shm_broadcast
    when: {mtp: 1, build: [b3, b4, b5, b6, b7]}
    min_running: 1
    mttf_s: 2280
"""


def soakmatrix(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def files(tmp_path):
    (tmp_path / "hangs.yaml").write_text(HANGS)
    (tmp_path / "builds.txt").write_text("".join(f"b{i}: vllm==0.{10 + i}.0\n" for i in range(8)))
    return str(tmp_path / "builds.txt"), str(tmp_path / "hangs.yaml")


def test_virtual_build_bisection_names_the_planted_first_bad_build(tmp_path):
    builds, hangs = files(tmp_path)
    for seed in ("1", "2", "3"):
        out = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", builds, "--hang-model", hangs,
                         "--virtual", "--json", "--quiet", "--seed", seed)
        assert out.returncode == 1, out.stderr
        doc = json.loads(out.stdout)
        assert doc["status"] == "found"
        assert doc["first_bad"] == "b3" and doc["last_good"] == "b2", doc
        assert doc["signature"] == "shm_broadcast_timeout"


def test_unreadable_lists_unknown_builds_and_no_ray_are_usage_errors(tmp_path):
    builds, hangs = files(tmp_path)
    (tmp_path / "names.txt").write_text("b0: vllm==0.10.0\nnightly-b1\n")
    unknown = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", str(tmp_path / "names.txt"),
                         "--hang-model", hangs)
    assert unknown.returncode == 2 and "unknown build 'nightly-b1' (line 2 of the list)" in unknown.stderr
    assert "not a build of" in unknown.stderr and "Traceback" not in unknown.stderr
    (tmp_path / "rel.txt").write_text("a: python:venv/bin/python\nb: vllm==0.11.0\n")
    relative = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", str(tmp_path / "rel.txt"), "--virtual",
                          "--hang-model", hangs)
    assert relative.returncode == 2 and "absolute path" in relative.stderr
    nobody = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", builds, "--hang-model", hangs,
                        "--ray-address", f"127.0.0.1:{free_port()}", "--out", str(tmp_path / "out"))
    assert nobody.returncode == 2 and "cannot reach Ray at 127.0.0.1:" in nobody.stderr
    assert "Traceback" not in nobody.stderr
    (tmp_path / "one.txt").write_text("only: vllm==0.10.0\n")
    short = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", str(tmp_path / "one.txt"),
                       "--hang-model", hangs, "--virtual")
    assert short.returncode == 2 and "--builds" in short.stderr and "Traceback" not in short.stderr


SECTION_MATRIX = """\
name: section
models: {m: {path: org/m}}
gpus: {H200: {count: 2, memory_gb: 141, ray_label: H200}}
workloads: {steady: {kind: random, concurrency: 4}}
builds:
""" + "".join(f"  n{i}: {{pip: vllm==0.{10 + i}.0}}\n" for i in range(7)) + """\
profiles: {p: {soak: 20m, startup: 10m, workloads: [steady], retries: 0}}
sim: {hang_model: hangs.yaml}
"""


def test_good_dot_dot_bad_over_the_matrix_builds_bisects_that_part_of_the_section(tmp_path):
    (tmp_path / "hangs.yaml").write_text("seed: 3\nhangs:\n  - {id: r, style: silent_stall, mttf_s: 2280, "
                                         "when: {build: [n4, n5, n6]}}\n")
    (tmp_path / "m.yaml").write_text(SECTION_MATRIX)
    out = soakmatrix("bisect", str(tmp_path / "m.yaml"), "--cell", "m|H200||steady|n6", "--builds", "n1..n5",
                     "--virtual", "--json", "--quiet", "--seed", "2")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert [b["build"] for b in doc["builds"]] == ["n1", "n2", "n3", "n4", "n5"]
    assert (doc["last_good"], doc["first_bad"]) == ("n3", "n4"), doc
    backwards = soakmatrix("bisect", str(tmp_path / "m.yaml"), "--cell", "m|H200||steady|n6", "--builds", "n5..n1",
                           "--virtual")
    assert backwards.returncode == 2 and "n5 is not before n1" in backwards.stderr


def test_then_flags_bisects_the_flags_on_the_first_bad_build(tmp_path):
    # the hang needs MTP and a build from b3 on: the flag bisection must run on b3 (on the nodes' engine,
    # which no hang of this model matches, the failing cell would not even reproduce)
    builds, hangs = files(tmp_path)
    out = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", builds, "--hang-model", hangs, "--virtual",
                     "--json", "--quiet", "--seed", "1", "--then-flags")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["status"], doc["first_bad"]) == ("found", "b3"), doc
    flags = doc["flags"]
    assert flags["status"] == "found" and flags["minimal"] == ["mtp"], flags
    assert flags["cell"]["name"].endswith("|b3") and flags["signature"] == "shm_broadcast_timeout"
    # what the build bisection saw on b3 is the flag bisection's free exposure, said so
    assert flags["history"]["source"] == "the build bisection on b3" and flags["history"]["exposure_s"] > 0
    text = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", builds, "--hang-model", hangs, "--virtual",
                      "--quiet", "--seed", "1", "--then-flags")
    assert text.returncode == 1, text.stderr
    assert text.stdout.index("first bad build: b3") < text.stdout.index("the flags on the first bad build b3:")
    assert "minimal set: mtp=1" in text.stdout


def test_store_records_the_build_bisection_for_the_dashboard(tmp_path):
    from soakmatrix.reports.history import HistoryStore

    builds, hangs = files(tmp_path)
    store = tmp_path / "history.sqlite"
    out = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", builds, "--hang-model", hangs, "--virtual",
                     "--quiet", "--seed", "1", "--store", str(store))
    assert out.returncode == 1, out.stderr
    with HistoryStore(store) as history:
        (report,) = history.bisections()
    assert (report["kind"], report["first_bad"], report["last_good"]) == ("builds", "b3", "b2")
    assert report["cell"]["name"] == CELL
    site = tmp_path / "site"
    dashboard = soakmatrix("report", str(store), "--out", str(site))
    assert dashboard.returncode == 0, dashboard.stderr
    page = (site / "index.html").read_text()
    assert "first bad build: <b>b3 (last good b2)</b>" in page
    section = page[page.index('<section id="bisections">'):]
    assert "<td>bad</td>" in section and "<td>passed</td>" in section


def test_parallel_rounds_from_the_cli(tmp_path):
    builds, hangs = files(tmp_path)
    out = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", builds, "--hang-model", hangs, "--virtual",
                     "--json", "--quiet", "--seed", "2", "--parallel", "3")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["first_bad"] == "b3" and doc["rounds"] < doc["probes"], doc


def test_a_build_bisection_stopped_by_its_probe_budget_resumes_from_its_journal(tmp_path):
    builds, hangs = files(tmp_path)
    common = ("bisect", str(DEMO), "--cell", CELL, "--builds", builds, "--hang-model", hangs, "--virtual", "--json",
              "--seed", "1", "--out", str(tmp_path / "out"))
    short = soakmatrix(*common, "--max-probes", "3")
    assert short.returncode == 3, short.stderr
    assert json.loads(short.stdout)["probes"] == 3
    resumed = soakmatrix(*common, "--resume")
    assert resumed.returncode == 1, resumed.stderr
    assert "3 answered probe(s) replayed" in resumed.stderr
    doc = json.loads(resumed.stdout)
    assert (doc["status"], doc["first_bad"]) == ("found", "b3") and doc["probes"] > 3
    lines = (tmp_path / "out" / "journal-builds.jsonl").read_text().splitlines()
    assert len(lines) == 1 + doc["probes"] and json.loads(lines[0])["builds"] == [f"b{i}" for i in range(8)]


def test_junit_has_a_failing_case_naming_the_first_bad_build(tmp_path):
    from junitparser import Failure, xunit2

    builds, hangs = files(tmp_path)
    out = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--builds", builds, "--hang-model", hangs, "--virtual",
                     "--quiet", "--seed", "1", "--junit", str(tmp_path / "junit.xml"))
    assert out.returncode == 1, out.stderr
    (suite,) = list(xunit2.JUnitXml.fromfile(str(tmp_path / "junit.xml")))
    case = next(c for c in suite if c.name == "shm_broadcast_timeout")
    (failure,) = case.result
    assert isinstance(failure, Failure) and failure.message.startswith("first bad build b3 (last good b2)")
    flags = soakmatrix("bisect", str(DEMO), "--cell", CELL, "--virtual", "--hang-model", hangs, "--junit",
                       str(tmp_path / "flags.xml"))
    assert flags.returncode == 2 and "--junit is the build bisection's" in flags.stderr
