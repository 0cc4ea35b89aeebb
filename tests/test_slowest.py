"""tests/slowest.py: the slowest tests of a JUnit file, slowest first."""

from __future__ import annotations

from tests.slowest import counts, main, slowest

JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_fast" time="0.5"/>
<testcase classname="tests.test_b" name="test_slow" time="70.25"/>
<testcase classname="tests.test_a" name="test_mid" time="3"/>
<testcase classname="tests.test_c" name="test_broken" time="1"><failure message="x"/></testcase>
<testcase classname="tests.test_c" name="test_gpu" time="0"><skipped message="no GPU"/></testcase>
</testsuite></testsuites>"""


def test_the_slowest_come_first_and_the_count_is_kept(tmp_path, capsys):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    assert slowest(str(path), 2) == [(70.25, "tests.test_b::test_slow"), (3.0, "tests.test_a::test_mid")]
    assert main([str(path), "1"]) == 0
    out = capsys.readouterr().out
    assert "tests.test_b::test_slow" in out and "test_mid" not in out and "1.2 test-minutes" in out
    assert counts(str(path)) == (3, 1, 1)
    assert out.rstrip().splitlines()[-1] == "tests: 3 passed, 1 failed, 1 skipped"   # the run's last line
