"""A probe oracle that restarts the server when another signature ends a soak, so a probe always gets its
full soak of load (or its target hang).

A hang or crash whose signature is not the target's says nothing about the target, but it ends the
server it happened on. Reported as the probe's end, a failing cell that also crashes every 10 minutes
cuts every long soak (a necessity soak runs ~37 MTTFs) into dozens of probes, and bisection runs out of
its probe budget. Here such a probe goes on: the server is started again (a new probe of the inner
oracle for the load still missing) until the soak is complete or the target hang is seen. Exposure and
GPU-hours add up over the pieces, start-up of each restart included (the inner oracle accounts it), and
the other signatures are counted in the result's `extra["other_signatures"]` for the report.

Before the target is known (`target()` is None) only a hang ends a probe, as `ProbeResult.hung_with`
says: a crash is never the target a cell was reported for. Two bounds keep a config from restarting for
ever (the policy's, policy.py): `max_idle_starts` starts in a row that ended with another signature
before any load make the result a `config_error` (the config cannot be soaked: bisection treats it as
unrunnable), and after `max_restarts` restarts the probe ends with the last other signature, as it did before restarts
existed, with the exposure so far and `extra["gave_up"]`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .oracle import Probe, ProbeOracle, ProbeResult
from .policy import DEFAULT_POLICY, Policy


class RestartingOracle:
    """Wraps any ProbeOracle; `target` returns the target signature (None while unknown)."""

    def __init__(
        self, inner: ProbeOracle, target: Callable[[], str | None] | str | None = None, policy: Policy = DEFAULT_POLICY
    ):
        if policy.max_restarts < 0 or policy.max_idle_starts < 1:
            raise ValueError("max_restarts must be >= 0 and max_idle_starts >= 1")
        self.inner = inner
        self._target = target if callable(target) else (lambda: target)
        self.max_restarts = policy.max_restarts
        self.max_idle_starts = policy.max_idle_starts
        self.idle_load_s = policy.idle_load_s
        self.restarts = 0  # over every probe: how many extra server starts other signatures cost

    def run(self, probes: Sequence[Probe]) -> list[ProbeResult]:
        """Every probe to its end; the continuations of a batch run together (in parallel where the
        inner oracle can)."""
        pieces: list[list[ProbeResult]] = [[] for _ in probes]
        done: list[ProbeResult | None] = [None] * len(probes)
        todo = list(range(len(probes)))
        asked = list(probes)
        while todo:
            results = self.inner.run([asked[i] for i in todo])
            again = []
            for i, result in zip(todo, results, strict=True):
                pieces[i].append(result)
                end = self._end(probes[i], pieces[i])
                if end is not None:
                    done[i] = end
                    continue
                load = sum(p.exposure_s for p in pieces[i])
                asked[i] = Probe(probes[i].flags, probes[i].soak_s - load, probes[i].label)
                again.append(i)
            self.restarts += len(again)
            todo = again
        return [r for r in done if r is not None]

    def _end(self, probe: Probe, pieces: list[ProbeResult]) -> ProbeResult | None:
        """The probe's result when its last piece ends it, None when the server restarts."""
        last = pieces[-1]
        if not last.hung or last.hung_with(self._target()):
            return combine(probe, pieces)
        if probe.soak_s - sum(p.exposure_s for p in pieces) <= 0:
            # the other signature came at the very end of the soak: the soak is complete
            return combine(probe, pieces, outcome="passed")
        idle = 0
        for p in reversed(pieces):
            if not (p.hung and p.exposure_s < self.idle_load_s):
                break
            idle += 1
        if idle >= self.max_idle_starts:
            return combine(
                probe,
                pieces,
                outcome="config_error",
                marks={"idle_starts": idle},
                message=f"ended with {_name(last)} on {idle} starts in a row before any load: "
                f"this config cannot be soaked",
            )
        if len(pieces) > self.max_restarts:
            return combine(
                probe,
                pieces,
                marks={"gave_up": True},
                message=f"{last.message} (gave up after {len(pieces) - 1} restarts: other "
                f"signatures kept ending the soak)",
            )
        return None


def combine(
    probe: Probe,
    pieces: list[ProbeResult],
    *,
    outcome: str | None = None,
    message: str | None = None,
    marks: dict[str, Any] | None = None,
) -> ProbeResult:
    """One result for the pieces of a probe: the last piece's outcome (or `outcome`), every piece's
    load and GPU-hours, and the other signatures that restarted it; `marks` go into `extra`
    (`gave_up`, `idle_starts`)."""
    last = pieces[-1]
    if len(pieces) == 1 and outcome is None:
        return last
    others: dict[str, int] = {}
    for p in pieces[:-1]:
        others[_name(p)] = others.get(_name(p), 0) + 1
    if outcome is not None and last.hung:
        # the last piece's other signature did not end the probe's story (a complete soak, or a
        # config that cannot run): count it with the others
        others[_name(last)] = others.get(_name(last), 0) + 1
    final = outcome or last.outcome
    extra: dict[str, Any] = dict(last.extra)
    extra.update(
        {
            "restarts": len(pieces) - 1,
            "other_signatures": dict(sorted(others.items())),
            "pieces": [
                {
                    "outcome": p.outcome,
                    "signature": p.signature,
                    "exposure_s": p.exposure_s,
                    "message": p.message,
                    **dict(p.extra),
                }
                for p in pieces
            ],
        }
    )
    extra.update(marks or {})
    restarts = f" after {len(pieces) - 1} restart(s) ({', '.join(f'{k} x{n}' for k, n in sorted(others.items()))})"
    return ProbeResult(
        probe,
        final,
        last.signature if final in ("hang", "crash") else None,
        sum(p.exposure_s for p in pieces) if final != "config_error" else 0.0,
        sum(p.gpu_hours for p in pieces),
        (message or last.message) + (restarts if others and not marks else ""),
        extra,
    )


def other_signatures(results: Sequence[ProbeResult], target: str | None) -> dict[str, int]:
    """Hangs and crashes that were not the target, by signature, over probes: the ones that restarted
    a probe's server and the ones that ended a probe."""
    out: dict[str, int] = {}
    for r in results:
        for sig, n in r.extra.get("other_signatures", {}).items():
            out[sig] = out.get(sig, 0) + n
        if r.hung and not r.hung_with(target):
            out[_name(r)] = out.get(_name(r), 0) + 1
    return dict(sorted(out.items()))


def _name(r: ProbeResult) -> str:
    return r.signature or r.outcome


def restart_notes(restarting: RestartingOracle, configs: Sequence[Any], log: Sequence[ProbeResult]) -> list[str]:
    """Put the other signatures that restarted a probe's server into its config's `other_hangs`
    (the table's `+N*`), and say what the restarts cost and where a probe gave up."""
    by_flags = {repr(sorted(cs.flags.items())): cs for cs in configs}
    gave_up, idle = 0, 0
    for r in log:
        # the pieces that restarted the server (the search itself counts a last piece that ended the probe)
        restarted = sum(r.extra.get("other_signatures", {}).values())
        cs = by_flags.get(repr(sorted(r.probe.flags.items())))
        if cs is not None:
            cs.other_hangs += restarted
        gave_up += bool(r.extra.get("gave_up"))
        idle += "idle_starts" in r.extra
    notes = []
    if restarting.restarts:
        notes.append(
            f"hangs or crashes of other signatures restarted the server {restarting.restarts} time(s) "
            "within probes (their start-ups are in the GPU-hours; the probes' load adds up over restarts)"
        )
    if gave_up:
        notes.append(
            f"{gave_up} probe(s) ended after {restarting.max_restarts} restarts: other signatures kept ending the soak"
        )
    if idle:
        notes.append(
            f"{idle} probe(s) ended with another signature on {restarting.max_idle_starts} starts in a row "
            "before any load: that config was taken as one that cannot run"
        )
    return notes
