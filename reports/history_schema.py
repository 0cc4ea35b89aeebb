"""The history store's schema: its tables as SQL, one script per version (`MIGRATIONS`), and the
split of a script into statements so that each migration runs in the store's own transaction.
`history.HistoryStore` applies the versions a store lacks when it opens one.
"""

from __future__ import annotations

import sqlite3

_V1 = """
CREATE TABLE runs (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,   -- order of runs
    id          TEXT NOT NULL UNIQUE,
    matrix      TEXT NOT NULL,
    profile     TEXT NOT NULL,
    kind        TEXT NOT NULL,
    meta        TEXT NOT NULL DEFAULT '{}',
    status      TEXT,                                -- NULL while running
    started_at  REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE cells (
    id       TEXT PRIMARY KEY,
    name     TEXT NOT NULL,
    model    TEXT NOT NULL,
    gpu      TEXT NOT NULL,
    flags    TEXT NOT NULL,
    workload TEXT NOT NULL
);
CREATE TABLE planned (
    run_id  TEXT NOT NULL REFERENCES runs(id),
    cell_id TEXT NOT NULL REFERENCES cells(id),
    pos     INTEGER NOT NULL,
    PRIMARY KEY (run_id, cell_id)
);
CREATE TABLE results (
    run_id        TEXT NOT NULL REFERENCES runs(id),
    cell_id       TEXT NOT NULL REFERENCES cells(id),
    outcome       TEXT NOT NULL,
    signature     TEXT,
    exposure_s    REAL NOT NULL,
    time_to_hang_s REAL,
    started_at    REAL,
    ended_at      REAL,
    data          TEXT NOT NULL,                     -- the CellResult as JSON
    recorded_at   REAL NOT NULL,
    PRIMARY KEY (run_id, cell_id)
);
"""

_V2 = """
CREATE TABLE bisections (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    cell_id     TEXT NOT NULL,
    run_id      TEXT,
    signature   TEXT,
    report      TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE INDEX bisections_cell ON bisections(cell_id);
"""

_V3 = """
ALTER TABLE results ADD COLUMN detector TEXT;
ALTER TABLE results ADD COLUMN gpu_hours REAL NOT NULL DEFAULT 0;
UPDATE results SET detector = json_extract(data, '$.detector'),
                   gpu_hours = COALESCE(json_extract(data, '$.gpu_count'), 0)
                               * MAX(0, COALESCE(ended_at, started_at) - started_at) / 3600.0;
CREATE INDEX results_cell ON results(cell_id);
CREATE INDEX results_signature ON results(signature) WHERE signature IS NOT NULL;
"""

# The fingerprint (the culprit's frames) groups one bug's results across cells and nights.
_V4 = """
ALTER TABLE results ADD COLUMN fingerprint TEXT;
UPDATE results SET fingerprint = json_extract(data, '$.fingerprint');
CREATE INDEX results_fingerprint ON results(fingerprint) WHERE fingerprint IS NOT NULL;
"""

# version -> SQL; a store at version N gets N+1.. applied in order, each in its own transaction.
MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4}
SCHEMA_VERSION = max(MIGRATIONS)


def statements(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit our transaction)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
