"""Terminal progress of a matrix run: cells done, running, hangs so far, GPU-hours spent.

On a TTY one status line is redrawn in place and each finding is printed above it; elsewhere (CI
logs) every event is one plain, greppable line. The counting (`Tally`) and the wording
(`status_line`, `event_line`) are pure; `Progress` only writes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from soakmatrix.matrix.contracts.durations import format_duration
from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult

from .plan import PlannedCell


@dataclass
class Tally:
    total: int
    done: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    running: dict[str, tuple[int, float]] = field(default_factory=dict)  # cell id -> (GPUs, since)
    gpu_hours_done: float = 0.0
    retries: int = 0

    def started(self, pc: PlannedCell, at: float) -> None:
        self.running[pc.id] = (pc.gpu_count, at)

    def finished(self, result: CellResult) -> None:
        self.running.pop(result.cell_id, None)
        self.done += 1
        self.by_outcome[result.outcome.value] = self.by_outcome.get(result.outcome.value, 0) + 1
        self.gpu_hours_done += result.gpu_hours

    def retrying(self, result: CellResult) -> None:
        self.running.pop(result.cell_id, None)
        self.retries += 1
        self.gpu_hours_done += result.gpu_hours

    def gpu_hours(self, now: float) -> float:
        """Finished cells' GPU-hours plus what running cells have used so far."""
        return self.gpu_hours_done + sum(g * max(0.0, now - since) for g, since in self.running.values()) / 3600

    def count(self, outcome: Outcome) -> int:
        return self.by_outcome.get(outcome.value, 0)


def status_line(t: Tally, now: float, elapsed_s: float) -> str:
    parts = [
        f"{t.done}/{t.total} done",
        f"{len(t.running)} running",
        f"{t.count(Outcome.HANG)} hang{'s' if t.count(Outcome.HANG) != 1 else ''}",
    ]
    for outcome in (Outcome.CRASH, Outcome.CONFIG_ERROR, Outcome.INFRA_ERROR):
        if t.count(outcome):
            parts.append(f"{t.count(outcome)} {outcome.value}")
    if t.retries:
        parts.append(f"{t.retries} retried")
    parts.append(f"{t.gpu_hours(now):.2f} GPU-h")
    parts.append(format_duration(elapsed_s))
    return " | ".join(parts)


def event_line(kind: str, name: str, detail: str = "") -> str:
    return f"{kind:<8} {name}" + (f"  ({detail})" if detail else "")


def result_detail(result: CellResult) -> str:
    bits = [result.outcome.value]
    if result.signature:
        bits.append(result.signature)
    if result.time_to_hang_s is not None:
        bits.append(f"after {format_duration(result.time_to_hang_s)} under load")
    if result.outcome in (Outcome.INFRA_ERROR, Outcome.CRASH, Outcome.CONFIG_ERROR) and result.message:
        bits.append(result.message.splitlines()[0][:160])
    if result.attempt > 1:
        bits.append(f"attempt {result.attempt}")
    return ", ".join(bits)


class Progress:
    """Implements schedule.Events for a terminal or a log."""

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.time,
        min_redraw_s: float = 0.5,
        log_every_s: float = 60.0,
    ):
        self.stream = stream or sys.stderr
        self._tty = tty
        self.clock = clock
        self.tally = Tally(total)
        self.began = clock()
        self._last_draw = 0.0
        self._min_redraw = min_redraw_s
        self._drawn = False
        self._log_every = log_every_s
        self._logged_at = self.began

    @property
    def tty(self) -> bool:
        # asked each time: a terminal that hung up turns a LastingStream into a log file
        # (matrix/lasting_stream.py), where a status line redrawn in place is noise
        return self.stream.isatty() if self._tty is None else self._tty

    def note(self, text: str) -> None:
        """A message that stays (a finding, a warning): above the status line on a TTY."""
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        self._drawn = False
        self._draw(force=True)

    def cell_started(self, pc: PlannedCell, attempt: int, node: str) -> None:
        self.tally.started(pc, self.clock())
        if not self.tty:
            detail = f"node {node[:12]}" + (f", attempt {attempt}" if attempt > 1 else "")
            self.stream.write(event_line("start", pc.name, detail) + "\n")
            self.stream.flush()
        self._draw()

    def cell_retrying(self, pc: PlannedCell, result: CellResult) -> None:
        self.tally.retrying(result)
        self.note(event_line("retry", pc.name, result_detail(result)))

    def cell_finished(self, pc: PlannedCell, result: CellResult) -> None:
        self.tally.finished(result)
        if self.tty and result.outcome is Outcome.PASSED:
            self._draw(force=True)
        else:
            self.note(event_line(result.outcome.value, pc.name, result_detail(result)))

    def tick(self) -> None:
        """On a TTY redraw; in a log, a status line every `log_every_s` so a quiet night shows life."""
        if self.tty:
            self._draw()
            return
        now = self.clock()
        if now - self._logged_at >= self._log_every:
            self._logged_at = now
            self.stream.write("status   " + status_line(self.tally, now, now - self.began) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self._draw(force=True)
            self.stream.write("\n")
        else:
            self.stream.write(status_line(self.tally, self.clock(), self.clock() - self.began) + "\n")
        self.stream.flush()

    def _draw(self, force: bool = False) -> None:
        if not self.tty:
            return
        now = self.clock()
        if not force and now - self._last_draw < self._min_redraw:
            return
        self._last_draw = now
        self.stream.write("\r\x1b[2K" + status_line(self.tally, now, now - self.began))
        self.stream.flush()
        self._drawn = True
