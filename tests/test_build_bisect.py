"""Build bisection (matrix/build_bisect): the first bad build, ranges over untestable builds, "not a
regression", other signatures, the stated error rate in virtual time, the builds file and GOOD..BAD,
the report and the adapter over the flag oracle."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from soakmatrix.matrix.build_bisect import (
    FOUND,
    INCONCLUSIVE,
    NOT_A_REGRESSION,
    NOT_REPRODUCED,
    RANGE,
    BuildProbeResult,
    Tuning,
    BuildSettings,
    BuildSpec,
    BuildSpecError,
    FlagOracleAdapter,
    VirtualBuildOracle,
    bisect_builds,
    builds_from_range,
    parse_builds_text,
    parse_range,
    render_text,
    resolve_builds,
    run_build_bisection,
    to_json,
)
from soakmatrix.matrix.build_bisect.result import BAD_UNTESTABLE
from soakmatrix.matrix.build_bisect.oracle import BuildProbe, convert
from soakmatrix.matrix.build_bisect.posterior import ChangePointPosterior
from soakmatrix.matrix.contracts.stats import mttf_lower_bound

SIG = "shm_broadcast_timeout"


class ScriptedOracle:
    """Deterministic: builds from `change_point` hang at `hang_s` of load, the others pass; builds in
    `untestable` fail to install; `other_at` makes every build hang first with another signature at
    that load on its first probe."""

    def __init__(self, change_point, hang_s=1800.0, untestable=(), other_at=None, startup_s=600.0):
        self.cp, self.hang_s, self.untestable, self.other_at, self.startup_s = change_point, hang_s, set(untestable), other_at, startup_s
        self.seen: list[int] = []

    def run(self, probes):
        out = []
        for p in probes:
            first = p.index not in self.seen
            self.seen.append(p.index)
            if p.index in self.untestable:
                out.append(BuildProbeResult(p, "untestable", None, 0.0, self.startup_s / 3600))
            elif self.other_at is not None and first and self.other_at < p.soak_s:
                out.append(BuildProbeResult(p, "hang", "nccl_watchdog_timeout", self.other_at,
                                            (self.startup_s + self.other_at) / 3600))
            elif p.index >= self.cp and self.hang_s < p.soak_s:
                out.append(BuildProbeResult(p, "hang", SIG, self.hang_s, (self.startup_s + self.hang_s) / 3600))
            else:
                out.append(BuildProbeResult(p, "passed", None, p.soak_s, (self.startup_s + p.soak_s) / 3600))
        return out


def names(n):
    return [f"b{i}" for i in range(n)]


@pytest.mark.parametrize("n,cp", [(2, 1), (8, 1), (8, 5), (8, 7), (33, 17), (100, 3)])
def test_a_known_change_point_is_found(n, cp):
    r = bisect_builds(names(n), ScriptedOracle(cp), BuildSettings())
    assert r.status == FOUND
    assert r.first_bad == cp and r.first_bad_build == f"b{cp}"
    assert r.last_good == cp - 1
    assert r.posterior >= 0.99
    assert r.signature == SIG                      # the calibration's first hang names the target
    assert r.gpu_hours == pytest.approx(sum(b.gpu_hours for b in r.evidence))
    assert r.gpu_hours_by_role["calibration"] > 0
    # the last good build was refuted by exposure (longer than the bad builds' hangs): its MTTF
    # bound is stated
    assert r.evidence[cp - 1].exposure_s > 1800.0
    assert r.good_mttf_bound_s == pytest.approx(mttf_lower_bound(r.evidence[cp - 1].exposure_s, 0.99))


def test_untestable_builds_give_a_range():
    r = bisect_builds(names(16), ScriptedOracle(9, untestable={8, 9}), BuildSettings())
    assert r.status == RANGE
    assert r.range == (8, 10) and r.first_bad is None
    assert r.untestable == [8, 9]
    assert "b8..b10" in render_text(r)
    # an untestable build away from the change point changes nothing
    r = bisect_builds(names(16), ScriptedOracle(9, untestable={3}), BuildSettings())
    assert r.status == FOUND and r.first_bad == 9


def test_the_good_build_hanging_too_is_not_a_regression():
    r = bisect_builds(names(32), ScriptedOracle(0), BuildSettings())
    assert r.status == NOT_A_REGRESSION
    assert r.range == (0, 0) and r.first_bad is None
    assert r.evidence[0].hangs >= 1
    assert "not a regression" in render_text(r)


def test_other_signatures_end_probes_but_do_not_count():
    r = bisect_builds(names(16), ScriptedOracle(6, other_at=300.0), BuildSettings(signature=SIG))
    assert r.status == FOUND and r.first_bad == 6
    assert sum(b.other_hangs for b in r.evidence) >= 3
    assert all(b.hangs == 0 for b in r.evidence[:6])
    assert [a.signature for a in r.signatures] == [SIG, "nccl_watchdog_timeout"]
    assert r.signatures[0].target and not r.signatures[1].target


def test_no_hang_on_the_bad_build_is_not_reproduced():
    r = bisect_builds(names(8), ScriptedOracle(8), BuildSettings(calibration_max_s=6 * 3600.0))
    assert r.status == NOT_REPRODUCED
    assert r.evidence[-1].exposure_s == pytest.approx(6 * 3600.0)
    r = bisect_builds(names(8), ScriptedOracle(3, untestable={7}), BuildSettings())
    assert r.status == BAD_UNTESTABLE


def test_the_budget_ends_the_search_inconclusive():
    r = bisect_builds(names(64), ScriptedOracle(40), BuildSettings(budget_gpu_hours=3.0))
    assert r.status == INCONCLUSIVE
    assert r.gpu_hours >= 3.0 and r.posterior < 0.99
    r = bisect_builds(names(64), ScriptedOracle(40), BuildSettings(max_probes=4))
    assert r.status == INCONCLUSIVE and r.probes == 4


def test_known_evidence_from_the_history_pools_in():
    plain = bisect_builds(names(8), ScriptedOracle(5), BuildSettings())
    known = bisect_builds(names(8), ScriptedOracle(5), BuildSettings(known={7: (3, 3 * 1800.0)}))
    assert known.status == FOUND and known.first_bad == 5
    assert known.gpu_hours < plain.gpu_hours


def test_the_stated_error_rate_holds_in_virtual_time():
    n, mttf, seeds = 8, 600.0, 200
    exact, spent = 0, []
    for seed in range(seeds):
        cp = int(np.random.default_rng(seed).integers(1, n))
        oracle = VirtualBuildOracle(n, cp, mttf, seed=10_000 + seed, background_mttf_s=4 * mttf)
        r = bisect_builds(names(n), oracle, BuildSettings(signature=SIG))
        exact += r.status == FOUND and r.first_bad == cp
        spent.append(r.gpu_hours)
    assert exact >= 0.975 * seeds          # stated 0.99: a few misses in 200 are within it
    assert np.mean(spent) < 12.0


def test_parallel_rounds_keep_the_stated_error_rate_in_fewer_rounds():
    # a round soaks several probes at once; only real answers enter the posterior, so the answer
    # stays right at the stated rate while the wall time (rounds) falls
    n, mttf, seeds = 32, 2280.0, 60
    by_width = {}
    for width in (1, 4):
        exact, rounds, probes = 0, [], []
        for seed in range(seeds):
            cp = int(np.random.default_rng(seed).integers(1, n))
            oracle = VirtualBuildOracle(n, cp, mttf, seed=20_000 + seed)
            r = bisect_builds(names(n), oracle, BuildSettings(signature=SIG, parallel=width))
            exact += r.status == FOUND and r.first_bad == cp
            rounds.append(r.rounds)
            probes.append(r.probes)
        by_width[width] = (exact, np.mean(rounds), np.mean(probes))
    assert by_width[1][1] == by_width[1][2]                   # one at a time: a round per probe
    assert by_width[4][0] >= seeds - 2 and by_width[1][0] >= seeds - 2
    assert by_width[4][1] < 0.6 * by_width[1][1]              # far fewer rounds side by side
    assert by_width[4][2] > by_width[4][1]


def test_one_probe_per_round_is_the_sequential_bisection():
    n, cp = 16, 9
    one = bisect_builds(names(n), VirtualBuildOracle(n, cp, 2280.0, seed=5), BuildSettings(signature=SIG))
    same = bisect_builds(names(n), VirtualBuildOracle(n, cp, 2280.0, seed=5), BuildSettings(signature=SIG, parallel=1))
    assert (one.probes, one.gpu_hours, one.first_bad) == (same.probes, same.gpu_hours, same.first_bad)
    with pytest.raises(ValueError, match="parallel"):
        BuildSettings(parallel=0)


@pytest.mark.parametrize("n,cp", [(8, 5), (33, 17)])
def test_the_end_game_pools_enough_hangs_before_it_refutes(n, cp):
    # the refuting soak's length rests on the rate read from the hangs pooled on the answer's side:
    # it pools as many as the log-odds the stop asks for first (without that floor these two
    # stopped at 5)
    from soakmatrix.matrix.build_bisect.planner import min_pooled_hangs
    settings = BuildSettings(signature=SIG)
    assert min_pooled_hangs(0.995) == 6 and min_pooled_hangs(0.975) == 4
    r = bisect_builds(names(n), ScriptedOracle(cp), settings)
    assert r.status == FOUND and r.first_bad == cp
    aim = 1 - settings.error_share * (1 - settings.confidence)
    assert sum(b.hangs for b in r.evidence[cp:]) >= min_pooled_hangs(aim) == 6


def test_the_posterior_groups_untestable_builds_and_rules_out_above_a_hang():
    post = ChangePointPosterior(6)
    post.observe(5, "hang", True, 100.0, 0.2)
    post.observe(2, "untestable", False, 0.0, 0.1)
    post.observe(3, "hang", True, 50.0, 0.1)
    assert post.groups() == [(0, 0), (1, 1), (2, 3), (4, 4), (5, 5)]
    p = post.probabilities()
    assert p[4:].sum() < 0.02                       # build 3 hung: the first bad is at or below it, unless
    clean = ChangePointPosterior(6, tuning=Tuning(rate_change_prior=0.0))   # its hang is old (a rate change)
    clean.builds = post.builds
    assert clean.probabilities()[4:].sum() == 0.0
    assert p[2] == pytest.approx(p[3])              # the untestable build cannot be told from the next
    assert post.known_bad_pool() == (2.0, 150.0)


def _posterior(n: int, evidence: dict[int, tuple[int, float]]) -> ChangePointPosterior:
    post = ChangePointPosterior(n)
    for index, (hangs, load) in evidence.items():
        post.builds[index].hangs, post.builds[index].exposure_s = hangs, load
    return post


def test_a_rate_change_aims_at_its_two_builds():
    from soakmatrix.matrix.build_bisect.planner import aim_at
    groups = [(i, i) for i in range(5)]
    mass = np.array([0.05, 0.05, 0.1, 0.7, 0.1])
    assert aim_at(groups, mass, np.array([1.0, 0, 0, 4, 2]), 0.5) == 3      # a hang below the likeliest
    assert aim_at(groups, mass, np.array([0.0, 0, 0, 4, 2]), 0.5) is None   # none: a clean regression's search
    assert aim_at(groups, mass, np.array([1.0, 0, 0, 4, 2]), 0.8) is None   # not likely enough yet
    old = np.array([0.7, 0.05, 0.1, 0.1, 0.05])
    assert aim_at(groups, old, np.array([1.0, 0, 0, 4, 2]), 0.5) is None    # the good build: one rate, old
    # aimed, the planner soaks only the likeliest change point's build or the one below it
    from soakmatrix.matrix.build_bisect.planner import choose
    post = _posterior(8, {0: (1, 8 * 1800.0), 3: (1, 4 * 1800.0), 4: (2, 3600.0), 5: (3, 3600.0), 7: (3, 3600.0)})
    groups, mass = post.group_probabilities()
    for aimed in (2, 5, 6):
        c = choose(groups, mass, post.passes(groups), post.group_pools(groups)[0], 1800.0, 600.0, 0.995,
                   aimed=aimed)
        assert c is not None and c.index in (aimed - 1, aimed)


def test_the_newest_build_is_probed_when_its_rate_decides():
    # b0 and b1 hang at one slow rate, b2 (the newest) hung twice in half an MTTF: "old" (one rate)
    # against a rate change at b2 turns on b2's rate, which only a probe of b2 tells
    from soakmatrix.matrix.build_bisect.planner import choose
    m = 1800.0
    post = _posterior(3, {0: (4, 16 * m), 1: (4, 16 * m), 2: (2, 0.5 * m)})
    groups, mass = post.group_probabilities()
    c = choose(groups, mass, post.passes(groups), post.group_pools(groups)[0], m, 600.0, 0.995)
    assert c is not None and c.index == 2 and c.gain_bits > 0


def test_the_virtual_oracle():
    o = VirtualBuildOracle(10, 4, 600.0, seed=3, untestable_fraction=0.5)
    assert len(o.untestable) == 4 and 0 not in o.untestable and 9 not in o.untestable
    with pytest.raises(ValueError):
        VirtualBuildOracle(10, 10, 600.0)


# -- builds from a file or a commit range --------------------------------------------------------------

def test_a_builds_file():
    text = """# oldest first
vllm==0.6.2
nightly-1: vllm @ https://wheels.example/vllm-0.6.3.dev1-cp312-linux_x86_64.whl   # the first nightly
image:vllm/vllm-openai:v0.6.3

py39: python:/opt/envs/vllm-063/bin/python
vllm @ git+https://github.com/vllm-project/vllm@0123456789abcdef
"""
    builds = parse_builds_text(text)
    assert [b.name for b in builds] == ["vllm==0.6.2", "nightly-1", "image:vllm/vllm-openai:v0.6.3", "py39",
                                        "vllm @ git+https://github.com/vllm-project/vllm@0123456789abcdef"]
    assert [b.kind for b in builds] == ["pip", "pip", "image", "python", "pip"]
    assert builds[2].value == "vllm/vllm-openai:v0.6.3"
    assert builds[3].value == "/opt/envs/vllm-063/bin/python"
    with pytest.raises(BuildSpecError, match="at least two"):
        parse_builds_text("vllm==0.6.2\n")
    with pytest.raises(BuildSpecError, match="twice"):
        parse_builds_text("a: vllm==1\nb: vllm==2\na: vllm==3\n")


def test_a_commit_range_through_a_template():
    assert parse_range("abc123..def456") == ("abc123", "def456")
    assert parse_range("builds.txt") is None
    shas = ["1111111111111111aaaa", "2222222222222222bbbb", "def4560000000000cccc"]
    calls = []

    def rev_list(good, bad):
        calls.append((good, bad))
        return shas

    template = "vllm @ git+https://github.com/vllm-project/vllm@{sha}"
    builds = resolve_builds("abc123..def456", template, rev_list)
    assert calls == [("abc123", "def456")]
    assert [b.name for b in builds] == ["abc123", "111111111111", "222222222222", "def456000000"]
    assert builds[1].spec == f"vllm @ git+https://github.com/vllm-project/vllm@{shas[0]}"
    with pytest.raises(BuildSpecError, match="sha"):
        builds_from_range("abc123", "def456", "vllm @ git+https://x/vllm", rev_list)
    with pytest.raises(BuildSpecError, match="no commits"):
        builds_from_range("abc123", "def456", template, lambda g, b: [])
    with pytest.raises(BuildSpecError, match="do not end"):
        builds_from_range("abc123", "def456", template, lambda g, b: shas[:2])
    with pytest.raises(BuildSpecError, match="template"):
        resolve_builds("abc123..def456")


def test_a_builds_file_path_wins_over_a_range(tmp_path):
    path = tmp_path / "a..b"
    path.write_text("x: vllm==1\ny: vllm==2\n")
    assert [b.name for b in resolve_builds(str(path))] == ["x", "y"]
    with pytest.raises(BuildSpecError, match="cannot read"):
        resolve_builds(str(tmp_path / "missing.txt"))


# -- what the CLI calls ---------------------------------------------------------------------------------

def test_run_build_bisection_hands_specs_to_the_oracle_and_names_to_the_report():
    specs = [BuildSpec(f"n{i}", f"vllm==0.{i}") for i in range(8)]

    class SpecOracle(ScriptedOracle):
        def run(self, probes):
            assert all(p.build == f"vllm==0.{p.index}" for p in probes)
            return super().run(probes)

    r = run_build_bisection(specs, SpecOracle(4), confidence=0.95, signature=SIG)
    assert r.status == FOUND and r.first_bad_build == "n4" and r.confidence == 0.95
    doc = to_json(r)
    json.dumps(doc)
    assert doc["first_bad"] == "n4" and doc["last_good"] == "n3" and doc["status"] == "found"
    assert doc["builds"][4]["build"] == "n4" and doc["builds"][4]["hangs"] >= 1
    assert set(doc["gpu_hours_by_role"]) == {"calibration", "search"}
    text = render_text(r)
    assert text.startswith("first bad build: n4, last good n3")


def test_the_adapter_over_the_flag_oracle():
    @dataclass(frozen=True)
    class Probe:
        flags: dict
        soak_s: float
        label: str = ""

    @dataclass(frozen=True)
    class Result:
        probe: Probe
        outcome: str
        signature: str | None
        exposure_s: float
        gpu_hours: float
        message: str = ""

    class FlagOracle:
        def run(self, probes):
            out = []
            for p in probes:
                build = int(p.flags["build"][1:])
                assert p.flags["tp"] == 2
                if build == 2:
                    out.append(Result(p, "config_error", None, 0.0, 0.3))
                elif build >= 3:
                    out.append(Result(p, "crash" if build == 3 else "hang", SIG, 100.0, 0.4))
                else:
                    out.append(Result(p, "passed", None, p.soak_s, 1.0))
            return out

    r = bisect_builds(names(6), FlagOracleAdapter(FlagOracle(), {"tp": 2}, probe_factory=Probe), BuildSettings())
    assert r.status == RANGE and r.range == (2, 3)


def test_with_the_signature_unknown_a_crash_never_names_it():
    # a frequent unrelated crash on every build: the calibration's first event is mostly the crash,
    # yet the target is the first hang's signature, and the crashes only end probes
    class CrashingOracle(ScriptedOracle):
        def run(self, probes):
            out = []
            for p in probes:
                first = p.index not in self.seen
                r = super().run([p])[0]
                if first and r.outcome != "untestable" and 300.0 < r.exposure_s:
                    r = BuildProbeResult(p, "hang", "engine_crash", 300.0, (self.startup_s + 300.0) / 3600,
                                         crashed=True)
                out.append(r)
            return out

    r = bisect_builds(names(8), CrashingOracle(5), BuildSettings())
    assert r.signature == SIG and r.status == FOUND and r.first_bad == 5
    assert sum(b.other_hangs for b in r.evidence) >= 1
    # named, a crash's signature is a target like any other
    named = bisect_builds(names(8), CrashingOracle(5), BuildSettings(signature="engine_crash"))
    assert named.signature == "engine_crash"


def test_the_adapter_marks_a_crash():
    @dataclass(frozen=True)
    class Result:
        outcome: str
        signature: str | None
        exposure_s: float = 10.0
        gpu_hours: float = 0.1

    probe = BuildProbe(0, "b0", 100.0)
    assert convert(probe, Result("crash", None)).crashed and convert(probe, Result("crash", None)).outcome == "hang"
    assert not convert(probe, Result("hang", SIG)).crashed
