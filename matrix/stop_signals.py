"""SIGINT, SIGTERM and SIGHUP end a run the same clean way: Kubernetes, CI runners and systemd send
SIGTERM, a person at a terminal sends Ctrl-C, a terminal or SSH session that closes sends SIGHUP
(whose default would end the driver on the spot, its servers left to the reaper and the run's
summary unwritten), and a job started in the background may inherit SIGINT as ignored. Each becomes
a `Stopped` exception (a KeyboardInterrupt, so the scheduling loop's Ctrl-C path cancels the cells,
tears the servers down and keeps every finished result), and the run exits 130, 143 or 129 as
shells expect. A SIGHUP that was ignored when we started (`nohup soakmatrix run ...`) stays
ignored: that user asked for the run to outlive the terminal. `ray.init` installs handlers of its
own (its SIGTERM handler aborts with a stack dump), so ours are installed again once Ray is up.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

# what signal.signal() takes and returns
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

EXIT_FOR: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


class Stopped(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Context manager: while inside, SIGINT/SIGTERM/SIGHUP raise `Stopped` in the main thread."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, _Handler] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        self.received = self.received or signum
        if first:
            raise Stopped(signum)
        # a second signal while we tear down: the loop's own second-Ctrl-C path stops waiting politely
        raise KeyboardInterrupt

    def install(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals are delivered to the main thread only; nothing to do elsewhere
        global _active
        _active = self
        for signum in EXIT_FOR:
            if signum == signal.SIGHUP and self._previous.get(signum, signal.getsignal(signum)) == signal.SIG_IGN:
                continue  # nohup: the run is meant to outlive its terminal
            previous = signal.signal(signum, self._handler)
            self._previous.setdefault(signum, previous)
        return self

    def exit_code(self, default: int = 130) -> int:
        return EXIT_FOR.get(self.received, default) if self.received else default

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        global _active
        if _active is self:
            _active = None
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


_active: StopSignals | None = None


def reinstall_active() -> None:
    """Install the handlers of the StopSignals in force again (if any): for code that connects to Ray
    far from where the StopSignals was entered."""
    if _active is not None:
        _active.install()


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum else "Ctrl-C"
