"""Regressions from history (issue 21 item 2): passed on an earlier build, hangs on a later one."""

from __future__ import annotations

import math

import pytest

from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult
from soakmatrix.matrix.contracts.stats import mttf_lower_bound
from soakmatrix.reports.history import HistoryStore
from soakmatrix.reports.junit import case_properties
from soakmatrix.reports.regressions import annotate, build_order, cell_key, find_regressions, rows_of

FLAGS = {"mtp": 1, "async_scheduling": True}


def result(build, outcome="passed", exposure=3600.0, ordinal=None, flags=FLAGS, gpu="H200", signature=None):
    outcome = Outcome(outcome)
    return CellResult(cell_id=f"{gpu}-{build}-{sorted(flags.items())}", cell_name=f"m|{gpu}|...|w" + (f"|{build}" if build else ""),
                      outcome=outcome, model="m", gpu_type=gpu, workload="w", flags=dict(flags),
                      exposure_s=exposure, build=build, build_ordinal=ordinal,
                      signature=signature or ("silent_stall" if outcome.is_finding else None))


def test_passed_then_hangs_is_a_regression_with_its_range_and_strength():
    rows = [(0, result("b0", ordinal=0)), (0, result("b1", "hang", 300, ordinal=1)),
            (0, result("b2", "hang", 200, ordinal=2))]
    (reg,) = find_regressions(rows, confidence=0.9)
    assert (reg.last_good, reg.first_bad, reg.untested) == ("b0", "b1", ())
    assert reg.good_exposure_s == 3600 and reg.good_mttf_lower_s == pytest.approx(3600 / math.log(10))
    assert (reg.bad_hangs, reg.bad_exposure_s, reg.signature) == (1, 300, "silent_stall")
    assert set(reg.bad_cell_ids) == {rows[1][1].cell_id, rows[2][1].cell_id}
    assert reg.describe() == ("last good b0, first bad b1; b0 side: no hang in 1h, MTTF > 26.1m at 90%; "
                              "b1: 1 hang in 5m (silent_stall)")
    assert reg.to_dict()["kind"] == "regression"


def test_good_side_exposure_pools_over_runs_and_earlier_builds():
    rows = [(0, result("b0", exposure=600, ordinal=0)), (1, result("b0", exposure=600, ordinal=0)),
            (1, result("b1", exposure=1200, ordinal=1)), (2, result("b2", "hang", 100, ordinal=2))]
    (reg,) = find_regressions(rows, confidence=0.95)
    assert (reg.last_good, reg.first_bad) == ("b1", "b2")
    assert reg.good_exposure_s == 2400
    assert reg.good_mttf_lower_s == pytest.approx(mttf_lower_bound(2400, 0.95))


def test_builds_without_a_verdict_between_are_untested():
    rows = [(0, result("b0", ordinal=0)), (0, result("b1", "infra_error", 0, ordinal=1)),
            (0, result("b2", "config_error", 0, ordinal=2)), (0, result("b3", "hang", 60, ordinal=3))]
    (reg,) = find_regressions(rows)
    assert (reg.last_good, reg.first_bad, reg.untested) == ("b0", "b3", ("b1", "b2"))
    assert "first bad b3 (untested: b1, b2)" in reg.describe()


def test_a_build_the_cell_never_ran_is_untested_too():
    rows = [(0, result("b0", ordinal=0)), (0, result("b1", ordinal=1, flags={"mtp": 0})),
            (0, result("b2", "hang", 60, ordinal=2))]
    (reg,) = find_regressions(rows)
    assert reg.untested == ("b1",)


def test_no_regression_without_a_good_side_or_without_a_hang():
    assert find_regressions([(0, result("b0", "hang", 60, ordinal=0)), (0, result("b1", "hang", 60, ordinal=1))]) == []
    assert find_regressions([(0, result("b0", ordinal=0)), (0, result("b1", ordinal=1))]) == []
    # hung on b0 too (an earlier run): the hang is older than b1
    rows = [(0, result("b0", "hang", 60, ordinal=0)), (1, result("b0", ordinal=0)), (1, result("b1", "hang", 60, ordinal=1))]
    assert find_regressions(rows) == []
    assert find_regressions([(0, result("", "hang", 60))]) == []   # no builds at all


def test_too_little_exposure_on_the_good_side_is_no_finding():
    rows = [(0, result("b0", exposure=120, ordinal=0)), (0, result("b1", "hang", 600, ordinal=1))]
    assert find_regressions(rows, confidence=0.9) == []   # MTTF > 52 s says nothing against an MTTF of 10 min
    assert len(find_regressions(rows, confidence=0.9, min_ratio=0.05)) == 1


def test_cells_differ_by_flags_and_gpu_but_not_by_build():
    rows = [(0, result("b0", ordinal=0)), (0, result("b1", "hang", 60, ordinal=1)),
            (0, result("b0", ordinal=0, gpu="H20")), (0, result("b1", ordinal=1, gpu="H20"))]
    (reg,) = find_regressions(rows)
    assert reg.gpu == "H200" and reg.cell == cell_key(rows[0][1])
    assert cell_key(rows[0][1]) == cell_key(rows[1][1]) != cell_key(rows[2][1])


def test_history_order_is_first_run_then_ordinal_and_an_explicit_order_wins():
    rows = [(0, result("a", ordinal=0)), (1, result("c", ordinal=1)), (1, result("b", ordinal=0)),
            (2, result("a", ordinal=5))]
    assert build_order(rows) == ["a", "b", "c"]
    rows = [(0, result("new", "hang", 60, ordinal=0)), (0, result("old", ordinal=1))]
    assert find_regressions(rows) == []
    (reg,) = find_regressions(rows, order=["old", "new"])
    assert (reg.last_good, reg.first_bad) == ("old", "new")


def test_annotated_results_carry_the_regression_into_junit_properties():
    rows = [(0, result("b0", ordinal=0)), (0, result("b1", "hang", 300, ordinal=1))]
    regs = find_regressions(rows)
    good, bad = annotate([r for _, r in rows], regs)
    props = case_properties(bad)
    assert props["build"] == "b1"
    assert props["regression.last_good"] == "b0" and props["regression.first_bad"] == "b1"
    assert props["regression"].startswith("last good b0, first bad b1;")
    assert float(props["regression.good_mttf_lower_s"]) == pytest.approx(3600 / math.log(10), abs=0.1)
    assert case_properties(good)["build"] == "b0" and "regression" not in case_properties(good)
    assert "build" not in case_properties(result("", ordinal=None))


def test_rows_come_from_the_history_store_in_run_order(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite") as store:
        first = store.start_run(matrix="m", profile="p")
        store.record(first, result("b0", ordinal=0))
        store.finish_run(first, "finished")
        second = store.start_run(matrix="m", profile="p")
        store.record(second, result("b1", "hang", 120, ordinal=1))
        store.record(second, result("", "passed"))
        rows = rows_of(store)
    assert [(seq, r.build) for seq, r in rows] == [(0, "b0"), (1, "b1")]
    (reg,) = find_regressions(rows)
    assert (reg.last_good, reg.first_bad) == ("b0", "b1")


def test_the_dashboard_shows_regressions_in_their_own_section(tmp_path):
    from soakmatrix.reports.dashboard import build_dashboard

    with HistoryStore(tmp_path / "h.sqlite") as store:
        run = store.start_run(matrix="m", profile="p")
        store.record(run, result("b0", ordinal=0))
        store.record(run, result("b1", "hang", 120, ordinal=1))
        store.finish_run(run, "finished")
    page = build_dashboard(tmp_path / "h.sqlite", tmp_path / "dash").read_text()
    assert page.count('<section id="regressions">') == 1
    section = page[page.index('<section id="regressions">'):]
    assert "Regressions between builds (1)" in section and "<td>b0</td><td>b1</td>" in section
    assert section.index("</section>") < section.index("</main>")


def test_a_history_without_builds_has_no_regression_section(tmp_path):
    from soakmatrix.reports.dashboard import build_dashboard

    with HistoryStore(tmp_path / "h.sqlite") as store:
        run = store.start_run(matrix="m", profile="p")
        store.record(run, result("", "hang", 120))
        assert rows_of(store) == []
    assert 'id="regressions"' not in build_dashboard(tmp_path / "h.sqlite", tmp_path / "dash").read_text()


def test_a_run_being_written_sees_regressions_against_earlier_runs(tmp_path):
    from soakmatrix.reports.regressions import RunRegressions

    with HistoryStore(tmp_path / "h.sqlite") as store:
        first = store.start_run(matrix="m", profile="p")
        store.record(first, result("b0", ordinal=0))
        store.finish_run(first, "finished")
        second = store.start_run(matrix="m", profile="p")
        tracker = RunRegressions(store, second)
        bad = result("b1", "hang", 120, ordinal=1)
        store.record(second, bad)
        (annotated,) = tracker.annotate(store.results(second))
    assert annotated.regression["regression.last_good"] == "b0"
    assert tracker.seq == 1 and len(tracker.past) == 1
