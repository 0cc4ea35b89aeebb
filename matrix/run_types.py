"""What a run of a matrix takes and what it answers: `RunOptions` (where and how the cells run) and
`RunResult` (the exit code, the results and where they were written). `matrix/run.py` runs with
them; the CLI builds the options from its flags, the Python API (`soakmatrix.run`) from keywords."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soakmatrix.matrix.contracts.result import CellResult


@dataclass(frozen=True)
class RunOptions:
    backend: str = "sim"  # the engine: "sim" (the simulated vLLM server) or "vllm" (`vllm serve`)
    ray_address: str | None = None  # the Ray cluster; None: $RAY_ADDRESS, else a local cluster
    out: str | None = None  # output folder; None: out/<matrix name>
    store: str | None = None  # history store; None: <out>/history.sqlite
    resume: bool = False  # continue the latest unfinished run: cells with a verdict are not rerun

    @classmethod
    def from_args(cls, args: Any) -> RunOptions:
        """The options of `soakmatrix run` / `smoke` (their parsed flags)."""
        return cls(
            backend=args.backend, ray_address=args.ray_address, out=args.out, store=args.store, resume=bool(args.resume)
        )


@dataclass(frozen=True)
class RunResult:
    exit_code: int  # the CLI's: 0 pass, 1 hang, 2 crash, 3 infra / no JUnit, 130/143 stopped
    run_id: str | None  # the run in the history store (None: the store was never opened)
    out: Path  # the output folder (cells' artifacts, progress.log, JUnit, dashboard)
    store: Path  # the history store (SQLite) every result went to
    results: tuple[CellResult, ...] = ()  # every recorded result of the run (a resumed run's earlier ones too)
    junit: Path | None = None  # the JUnit file; None when it could not be written (or no cell ran)
    dashboard: Path | None = None  # the dashboard's index.html; None when not written
    interrupted: bool = False  # SIGINT/SIGTERM stopped it: the run stays open for `resume`
    lost: str = ""  # why the Ray cluster was lost mid-run ("" if it was not)
    unreachable: str = ""  # why no Ray cluster could be reached ("" if one was)
    warnings: tuple[str, ...] = ()  # what failed beside the soak (a report not written)

    @property
    def findings(self) -> tuple[CellResult, ...]:
        """The results that are findings: hangs and crashes."""
        return tuple(r for r in self.results if r.outcome.is_finding)
