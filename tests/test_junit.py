"""JUnit output: what a CI dashboard reads for each outcome, checked by parsing it back with
junitparser and by validating it against the Jenkins xunit plugin's published schema."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema
from junitparser import Error, Failure, xunit2

from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.reports.junit import JUnitMergeError, classname_for, merge_junit, write_junit

DATA = Path(__file__).parent / "data"
# The published schema, unchanged, and the one-element extension allowing test-case <properties>
# (Jenkins' junit plugin reads them; junit-10.xsd predates them): see the comment in that file.
PUBLISHED_XSD = DATA / "junit-10.xsd"
EXTENDED_XSD = DATA / "junit-10-testcase-properties.xsd"

T0 = 1_790_000_000.0
FRAMES = ['File "vllm/v1/worker/gpu_model_runner.py", line 2410, in _to_list',
          '    self.transfer_event.synchronize()',
          'File "torch/cuda/streams.py", line 227, in synchronize']
HOSTILE = '</system-out><script>alert("x")</script> & \x1b[31mERROR\x1b[0m'


def make(outcome: str, *, model="zai-org/GLM-5.1", gpu="H200", flags=None, workload="chat-multiturn",
         **kw) -> CellResult:
    flags = {"tp": 8, "mtp": 2, "async_scheduling": True} if flags is None else flags
    from soakmatrix.matrix.cells import Cell
    cell = Cell.make(model, gpu, flags, workload)
    defaults = dict(cell_id=cell.id, cell_name=cell.name, outcome=outcome, model=model, gpu_type=gpu,
                    workload=workload, flags=flags, exposure_s=3600.0, node="node-7", gpu_count=8,
                    engine="vllm", vllm_version="0.33.0", started_at=T0, ended_at=T0 + 3700)
    defaults.update(kw)
    return CellResult(**defaults)


def all_outcomes() -> list[CellResult]:
    return [
        make("passed", flags={"tp": 8, "mtp": 0}, tokens=912_000, requests=4100),
        make("hang", signature="shm_broadcast_timeout", detector="token_progress", time_to_hang_s=2280.0,
             detected_after_s=61.0, exposure_s=2280.0, stuck_frames=FRAMES,
             message="generation_tokens_total flat for 60 s with 15 requests running, 38m into the soak",
             log_tail=["No available shared memory broadcast block found in 60 seconds.", HOSTILE]),
        make("crash", flags={"tp": 4, "mtp": 1}, signature="cuda_illegal_address", detector="process_exit",
             message="engine exited with code 1", log_tail=["RuntimeError: CUDA error: an illegal memory access"]),
        make("config_error", flags={"tp": 8, "mtp": 3}, message="--speculative-config: num_speculative_tokens 3 "
             "not supported with cudagraph FULL", exposure_s=0.0),
        make("infra_error", flags={"tp": 2, "mtp": 0}, gpu="H20", exposure_s=0.0, attempt=3,
             message="node lost: ray node 10.0.0.7 died", retries=["port 8000 taken", "GPU 3 busy"]),
        make("passed", flags={"tp": 2, "mtp": 1}, gpu="H20", attempt=2, retries=["node lost: heartbeat 300 s old"]),
        make("hang", flags={"tp": 4, "mtp": 1}, gpu="H20", signature="silent_stall", detector="token_progress",
             time_to_hang_s=240.0, exposure_s=240.0, attempt=2, retries=["port 8000 taken"]),
    ]


def cases_by_name(path: Path) -> dict[str, xunit2.TestCase]:
    xml = xunit2.JUnitXml.fromfile(str(path))
    return {case.name: case for suite in xml for case in suite}


def props(case: xunit2.TestCase) -> dict[str, str]:
    return {p.name: p.value for p in case.properties()}


@pytest.fixture
def report(tmp_path) -> tuple[Path, list[CellResult]]:
    results = all_outcomes()
    path = write_junit(results, tmp_path / "out" / "junit.xml", "soak-nightly", {"run_id": "r1", "matrix": "nightly.yaml"})
    return path, results


def test_one_case_per_cell_named_by_cell_with_model_gpu_classname(report):
    path, results = report
    cases = cases_by_name(path)
    assert set(cases) == {r.cell_name for r in results}
    hang = cases[results[1].cell_name]
    assert hang.classname == "soakmatrix.zai-org_GLM-5_1.H200"
    assert classname_for("Qwen/Qwen3-0.6B", "GeForce-RTX-5090") == "soakmatrix.Qwen_Qwen3-0_6B.GeForce-RTX-5090"


def test_properties_carry_model_gpu_flags_version_exposure_mttf_signature_detector(report):
    path, results = report
    p = props(cases_by_name(path)[results[1].cell_name])
    assert p["model"] == "zai-org/GLM-5.1" and p["gpu"] == "H200"
    assert (p["flag.tp"], p["flag.mtp"], p["flag.async_scheduling"]) == ("8", "2", "true")
    assert p["vllm_version"] == "0.33.0"
    assert float(p["exposure_s"]) == 2280.0 and float(p["mttf_s"]) == 2280.0
    assert p["signature"] == "shm_broadcast_timeout" and p["detector"] == "token_progress"
    passed = props(cases_by_name(path)[results[0].cell_name])
    assert "mttf_s" not in passed and float(passed["mttf_lower_95_s"]) == pytest.approx(1200.0)


def test_hang_is_a_failure_typed_by_signature_saying_what_stopped_and_when(report):
    path, results = report
    case = cases_by_name(path)[results[1].cell_name]
    [failure] = case.result
    assert isinstance(failure, Failure)
    assert failure.type == "hang:shm_broadcast_timeout"
    assert "generation_tokens_total flat" in failure.message and "38m" in failure.message
    assert case.is_failure and not case.is_error


def test_hang_without_message_gets_one_with_time_and_detector(tmp_path):
    result = make("hang", signature="silent_stall", detector="token_progress", time_to_hang_s=5400.0,
                  detected_after_s=30.0)
    [failure] = cases_by_name(write_junit([result], tmp_path / "j.xml", "s"))[result.cell_name].result
    assert "1h30m" in failure.message and "token_progress" in failure.message


def test_crash_is_a_failure_and_config_and_infra_errors_are_errors(report):
    path, results = report
    cases = cases_by_name(path)
    [crash] = cases[results[2].cell_name].result
    assert isinstance(crash, Failure) and crash.type == "crash:cuda_illegal_address"
    [config] = cases[results[3].cell_name].result
    assert isinstance(config, Error) and config.type == "config_error" and "num_speculative_tokens" in config.message
    [infra] = cases[results[4].cell_name].result
    assert isinstance(infra, Error) and infra.type == "infra_error" and "node lost" in infra.message
    assert cases[results[0].cell_name].is_passed


def test_retried_infra_errors_are_flaky_when_it_passed_and_reruns_otherwise(report):
    path, results = report
    cases = cases_by_name(path)
    flaky = cases[results[5].cell_name]
    assert flaky.is_passed and flaky.is_flaky and not flaky.is_rerun
    assert [f.message for f in flaky.flaky_failures()] == ["node lost: heartbeat 300 s old"]
    infra = cases[results[4].cell_name]
    assert [r.message for r in infra.rerun_failures()] == ["port 8000 taken", "GPU 3 busy"]
    assert all(r.type == "infra_error" for r in infra.rerun_failures())
    hang = cases[results[6].cell_name]
    assert hang.is_failure and len(hang.rerun_failures()) == 1 and not hang.is_flaky


def test_evidence_in_system_out_keeps_hostile_log_lines_as_text(report):
    path, results = report
    out = cases_by_name(path)[results[1].cell_name].system_out
    for frame in FRAMES:
        assert frame in out
    assert "No available shared memory broadcast block" in out
    # markup survives as text; the ESC character XML 1.0 cannot hold is spelled out, not dropped
    assert '</system-out><script>alert("x")</script> &' in out
    assert "\\x1b[31mERROR" in out


def test_suite_counts_and_properties(report):
    path, _ = report
    xml = xunit2.JUnitXml.fromfile(str(path))
    [suite] = list(xml)
    assert suite.name == "soak-nightly"
    assert (suite.tests, suite.failures, suite.errors) == (7, 3, 2)
    assert {p.name: p.value for p in suite.properties()} == {"run_id": "r1", "matrix": "nightly.yaml"}


def test_valid_against_published_schema_with_testcase_properties_extension(report):
    path, _ = report
    xmlschema.XMLSchema11(str(EXTENDED_XSD)).validate(str(path))
    # Without the per-case <properties> the file is valid against the published schema as it is:
    # the extension is the only liberty taken.
    tree = ET.parse(path)
    for case in tree.iter("testcase"):
        for p in case.findall("properties"):
            case.remove(p)
    published = xmlschema.XMLSchema(str(PUBLISHED_XSD))
    published.validate(tree)
    assert not published.is_valid(str(path))   # and the extension is really needed


def test_merge_shards_into_one_suite_last_report_of_a_cell_wins(tmp_path):
    results = all_outcomes()
    a = write_junit(results[:4], tmp_path / "a.xml", "soak-nightly", {"shard": "0"})
    rerun_of_crash = dataclasses.replace(results[2], outcome="passed", signature=None)
    b = write_junit(results[4:] + [rerun_of_crash], tmp_path / "b.xml", "soak-nightly", {"shard": "1"})
    c = write_junit([make("passed", model="Qwen/Qwen3-0.6B", flags={"tp": 1})], tmp_path / "c.xml", "soak-smoke")
    out = merge_junit([a, b, c], tmp_path / "merged" / "all.xml")
    xml = xunit2.JUnitXml.fromfile(str(out))
    suites = {s.name: s for s in xml}
    assert set(suites) == {"soak-nightly", "soak-smoke"}
    nightly = suites["soak-nightly"]
    assert nightly.tests == 7 and nightly.failures == 2 and nightly.errors == 2
    assert cases_by_name(out)[results[2].cell_name].is_passed
    assert xml.tests == 8
    xmlschema.XMLSchema11(str(EXTENDED_XSD)).validate(str(out))


def test_merge_names_the_broken_file_and_line(tmp_path):
    good = write_junit(all_outcomes()[:1], tmp_path / "good.xml", "s")
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites>\n<testsuite name='x'>\n<testcase name='a'>\n</testsuites>\n")
    with pytest.raises(JUnitMergeError, match=r"bad\.xml:4"):
        merge_junit([good, bad], tmp_path / "m.xml")
    other = tmp_path / "other.xml"
    other.write_text("<html/>")
    with pytest.raises(JUnitMergeError, match=r"other\.xml: not JUnit XML"):
        merge_junit([other], tmp_path / "m.xml")
    with pytest.raises(JUnitMergeError, match="missing.xml: no such file"):
        merge_junit([tmp_path / "missing.xml"], tmp_path / "m.xml")
    assert not (tmp_path / "m.xml").exists()


def test_junitparsers_own_merge_reads_our_files(tmp_path):
    """`junitparser merge` works on our files; it writes the plain JUnit flavour, whose `skipped`
    attribute on <testsuites> junit-10.xsd does not allow (hence `soakmatrix report --merge`,
    which stays xunit2); apart from that one attribute its output is valid too."""
    import subprocess
    import sys
    results = all_outcomes()
    a = write_junit(results[:3], tmp_path / "a.xml", "shard-a")
    b = write_junit(results[3:], tmp_path / "b.xml", "shard-b")
    done = subprocess.run([sys.executable, "-m", "junitparser", "merge", str(a), str(b), str(tmp_path / "m.xml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    merged = xunit2.JUnitXml.fromfile(str(tmp_path / "m.xml"))
    assert merged.tests == 7
    assert {c.name for s in merged for c in s} == {r.cell_name for r in results}
    cases = {c.name: c for s in merged for c in s}
    assert props(cases[results[1].cell_name])["signature"] == "shm_broadcast_timeout"
    tree = ET.parse(tmp_path / "m.xml")
    assert tree.getroot().attrib.pop("skipped") == "0"
    xmlschema.XMLSchema11(str(EXTENDED_XSD)).validate(tree)


# -- what every consumer takes (issue 20) --------------------------------------------------------------

THREADS = [{"role": "Worker_TP3", "pid": "77", "thread": "MainThread", "kind": "culprit", "reason": "CUDA/event sync",
            "frames": ["cuEventSynchronize (libcuda.so.595)", "_to_list (vllm/v1/worker/gpu_model_runner.py:7102)"]},
           {"role": "EngineCore", "pid": "70", "thread": "MainThread", "kind": "victim",
            "reason": "shm_broadcast wait (on another engine process)", "frames": ["acquire_read (shm_broadcast.py:1)"]}]


def culprit_hang(tmp_path, **kw):
    log = tmp_path / "server.log"
    log.write_text("x\n")
    defaults = dict(signature="event_sync_stall", fingerprint="057d06d42498", culprit="Worker_TP3 MainThread: CUDA/event sync",
                    threads=THREADS, stuck_frames=THREADS[0]["frames"], gpu_state={"measured": True, "state": "busy"},
                    artifacts={"server_log": str(log), "py_spy": str(tmp_path / "py-spy.txt")},
                    log_tail=["Avg prompt throughput: 0.0 tokens/s"])
    defaults.update(kw)
    return make("hang", **defaults)


def test_evidence_is_attached_culprits_come_first_and_the_known_issue_is_a_property(tmp_path):
    from soakmatrix.reports.known_issues import load_known_issues
    known = load_known_issues(Path(__file__).parent.parent / "matrix" / "examples" / "known_issues.yaml")
    result = culprit_hang(tmp_path)
    path = write_junit([result], tmp_path / "junit.xml", "s", known_issues=known)
    case = cases_by_name(path)[result.cell_name]
    p = props(case)
    assert p["fingerprint"] == "057d06d42498" and p["culprit"].startswith("Worker_TP3")
    assert p["gpu_state"] == "busy"
    assert p["known_issue.id"] == "vllm-event-sync-to-list" and p["known_issue"].startswith("https://github.com/")
    out = case.system_out
    assert f"[[ATTACHMENT|{tmp_path / 'server.log'}]]" in out.splitlines()
    assert out.index("Worker_TP3 MainThread: culprit") < out.index("EngineCore MainThread: victim")
    xmlschema.XMLSchema11(str(EXTENDED_XSD)).validate(str(path))


def test_system_out_is_bounded_and_points_at_the_attachments(tmp_path):
    from soakmatrix.reports import junit
    huge = culprit_hang(tmp_path, log_tail=["y" * 1900] * 60, stuck_frames=["f" * 1900] * 80)
    out = junit.evidence_text(huge)
    assert len(out) <= junit.MAX_SYSTEM_OUT_CHARS and "see the attachments" in out
    assert out.rstrip().endswith("]]")     # the attachment lines survive the cut


def test_a_run_too_big_for_one_file_is_split_under_both_limits(tmp_path):
    from soakmatrix.reports import junit
    results = [make("passed", flags={"tp": 1, "i": i}) for i in range(23)]
    paths = junit.write_junit_files(results, tmp_path / "junit.xml", "s", {"run_id": "r"}, max_cases=10)
    assert [p.name for p in paths] == ["junit.xml", "junit-2.xml", "junit-3.xml"]
    cases = [c.name for p in paths for s in xunit2.JUnitXml.fromfile(str(p)) for c in s]
    assert sorted(cases) == sorted(r.cell_name for r in results) and len(set(cases)) == 23
    for p in paths:
        xmlschema.XMLSchema11(str(EXTENDED_XSD)).validate(str(p))
    # by size too: every file under the byte limit
    big = [culprit_hang(tmp_path, flags={"i": i}, log_tail=["z" * 1500] * 60) for i in range(12)]
    sized = junit.write_junit_files(big, tmp_path / "big.xml", "s", max_bytes=600_000)
    assert len(sized) > 1 and all(p.stat().st_size <= 600_000 for p in sized)
    # a smaller run later removes the parts it no longer needs
    assert [p.name for p in junit.write_junit_files(results[:3], tmp_path / "junit.xml", "s")] == ["junit.xml"]
    assert not (tmp_path / "junit-2.xml").exists() and not (tmp_path / "junit-3.xml").exists()


@pytest.mark.slow
def test_more_than_5000_cells_write_several_files_none_over_30_mb(tmp_path):
    from soakmatrix.reports import junit
    results = [make("hang" if i % 50 == 0 else "passed", flags={"tp": 8, "i": i}, signature="silent_stall",
                    log_tail=["token stall"] * 5) for i in range(5200)]
    paths = junit.write_junit_files(results, tmp_path / "junit.xml", "soak")
    assert len(paths) == 2 and all(p.stat().st_size < 30 * 2**20 for p in paths)
    counts = [sum(len(list(s)) for s in xunit2.JUnitXml.fromfile(str(p))) for p in paths]
    assert counts == [5000, 200]


def test_a_cell_that_passed_after_stalls_says_so_in_properties_and_system_out(tmp_path):
    stalls = [{"detector": "stream", "message": "no token on any of 8 open streams for 6.4 s (threshold 6.0 s)",
               "silent_s": 7.2, "evidence": "/runs/r1/cells/c1/stalls/1"},
              {"detector": "progress", "message": "tokens flat for 9.1 s", "silent_s": 9.8}]
    result = make("passed", stalls=stalls, message="no hang in 3600 s under load; 2 stalls that recovered")
    quiet = make("passed", flags={"tp": 1})
    path = write_junit([result, quiet], tmp_path / "junit.xml", "soak")
    cases = cases_by_name(path)
    case = cases[result.cell_name]
    assert case.is_passed
    assert props(case)["stalls"] == "2" and props(case)["longest_stall_s"] == "9.8"
    assert "stall 1, recovered: 7.2 s of silence (stream: no token" in case.system_out
    assert "stacks: /runs/r1/cells/c1/stalls/1" in case.system_out and "stall 2, recovered: 9.8 s" in case.system_out
    assert "stalls" not in props(cases[quiet.cell_name])


def test_a_hangs_failure_text_names_the_culprits_blocking_frame_not_the_outermost(tmp_path):
    # stuck frames come innermost first: libc and libpython's sleep, then the planted frame, then the loop
    frames = ["clock_nanosleep (libc.so.6)", "time_sleep (libpython3.11.so.1.0)",
              "_park_forever (fixtures/fault_plugin.py:171)", "EngineCore.step (vllm/v1/engine/core.py:667)",
              "_bootstrap (multiprocessing/process.py:314)"]
    result = culprit_hang(tmp_path, signature="silent_stall", stuck_frames=frames)
    case = cases_by_name(write_junit([result], tmp_path / "junit.xml", "s"))[result.cell_name]
    text = case.result[0].text
    assert "stuck in: _park_forever (fixtures/fault_plugin.py:171)" in text and "_bootstrap" not in text
    event_sync = culprit_hang(tmp_path, flags={"i": 1})   # a CUDA sync is itself the blocking frame
    case = cases_by_name(write_junit([event_sync], tmp_path / "j2.xml", "s"))[event_sync.cell_name]
    assert "stuck in: cuEventSynchronize (libcuda.so.595)" in case.result[0].text
