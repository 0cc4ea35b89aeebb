"""Build bisection with several signatures and rate changes (matrix/build_bisect/signatures.py,
posterior.py, tuning.py): each signature's verdict from its posterior alone, the censoring of one
signature by another's hang, the search over a virtual oracle for each shape, and the answer through
the CLI with two hangs in the model and no signature named."""

from __future__ import annotations

import json

import pytest

from soakmatrix.matrix.build_bisect import (
    FOUND,
    RATE_CHANGE,
    BuildSettings,
    Tuning,
    VirtualBuildOracle,
    bisect_builds,
    render_text,
    to_json,
)
from soakmatrix.matrix.build_bisect.posterior import ChangePointPosterior
from soakmatrix.matrix.build_bisect.signatures import (
    OLD,
    REGRESSION,
    UNDECIDED,
    SignatureBook,
    verdict,
)
from soakmatrix.matrix.build_bisect.signatures import RATE_CHANGE as RATE_CHANGE_VERDICT
from tests.test_build_bisect_cli import CELL, DEMO, soakmatrix

AIM, C = 0.995, 0.99
M = 1800.0


def posterior(n: int, evidence: dict[int, tuple[int, float]], **tuning) -> ChangePointPosterior:
    post = ChangePointPosterior(n, tuning=Tuning(**tuning))
    for index, (hangs, load) in evidence.items():
        post.builds[index].hangs, post.builds[index].exposure_s = hangs, load
    return post


def test_a_clean_regression_is_a_regression_and_its_rate_change_alternative_is_weighed():
    # b0-b3 passed long soaks, b4-b7 hung often: first bad b4
    post = posterior(8, {0: (0, 10 * M), 1: (0, 2 * M), 2: (0, 2 * M), 3: (0, 20 * M),
                         4: (3, 3 * M), 5: (1, M), 6: (1, M), 7: (4, 4 * M)})
    a = verdict("s", post, AIM, C)
    assert (a.verdict, a.first, a.hangs_before) == (REGRESSION, 4, 0) and a.posterior >= AIM
    # with the rate-change model off the clean model alone answers, at least as surely
    off = verdict("s", posterior(8, {i: (b.hangs, b.exposure_s) for i, b in enumerate(post.builds)},
                                 rate_change_prior=0.0), AIM, C)
    assert off.verdict == REGRESSION and off.posterior >= a.posterior
    # a single hang on b4 leaves "b4's hang is old, the rate changed at b5" alive: undecided
    thin = posterior(8, {0: (0, 10 * M), 3: (0, 20 * M), 4: (1, M), 7: (4, 4 * M)})
    assert verdict("s", thin, AIM, C).verdict != REGRESSION or thin.rate_change_probability() > 0


def test_hangs_below_a_much_higher_rate_are_a_rate_change_with_both_mttfs():
    # before b4: 3 hangs in 60 MTTFs; from b4 on: 20 hangs in 20 MTTFs (x20)
    ev = {0: (1, 20 * M), 1: (1, 20 * M), 3: (1, 20 * M), 4: (6, 6 * M), 5: (4, 4 * M), 7: (10, 10 * M)}
    a = verdict("s", posterior(8, ev), AIM, C)
    assert a.verdict == RATE_CHANGE_VERDICT and a.first == 4 and a.hangs_before == 3
    assert a.mttf_after_s == pytest.approx(M)
    assert 3 * M < a.mttf_before_low_s < 20 * M          # 60 MTTFs over 3 hangs, its lower bound
    # the clean model alone cannot put the change above a hang: it says the good build hangs too
    clean = verdict("s", posterior(8, ev, rate_change_prior=0.0), AIM, C)
    assert clean.first == 0


def test_one_rate_everywhere_is_old_and_too_little_is_undecided():
    even = {i: (4, 4 * M) for i in range(8)}
    assert verdict("s", posterior(8, even), AIM, C).verdict == OLD
    assert verdict("s", posterior(8, {7: (2, 2 * M)}), AIM, C).verdict == UNDECIDED


def test_a_hang_of_one_signature_is_a_censored_pass_for_the_others_and_late_signatures_replay():
    book = SignatureBook(4, 0.05)
    book.observe(3, "hang", "a", 100.0, 0.2)
    book.observe(1, "passed", None, 500.0, 0.3)
    book.observe(2, "hang", "b", 40.0, 0.1)          # b is new: its posterior replays the two before
    book.observe(0, "hang", "crash", 10.0, 0.1, crashed=True)
    a, b = book.posteriors["a"], book.posteriors["b"]
    assert [x.hangs for x in a.builds] == [0, 0, 0, 1] and [x.hangs for x in b.builds] == [0, 0, 1, 0]
    assert a.exposure().tolist() == b.exposure().tolist() == [10.0, 500.0, 40.0, 100.0]
    assert a.builds[2].other_hangs == 1 and b.builds[3].other_hangs == 1
    assert book.candidates() == ["a"]                 # b never hung on the bad build; crashes never lead


def names(n):
    return [f"b{i}" for i in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unnamed_with_another_hang_on_every_build_the_regression_heads(seed):
    o = VirtualBuildOracle(16, 9, M, seed=seed, background_mttf_s=M)
    r = bisect_builds(names(16), o, BuildSettings())
    assert r.status == FOUND and r.first_bad == 9 and r.signature == "shm_broadcast_timeout"
    by = {a.signature: a for a in r.signatures}
    assert by["shm_broadcast_timeout"].target and by["shm_broadcast_timeout"].verdict == REGRESSION
    assert not by["nccl_watchdog_timeout"].target
    doc = to_json(r)
    assert [s["signature"] for s in doc["signatures"]] == ["shm_broadcast_timeout", "nccl_watchdog_timeout"]
    assert doc["signatures"][0]["verdict"] == "regression" and doc["signatures"][0]["first_bad"] == "b9"
    text = render_text(r)
    assert "shm_broadcast_timeout (target): regression, first bad build b9" in text
    assert "nccl_watchdog_timeout:" in text


@pytest.mark.parametrize("seed", [1, 5])
def test_a_rate_change_is_named_with_the_mttf_before_and_after(seed):
    o = VirtualBuildOracle(16, 9, M, seed=seed, old_mttf_s=16 * M)
    r = bisect_builds(names(16), o, BuildSettings(signature="shm_broadcast_timeout"))
    assert r.status == RATE_CHANGE and r.first_bad == 9
    assert r.mttf_before_low_s is not None and r.mttf_before_low_s > r.mttf_s
    assert render_text(r).startswith("rate change at b9: MTTF before at least ")
    assert to_json(r)["signatures"][0]["verdict"] == "rate_change"


def test_one_early_hang_on_the_good_build_does_not_make_a_rate_change_old():
    # x4 below the change point: the good build's rare hang comes early in some runs; "old" at
    # Tuning.old_posterior needs Tuning.old_hangs of them on the good build, not the first
    v = Tuning()
    assert (v.old_hangs, v.old_posterior) == (3, 0.9)
    with pytest.raises(ValueError, match="old_hangs"):
        Tuning(old_hangs=0)
    # two hangs on the good build, the one rate everywhere at 0.9-0.995 of the posterior
    post = posterior(4, {0: (2, 8 * M), 1: (2, 8 * M), 2: (2, 8 * M), 3: (2, 8 * M)}, rate_change_prior=0.05)
    mass = post.probabilities()[0]
    assert 0.9 <= mass < AIM
    assert verdict("s", post, AIM, C).verdict == UNDECIDED
    assert verdict("s", post, AIM, C, named=False) == verdict("s", post, AIM, C)
    three = posterior(4, {0: (3, 8 * M), 1: (2, 8 * M), 2: (2, 8 * M), 3: (2, 8 * M)}, rate_change_prior=0.05)
    if 0.9 <= three.probabilities()[0] < AIM:
        assert verdict("s", three, AIM, C).verdict == OLD      # the relaxed answer, unnamed
        assert verdict("s", three, AIM, C, named=True).verdict == UNDECIDED


def test_a_named_target_is_answered_old_only_at_the_confidence_asked():
    # the relaxed "old" (Tuning.old_posterior) is for signatures nobody named; a named target's
    # "not a regression" is the headline, stated at the confidence asked
    post = posterior(4, {0: (3, 8 * M), 1: (3, 8 * M), 2: (3, 8 * M), 3: (3, 8 * M)}, rate_change_prior=0.05)
    mass = post.probabilities()[0]
    assert 0.9 <= mass < AIM
    assert verdict("s", post, AIM, C).verdict == OLD
    assert verdict("s", post, AIM, C, named=True).verdict == UNDECIDED
    o = VirtualBuildOracle(16, 13, M, seed=4, old_mttf_s=4 * M)
    r = bisect_builds(names(16), o, BuildSettings(signature="shm_broadcast_timeout", tuning=Tuning(old_hangs=1)))
    assert (r.status, r.first_bad) == (RATE_CHANGE, 13)


def test_the_rate_change_model_off_is_the_clean_model():
    o = VirtualBuildOracle(16, 5, M, seed=3)
    r = bisect_builds(names(16), o, BuildSettings(tuning=Tuning(rate_change_prior=0.0)))
    assert r.status == FOUND and r.first_bad == 5
    with pytest.raises(ValueError, match="min_ratio"):
        Tuning(min_ratio=1.0)


TWO_HANGS = """
seed: 11
hangs:
  - id: regression
    style: shm_broadcast
    when: {mtp: 1, build: [b3, b4, b5, b6, b7]}
    min_running: 1
    mttf_s: 2280
  - id: unrelated
    style: silent_stall
    when: {mtp: 1}
    min_running: 1
    mttf_s: 2280
"""


def test_the_cli_answers_each_signature_with_the_target_first(tmp_path):
    # the cell hangs with silent_stall on every build (the signature the hang model gives the cell)
    # and with shm_broadcast_timeout from b3 on
    (tmp_path / "hangs.yaml").write_text(TWO_HANGS)
    (tmp_path / "builds.txt").write_text("".join(f"b{i}: vllm==0.{10 + i}.0\n" for i in range(8)))
    args = ("bisect", str(DEMO), "--cell", CELL, "--builds", str(tmp_path / "builds.txt"), "--hang-model",
            str(tmp_path / "hangs.yaml"), "--virtual", "--quiet", "--seed", "1")
    old = soakmatrix(*args)
    assert old.returncode == 0, old.stderr
    assert old.stdout.startswith("not a regression: the good build b0 hangs with silent_stall too")
    assert "signatures (each on its own, from the same probes):" in old.stdout
    assert "silent_stall (target): old, present at the last-good end b0" in old.stdout
    assert "  shm_broadcast_timeout: " in old.stdout
    named = soakmatrix(*args, "--signature", "shm_broadcast_timeout", "--json")
    assert named.returncode == 1, named.stderr
    doc = json.loads(named.stdout)
    assert doc["status"] == "found" and doc["first_bad"] == "b3" and doc["signature"] == "shm_broadcast_timeout"
    assert [s["signature"] for s in doc["signatures"]][0] == "shm_broadcast_timeout"
    sigs = {s["signature"]: s for s in doc["signatures"]}
    assert sigs["shm_broadcast_timeout"]["verdict"] == "regression" and sigs["shm_broadcast_timeout"]["target"]
    assert set(sigs["silent_stall"]) >= {"verdict", "first_bad", "range", "posterior", "hangs", "mttf_after_s"}
    assert not sigs["silent_stall"]["target"]


def test_the_dashboard_view_lists_each_signature_s_answer():
    from soakmatrix.reports.tables import bisection_view

    o = VirtualBuildOracle(16, 9, M, seed=3, old_mttf_s=16 * M, background_mttf_s=4 * M)
    r = bisect_builds(names(16), o, BuildSettings(signature="shm_broadcast_timeout"))
    assert r.status == RATE_CHANGE
    view = bisection_view({**to_json(r), "kind": "builds", "cell": {"id": "c1", "name": "cell"}})
    assert view["minimal"].startswith("rate change at b9")
    rows = dict(view["verdicts"])
    assert rows["signature shm_broadcast_timeout (target)"].startswith("rate change at b9: MTTF before >= ")
    assert "signature nccl_watchdog_timeout" in rows


def test_the_stall_count_restarts_when_the_likeliest_answer_changes():
    from soakmatrix.matrix.build_bisect.algorithm import _Run

    run = _Run(names(4), None, BuildSettings(signature="s", tuning=Tuning(stall_probes=3)))  # type: ignore[arg-type]
    post = run.book.posteriors["s"]

    def evidence(ev):
        for i, b in enumerate(post.builds):
            b.hangs, b.exposure_s = ev.get(i, (0, 0.0))

    evidence({i: (3, 8 * M) for i in range(4)})                     # one rate: the good build likeliest
    assert post.group_probabilities()[0][int(post.probabilities().argmax())] == (0, 0)
    assert not run.stalled()
    run.probes = 3
    assert run.stalled()                                            # no gain for 3 probes
    evidence({0: (1, 10 * M), 1: (0, 3 * M), 2: (0, 3 * M), 3: (3, 2 * M)})   # b3's change, less sure
    top = float(post.probabilities().max())
    assert int(post.probabilities().argmax()) == 3 and top < 0.95
    assert not run.stalled()                                        # a new answer: its own count
    run.probes = 5
    assert not run.stalled()
    run.probes = 6
    assert run.stalled()
