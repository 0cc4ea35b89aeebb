"""The history store: one SQLite file of runs, cells, results and bisections across nights.

Written as cells finish, one transaction per result, in WAL mode: a driver killed mid-run loses
at most the cell it was writing, and `start_run(resume=True)` picks the unfinished run up again.
The schema (`history_schema`) is versioned with `PRAGMA user_version` and upgraded by the ordered
`MIGRATIONS` when a store is opened; a store written by a newer soakmatrix is refused rather than damaged.

Each result is kept whole as `CellResult` JSON (fields added later survive a round trip), with
the columns the reports query (outcome, signature, exposure, ...) beside it.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from soakmatrix.matrix.contracts.outcomes import Outcome
from soakmatrix.matrix.contracts.result import CellResult

from .history_schema import MIGRATIONS, SCHEMA_VERSION, statements

BUSY_TIMEOUT_S = 60.0  # other writers (a second driver, a report) hold the lock briefly


class StoreError(Exception):
    """The file is not a soakmatrix history store, or one from a newer version; names the file."""


# -- what reads return ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    id: str
    matrix: str
    profile: str
    kind: str
    meta: dict = field(default_factory=dict)
    status: str | None = None  # None while it runs (or when its driver died)
    started_at: float = 0.0
    finished_at: float | None = None
    planned: int = 0  # cells planned
    recorded: int = 0  # cells with a result

    @property
    def finished(self) -> bool:
        return self.status is not None


@dataclass(frozen=True)
class RecordedResult:
    """One result reduced to what the state machine and the heatmap need (no JSON parsing)."""

    run_id: str
    cell_id: str
    outcome: Outcome
    signature: str | None
    exposure_s: float
    time_to_hang_s: float | None
    detector: str | None = None
    gpu_hours: float = 0.0
    engine: str = ""  # "sim": its exposure is the simulated engine's clock, not wall time


@dataclass(frozen=True)
class CellInfo:
    id: str
    name: str
    model: str
    gpu: str
    flags: dict
    workload: str


# -- the store --------------------------------------------------------------------------------------


class HistoryStore:
    """`with HistoryStore(path) as store: run = store.start_run(matrix=..., profile=...)`."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
        if not create and not self.path.is_file():
            raise StoreError(f"{self.path}: no such history store")
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(
                str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a soakmatrix history store (SQLite says: {exc})") from None
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a killed process
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    # context manager
    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None  # type: ignore[assignment]

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        with self._lock:
            current = self.schema_version
            if current == 0 and self._has_foreign_tables():
                raise StoreError(f"{self.path}: an SQLite file, but not a soakmatrix history store")
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: schema version {current} is newer than this soakmatrix "
                    f"understands ({SCHEMA_VERSION}); upgrade soakmatrix to read it"
                )
            for version in sorted(v for v in MIGRATIONS if v > current):
                with self._write():
                    # another process may have migrated between our read and the write lock
                    if self.schema_version >= version:
                        continue
                    for statement in statements(MIGRATIONS[version]):
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {int(version)}")

    def _has_foreign_tables(self) -> bool:
        rows = self._db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        return bool(rows)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE takes the write lock up front (no upgrade deadlock)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- runs -------------------------------------------------------------------------------------

    def start_run(
        self, *, matrix: str, profile: str, kind: str = "nightly", meta: dict | None = None, resume: bool = False
    ) -> str:
        """A new run's id; with resume=True the latest unfinished run of this matrix+profile, if any."""
        with self._write() as db:
            if resume:
                row = db.execute(
                    "SELECT id FROM runs WHERE matrix=? AND profile=? AND status IS NULL ORDER BY seq DESC LIMIT 1",
                    (matrix, profile),
                ).fetchone()
                if row:
                    return row[0]
            now = self._clock()
            run_id = _new_run_id(now)
            db.execute(
                "INSERT INTO runs (id, matrix, profile, kind, meta, started_at) VALUES (?,?,?,?,?,?)",
                (run_id, matrix, profile, kind, json.dumps(meta or {}, sort_keys=True, default=str), now),
            )
            return run_id

    def finish_run(self, run_id: str, status: str) -> None:
        with self._write() as db:
            self._require_run(run_id)
            db.execute("UPDATE runs SET status=?, finished_at=? WHERE id=?", (status, self._clock(), run_id))

    def runs(self) -> list[Run]:
        """Every run, oldest first, with counts of planned and recorded cells."""
        with self._lock:
            rows = self._db.execute("""
                SELECT r.id, r.matrix, r.profile, r.kind, r.meta, r.status, r.started_at, r.finished_at,
                       (SELECT COUNT(*) FROM planned p WHERE p.run_id = r.id),
                       (SELECT COUNT(*) FROM results s WHERE s.run_id = r.id)
                FROM runs r ORDER BY r.seq""").fetchall()
        return [
            Run(
                id=r[0],
                matrix=r[1],
                profile=r[2],
                kind=r[3],
                meta=json.loads(r[4]),
                status=r[5],
                started_at=r[6],
                finished_at=r[7],
                planned=r[8],
                recorded=r[9],
            )
            for r in rows
        ]

    def run(self, run_id: str) -> Run:
        for r in self.runs():
            if r.id == run_id:
                return r
        raise KeyError(f"{self.path}: no run {run_id!r}")

    def latest_run_id(self) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT id FROM runs ORDER BY seq DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def _require_run(self, run_id: str) -> None:
        if not self._db.execute("SELECT 1 FROM runs WHERE id=?", (run_id,)).fetchone():
            raise KeyError(f"{self.path}: no run {run_id!r}")

    # -- cells and results ------------------------------------------------------------------------

    def planned(self, run_id: str, cells: Sequence[Mapping[str, Any]]) -> None:
        """Record the cells a run will soak (dicts with id, name, model, gpu, flags, workload)."""
        with self._write() as db:
            self._require_run(run_id)
            start = db.execute("SELECT COALESCE(MAX(pos), -1) + 1 FROM planned WHERE run_id=?", (run_id,)).fetchone()[0]
            for i, cell in enumerate(cells):
                _upsert_cell(
                    db,
                    cell["id"],
                    cell["name"],
                    cell["model"],
                    cell["gpu"],
                    cell.get("flags", {}),
                    cell.get("workload", ""),
                )
                db.execute(
                    "INSERT OR IGNORE INTO planned (run_id, cell_id, pos) VALUES (?,?,?)",
                    (run_id, cell["id"], start + i),
                )

    def record(self, run_id: str, result: CellResult) -> None:
        """Store one cell's result in one transaction; a later record for the same cell replaces it."""
        data = result.to_json()
        with self._write() as db:
            self._require_run(run_id)
            _upsert_cell(
                db, result.cell_id, result.cell_name, result.model, result.gpu_type, result.flags, result.workload
            )
            db.execute(
                """INSERT OR REPLACE INTO results (run_id, cell_id, outcome, signature, exposure_s,
                              time_to_hang_s, started_at, ended_at, data, recorded_at, detector, gpu_hours,
                              fingerprint)
                          VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                (
                    run_id,
                    result.cell_id,
                    result.outcome.value,
                    result.signature,
                    float(result.exposure_s),
                    result.time_to_hang_s,
                    result.started_at,
                    result.ended_at,
                    data,
                    self._clock(),
                    result.detector,
                    result.gpu_hours,
                    result.fingerprint,
                ),
            )

    def set_fingerprint(self, run_id: str, cell_id: str, fingerprint: str) -> None:
        """Replace one recorded result's fingerprint, in its column and its JSON (matrix.refingerprint)."""
        with self._write() as db:
            db.execute(
                """UPDATE results SET fingerprint = ?, data = json_set(data, '$.fingerprint', ?)
                          WHERE run_id = ? AND cell_id = ?""",
                (fingerprint, fingerprint, run_id, cell_id),
            )

    def results(self, run_id: str) -> list[CellResult]:
        """The run's results in the order they were recorded."""
        with self._lock:
            rows = self._db.execute(
                "SELECT data FROM results WHERE run_id=? ORDER BY recorded_at, rowid", (run_id,)
            ).fetchall()
        return [CellResult.from_json(r[0]) for r in rows]

    def result(self, run_id: str, cell_id: str) -> CellResult | None:
        with self._lock:
            row = self._db.execute(
                "SELECT data FROM results WHERE run_id=? AND cell_id=?", (run_id, cell_id)
            ).fetchone()
        return CellResult.from_json(row[0]) if row else None

    def finished_cell_ids(self, run_id: str) -> set[str]:
        """Cells of the run that have a recorded result (of any outcome): what a resumed run skips."""
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT cell_id FROM results WHERE run_id=?", (run_id,))}

    def planned_cell_ids(self, run_id: str) -> list[str]:
        with self._lock:
            return [
                r[0] for r in self._db.execute("SELECT cell_id FROM planned WHERE run_id=? ORDER BY pos", (run_id,))
            ]

    def cells(self) -> dict[str, CellInfo]:
        with self._lock:
            rows = self._db.execute("SELECT id, name, model, gpu, flags, workload FROM cells").fetchall()
        return {r[0]: CellInfo(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows}

    def observations(self) -> list[RecordedResult]:
        """Every result across runs, light (no JSON), in run order."""
        with self._lock:
            rows = self._db.execute("""
                SELECT s.run_id, s.cell_id, s.outcome, s.signature, s.exposure_s, s.time_to_hang_s,
                       s.detector, s.gpu_hours, COALESCE(json_extract(s.data, '$.engine'), '')
                FROM results s JOIN runs r ON r.id = s.run_id ORDER BY r.seq, s.rowid""").fetchall()
        return [RecordedResult(r[0], r[1], Outcome(r[2]), r[3], r[4], r[5], r[6], r[7], r[8]) for r in rows]

    def fingerprinted(self) -> list[tuple[str, CellResult]]:
        """(run id, result) of every hang and crash with a fingerprint, in run order (reports.findings)."""
        with self._lock:
            rows = self._db.execute("""SELECT s.run_id, s.data FROM results s JOIN runs r ON r.id = s.run_id
                                       WHERE s.outcome IN ('hang', 'crash') AND s.fingerprint IS NOT NULL
                                       ORDER BY r.seq, s.rowid""").fetchall()
        return [(r[0], CellResult.from_json(r[1])) for r in rows]

    def findings(
        self, run_id: str | None = None, limit_per_signature: int | None = None
    ) -> list[tuple[str, CellResult]]:
        """(run id, result) of hangs and crashes, newest run first; optionally the newest few per signature."""
        query = """SELECT s.run_id, s.data, s.signature FROM results s JOIN runs r ON r.id = s.run_id
                   WHERE s.outcome IN ('hang', 'crash')"""
        params: tuple = ()
        if run_id is not None:
            query += " AND s.run_id = ?"
            params = (run_id,)
        query += " ORDER BY r.seq DESC, s.rowid"
        out: list[tuple[str, CellResult]] = []
        seen: dict[str | None, int] = {}
        with self._lock:
            for run, data, signature in self._db.execute(query, params):
                if limit_per_signature is not None:
                    if seen.get(signature, 0) >= limit_per_signature:
                        continue
                    seen[signature] = seen.get(signature, 0) + 1
                out.append((run, CellResult.from_json(data)))
        return out

    # -- bisections -------------------------------------------------------------------------------

    def record_bisection(self, cell_id: str, report: dict, run_id: str | None = None) -> None:
        """Store a bisection's JSON report (cell, signature, minimal_set, confidence, configs, verdicts, ...).
        The very report the cell's last one was is not stored twice: a finished bisection resumed from
        its journal (`bisect --resume`) replays to it."""
        text = json.dumps(report, sort_keys=True, default=str)
        with self._write() as db:
            last = db.execute(
                "SELECT report FROM bisections WHERE cell_id = ? ORDER BY id DESC LIMIT 1", (cell_id,)
            ).fetchone()
            if last is not None and last[0] == text:
                return
            db.execute(
                "INSERT INTO bisections (cell_id, run_id, signature, report, recorded_at) VALUES (?,?,?,?,?)",
                (cell_id, run_id, report.get("signature"), text, self._clock()),
            )

    def bisections(self) -> list[dict]:
        """Every stored bisection report, oldest first, with `cell_id`, `run_id` and `recorded_at` added."""
        with self._lock:
            rows = self._db.execute(
                "SELECT cell_id, run_id, report, recorded_at FROM bisections ORDER BY id"
            ).fetchall()
        return [{**json.loads(r[2]), "cell_id": r[0], "run_id": r[1], "recorded_at": r[3]} for r in rows]


def _upsert_cell(
    db: sqlite3.Connection, cell_id: str, name: str, model: str, gpu: str, flags: Mapping[str, Any], workload: str
) -> None:
    db.execute(
        """INSERT INTO cells (id, name, model, gpu, flags, workload) VALUES (?,?,?,?,?,?)
                  ON CONFLICT(id) DO UPDATE SET name=excluded.name, model=excluded.model, gpu=excluded.gpu,
                  flags=excluded.flags, workload=excluded.workload""",
        (cell_id, name, model, gpu, json.dumps(dict(flags), sort_keys=True, default=str), workload),
    )


def _new_run_id(now: float) -> str:
    """Sortable and readable: `20261121T225500Z-3fa9c1`."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"
