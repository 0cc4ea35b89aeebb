"""Is a detector's hang verdict a hang, or a stall that passed? Decided after the evidence is taken.

A hung engine never produces another token. A starved host (a busy CI machine, memory pressure, a
noisy neighbour) can freeze a healthy engine for longer than the stall threshold, and the detectors
cannot tell the two apart while the silence lasts. So a hang verdict is confirmed only when no token
reached the client between the verdict and the end of a confirmation window. The window starts at
the verdict and includes the evidence capture, which the soak job takes first, before any waiting,
so a true hang's stacks are as early as before. A verdict of kind `crash` (the process exited, the
server answers 500s) needs no confirmation: it cannot undo itself.

`progressed_since` is the decision, pure; `confirm` waits out the window with the clock and the
load driver's view passed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .detect.protocol import HangVerdict, StreamState


@dataclass(frozen=True)
class ConfirmationWindow:
    after_verdict_s: float = 3.0  # no token this long after the verdict
    after_evidence_s: float = 1.0  # ...and this long after the stack dumps, which pause the engine


def needs_confirmation(verdict: HangVerdict) -> bool:
    return verdict.kind == "hang"


def progressed_since(verdict: HangVerdict, stream: StreamState | None) -> bool:
    """A token reached the client after the verdict fired."""
    return stream is not None and stream.last_token_at is not None and stream.last_token_at > verdict.at


def confirm(
    verdict: HangVerdict,
    snapshot: Callable[[], StreamState | None],
    evidence_done_at: float,
    window: ConfirmationWindow = ConfirmationWindow(),
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 0.1,
) -> bool:
    """True when the hang stands (no token until the window closed); False as soon as a token came.
    `evidence_done_at` is when the stack dumps ended, on `clock`."""
    closes = max(verdict.at + window.after_verdict_s, evidence_done_at + window.after_evidence_s)
    while True:
        if progressed_since(verdict, snapshot()):
            return False
        left = closes - clock()
        if left <= 0:
            return True
        sleep(min(poll_s, left))
