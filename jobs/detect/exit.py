"""Exit detector: the server process is gone while the cell still runs (a crash, never a pass)."""

from __future__ import annotations

from .protocol import HangVerdict, Tick, register


class ExitDetector:
    name = "exit"

    def observe(self, obs: Tick) -> HangVerdict | None:
        if obs.exit_code is None:
            return None
        how = f"killed by signal {-obs.exit_code}" if obs.exit_code < 0 else f"exit code {obs.exit_code}"
        return HangVerdict(
            detector=self.name,
            kind="crash",
            at=obs.now,
            since=obs.now,
            message=f"server process exited ({how})",
            hint="crash",
            details={"exit_code": obs.exit_code},
        )


register("exit")(ExitDetector)
