"""A build bisection's JUnit (reports/junit_builds.py): one test case per signature answered, a failure
naming the build for a regression or a rate change, the posterior and MTTFs as properties; valid
against the xunit2 schema with test-case properties; written by `soakmatrix bisect --builds --junit`."""

from __future__ import annotations

from pathlib import Path

import pytest
from junitparser import Error, Failure, Skipped, xunit2

from soakmatrix.matrix.build_bisect import BuildSettings, VirtualBuildOracle, bisect_builds
from soakmatrix.matrix.build_bisect.report import to_json
from soakmatrix.reports.junit_builds import build_bisection_suite, write_build_bisection_junit

XSD = Path(__file__).parent / "data" / "junit-10-testcase-properties.xsd"


def _props(case) -> dict[str, str]:
    return {p.name: p.value for p in case.properties()}


def _cases(path) -> dict[str, xunit2.TestCase]:
    (suite,) = list(xunit2.JUnitXml.fromfile(str(path)))
    return {case.name: case for case in suite}


def test_a_regression_beside_another_signature_is_a_failure_naming_its_build(tmp_path):
    # the target regressed at b5; another signature hangs on every build, none named
    oracle = VirtualBuildOracle(8, 5, 1800.0, seed=3, background_mttf_s=1800.0)
    result = bisect_builds([f"b{i}" for i in range(8)], oracle, BuildSettings(confidence=0.95))
    doc = {**to_json(result), "cell": {"id": "c1", "name": "cell one"}}
    path = write_build_bisection_junit(doc, tmp_path / "out" / "junit.xml")
    cases = _cases(path)
    verdicts = {a.signature: a.verdict for a in result.signatures}
    assert set(cases) == set(verdicts)
    for name, case in cases.items():
        props = _props(case)
        assert props["verdict"] == verdicts[name] and case.classname == "soakmatrix.build_bisect.c1"
        if verdicts[name] in ("regression", "rate_change"):
            (failure,) = case.result
            assert isinstance(failure, Failure) and failure.type == f"{verdicts[name]}:{name}"
            assert f"b{result.first_bad}" in failure.message and "posterior" in failure.message
            assert props["first_bad"] == props["range"].split("..")[0] and "posterior" in props
            assert float(props["mttf_after_s"]) > 0
        elif verdicts[name] == "old":
            assert case.result == [] and case.is_passed
        else:       # the other signature, answered as far as the target's probes went
            assert verdicts[name] == "undecided" and isinstance(case.result[0], Error)
    assert result.first_bad == 5 and verdicts[result.signature] == "regression"
    xmlschema = pytest.importorskip("xmlschema")
    xmlschema.XMLSchema11(str(XSD)).validate(str(path))


def test_a_rate_change_names_its_build_and_both_mttfs():
    doc = {"status": "rate_change", "signature": "shm", "confidence": 0.99, "posterior": 0.996,
           "builds": [{"build": f"b{i}"} for i in range(4)], "probes": 30, "gpu_hours": 12.5, "notes": [],
           "signatures": [{"signature": "shm", "verdict": "rate_change", "target": True, "crash": False,
                           "first_bad": "b2", "range": ["b2", "b2"], "posterior": 0.996, "hangs": 9,
                           "hangs_on_bad_build": 4, "hangs_before": 2, "mttf_after_s": 1800.0,
                           "mttf_before_low_s": 14400.0},
                          {"signature": "nccl", "verdict": "undecided", "target": False, "crash": False,
                           "first_bad": None, "range": ["b1", "b1"], "posterior": 0.6, "hangs": 2}]}
    suite = build_bisection_suite(doc)
    cases = {c.name: c for c in suite}
    (failure,) = cases["shm"].result
    assert isinstance(failure, Failure) and failure.type == "rate_change:shm"
    assert failure.message == ("rate change at b2: MTTF before at least 4h, after 30m, posterior 0.996 "
                               "(stated 99%)")
    props = _props(cases["shm"])
    assert (props["last_good"], props["mttf_before_low_s"], props["target"]) == ("b1", "14400.0", "true")
    (error,) = cases["nccl"].result
    assert isinstance(error, Error) and error.type == "undecided"
    assert {p.name: p.value for p in suite.properties()}["builds"] == "b0..b3 (4)"


def test_no_signature_answered_is_the_status_alone():
    doc = {"status": "not_reproduced", "signature": None, "confidence": 0.99, "builds": [{"build": "a"}],
           "notes": ["the bad build b did not hang in 24.0 h of load"], "signatures": []}
    (case,) = list(build_bisection_suite(doc))
    assert case.name == "build-bisection" and isinstance(case.result[0], Skipped)
    doc = {**doc, "status": "inconclusive", "signature": "shm"}
    (case,) = list(build_bisection_suite(doc))
    assert case.name == "shm" and isinstance(case.result[0], Error) and case.result[0].type == "inconclusive"
