"""Known issues: the example ships the seeds' five reports and matches them; errors name file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.contracts.yamlsrc import SpecError
from soakmatrix.reports.known_issues import load_known_issues, match_result

EXAMPLE = Path(__file__).resolve().parent.parent / "matrix" / "examples" / "known_issues.yaml"


def hang(**kw) -> CellResult:
    return CellResult(cell_id="c", cell_name="n", outcome="hang", **kw)


def test_the_example_ships_the_five_seed_reports():
    issues = load_known_issues(EXAMPLE)
    assert [i.id for i in issues] == ["vllm-42271", "vllm-41530", "vllm-40926", "vllm-event-sync-to-list", "vllm-37729"]
    assert all(i.title and i.url.startswith("https://github.com/vllm-project/vllm/") for i in issues)


@pytest.mark.parametrize("result, expected", [
    (hang(signature="shm_broadcast_timeout", flags={"mtp": 1, "cudagraph_mode": "FULL_AND_PIECEWISE", "tp": 4}),
     "vllm-42271"),
    (hang(signature="shm_broadcast_timeout", flags={"mtp": 1, "cudagraph_mode": "FULL_DECODE_ONLY"}), "vllm-41530"),
    (hang(signature="shm_broadcast_timeout", flags={"mtp": 2}, log_tail=["TimeoutError: RPC call to sample_tokens timed out."]),
     "vllm-40926"),
    (hang(signature="shm_broadcast_timeout", fingerprint="4496d388c3b2"), "vllm-40926"),
    (hang(signature="event_sync_stall", stuck_frames=["cuEventSynchronize (libcuda.so)", "GPUModelRunner._to_list (x.py:1)"]),
     "vllm-event-sync-to-list"),
    (hang(signature="silent_stall", flags={"prefix_caching": True, "kv_cache_dtype": "fp8"}), "vllm-37729"),
    (hang(signature="silent_stall", flags={"prefix_caching": False, "kv_cache_dtype": "fp8"}), None),
    (CellResult(cell_id="c", cell_name="n", outcome="passed", fingerprint="4496d388c3b2"), None),
])
def test_findings_match_automatically(result, expected):
    issue = match_result(load_known_issues(EXAMPLE), result)
    assert (issue.id if issue else None) == expected


def test_every_problem_is_reported_with_file_line_and_key(tmp_path):
    bad = tmp_path / "known.yaml"
    bad.write_text("known_issues:\n"
                   "  - id: a\n"
                   "    title: t\n"
                   "    status: maybe\n"
                   "    match: {frames: ['(unclosed'], colour: red}\n"
                   "  - id: b\n"
                   "    url: ftp://x\n"
                   "    match: {fingerprints: [XYZ]}\n")
    with pytest.raises(SpecError) as exc:
        load_known_issues(bad)
    text = str(exc.value)
    assert f"{bad}:4: known_issues[0].status: 'maybe' is not one of" in text
    assert f"{bad}:5: known_issues[0].match.frames[0]: not a regular expression" in text
    assert f"{bad}:5: known_issues[0].match.colour: unknown key" in text
    assert f"{bad}:7: known_issues[1].url: expected an http(s) link" in text
    assert f"{bad}:8: known_issues[1].match.fingerprints: expected a list of hex fingerprints" in text
    assert "known_issues[1].title: required" in text


def test_hostile_yaml_is_refused_by_the_safe_loader(tmp_path):
    bad = tmp_path / "known.yaml"
    bad.write_text("known_issues: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(SpecError, match=r"known\.yaml:1"):
        load_known_issues(bad)
