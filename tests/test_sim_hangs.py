"""Hang timing: which hangs arm, exponential time to hang, min_running, modifiers (statistically)."""

from __future__ import annotations

import random
import statistics

import pytest
from scipy import stats

from soakmatrix.jobs.sim.hangs import HangClock, arm, draw_time_to_hang
from soakmatrix.matrix.contracts.hangmodel import load_hang_model

MODEL = """
seed: 7
hangs:
  - id: mtp-cudagraph
    style: shm_broadcast
    when: {mtp: [1, 2], cudagraph_mode: FULL_AND_PIECEWISE}
    gpu: [H20, H200]
    min_running: 2
    mttf_s: 2280
    modifiers:
      - when: {flashinfer_autotune: false}
        mttf_factor: 8
  - id: async-stall
    style: silent_stall
    when: {async_scheduling: true}
    min_running: 0
    mttf_s: 600
"""

N = 4000            # draws per estimate: the mean's relative standard error is 1/sqrt(N) = 1.6 %
TOLERANCE = 0.10    # a measured MTTF ratio must be within 10 % of the factor (> 4 standard errors)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "hangs.yaml"
    path.write_text(MODEL)
    return load_hang_model(path)


def test_arms_only_matching_hangs(model) -> None:
    ids = lambda flags, gpu: sorted(a.hang.id for a in arm(model, flags, gpu, seed=0))  # noqa: E731
    assert ids({"mtp": 1}, "H200") == ["async-stall", "mtp-cudagraph"]
    assert ids({"mtp": 1}, "RTX5090") == ["async-stall"]            # wrong GPU
    assert ids({"mtp": 0}, "H200") == ["async-stall"]               # when not met
    assert ids({"mtp": 2, "cudagraph_mode": "FULL_DECODE_ONLY", "async_scheduling": False}, "H20") == []


def test_draw_is_deterministic_per_seed_and_scaled(model) -> None:
    hang = model.hangs[0]
    a = draw_time_to_hang(hang, {"mtp": 1}, model.seed, 3)
    assert a == draw_time_to_hang(hang, {"mtp": 1}, model.seed, 3)
    assert a != draw_time_to_hang(hang, {"mtp": 1}, model.seed, 4)
    assert a != draw_time_to_hang(hang, {"mtp": 1}, model.seed + 1, 3)
    assert draw_time_to_hang(hang, {"mtp": 1}, model.seed, 3, time_scale=120) == pytest.approx(a / 120)
    # the cells of one matrix run share `--seed`: each engine (flags, GPU type) draws its own
    assert a != draw_time_to_hang(hang, {"mtp": 1, "tp": 2}, model.seed, 3)
    assert a != draw_time_to_hang(hang, {"mtp": 1}, model.seed, 3, gpu="H200")
    assert a == draw_time_to_hang(hang, {"mtp": 1, "tp": 1}, model.seed, 3)   # tp=1 is the default: same engine


def test_cells_sharing_a_seed_hang_independently(model) -> None:
    """Before, every cell of a run hung after the same exposure (one draw per seed and hang): a demo
    whose one draw fell late showed the planted hang in no cell at all. Drawn per engine, the times
    to hang of many engines with one seed are exponential with the MTTF, as across seeds."""
    hang = model.hangs[0]
    draws = [draw_time_to_hang(hang, {"mtp": 1, "max_num_seqs": 8 + i}, model.seed, 0) for i in range(N)]
    assert len(set(draws)) == N
    assert statistics.fmean(draws) == pytest.approx(2280, rel=TOLERANCE)
    assert stats.kstest(draws, "expon", args=(0, 2280)).pvalue > 0.001


def test_time_to_hang_is_exponential_with_the_mttf(model) -> None:
    hang = model.hangs[0]
    draws = [draw_time_to_hang(hang, {"mtp": 1}, model.seed, s) for s in range(N)]
    assert statistics.fmean(draws) == pytest.approx(2280, rel=TOLERANCE)
    assert stats.kstest(draws, "expon", args=(0, 2280)).pvalue > 0.001


@pytest.mark.parametrize("time_scale", [1.0, 120.0])
def test_modifier_moves_mttf_by_its_factor(model, time_scale: float) -> None:
    """Many short scaled runs, each until its hang fires, under a fluctuating load of 0-4 requests.

    The measured MTTF (mean qualifying exposure at the hang) with the modifier's `when` met must be
    the factor (8) times the one without, within TOLERANCE; the runs are simulated in virtual time
    through `HangClock`, the same clock the engine core advances.
    """
    def mean_time_to_hang(flags: dict) -> float:
        total = 0.0
        for seed in range(N):
            armed = [a for a in arm(model, flags, "H200", seed, time_scale) if a.hang.id == "mtp-cudagraph"]
            clock = HangClock(armed)
            load = random.Random(seed)
            qualifying = 0.0
            dt = armed[0].fires_after_s / 10      # about 25 steps per run at this load
            while clock.fired is None:
                running = load.choice([0, 1, 2, 3, 4])
                fired = clock.advance(dt, running)
                if running >= 2:
                    qualifying += dt if fired is None else dt - (fired.accrued_s - fired.fires_after_s)
            total += qualifying
        return total / N * time_scale       # back to engine seconds

    base = mean_time_to_hang({"mtp": 1})
    slowed = mean_time_to_hang({"mtp": 1, "flashinfer_autotune": False})
    assert base == pytest.approx(2280, rel=TOLERANCE)
    assert slowed / base == pytest.approx(8.0, rel=TOLERANCE)


def test_clock_counts_only_while_min_running(model) -> None:
    armed = [a for a in arm(model, {"mtp": 1, "async_scheduling": False}, "H200", 0) if a.hang.min_running == 2]
    clock = HangClock(armed)
    need = armed[0].fires_after_s
    assert clock.advance(need * 2, running=1) is None          # one request is not enough
    assert clock.exposure_s == pytest.approx(need * 2)
    assert clock.advance(need * 0.5, running=2) is None
    assert clock.advance(need * 0.6, running=3) is armed[0]
    assert clock.fired is armed[0]
    assert clock.advance(1.0, running=3) is None                # fires once


def test_min_running_zero_fires_when_idle(model) -> None:
    armed = [a for a in arm(model, {"mtp": 0}, None, 1) if a.hang.id == "async-stall"]
    clock = HangClock(armed)
    assert clock.next_deadline(0) == pytest.approx(armed[0].fires_after_s)
    assert clock.advance(armed[0].fires_after_s + 1e-6, running=0) is armed[0]
    assert clock.exposure_s == 0.0


def test_first_to_cross_wins(model) -> None:
    armed = arm(model, {"mtp": 1}, "H200", 2)
    clock = HangClock(armed)
    first = min(armed, key=lambda a: a.fires_after_s)
    assert clock.advance(max(a.fires_after_s for a in armed) + 1, running=4) is first
