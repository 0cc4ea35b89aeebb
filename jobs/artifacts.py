"""A cell's artifacts are private and hold no secret: the last step of every soak.

The engine writes its own log (we only redirect its output), py-spy prints every process's
command line, vLLM logs its non-default arguments: a secret given to the engine can land anywhere
in the cell's folder. So when a cell ends, every file in it is scrubbed (the literal secret values
of the cell's argv and environment, plus every pattern of `matrix.contracts.redact`), made 0600,
and its folders 0700; the `CellResult` that goes on to JUnit, the history store and the dashboard is
scrubbed the same way.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from soakmatrix.matrix.contracts.redact import scrub, secret_values
from soakmatrix.matrix.contracts.result import FROM_EXTRA, CellResult

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
MAX_SCRUB_BYTES = 256 << 20  # a larger file is truncated to its scrubbed tail rather than left as is


def secrets_of(argv: Iterable[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The literal secrets of a cell: its argv's and env's, and the node's own secret-named variables
    (an engine may echo `HF_TOKEN` from the environment it inherits)."""
    return secret_values(argv, {**os.environ, **dict(env or {})})


def private_dir(path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    os.chmod(path, PRIVATE_DIR)
    return path


def seal(folder: str | Path, secrets: Iterable[str] = ()) -> int:
    """Scrub every regular file under `folder` in place and make it private; returns files changed."""
    secrets = list(secrets)
    changed = 0
    root = Path(folder)
    if not root.is_dir():
        return 0
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, PRIVATE_DIR)
        for name in filenames:
            path = Path(dirpath) / name
            try:
                mode = path.lstat().st_mode
            except OSError:
                continue
            if not stat.S_ISREG(mode):
                continue  # sockets, fifos and links are not ours to rewrite
            changed += _scrub_file(path, secrets)
            os.chmod(path, PRIVATE_FILE)
    return changed


def _scrub_file(path: Path, secrets: list[str]) -> int:
    size = path.stat().st_size
    with open(path, "rb") as handle:
        if size > MAX_SCRUB_BYTES:
            handle.seek(size - MAX_SCRUB_BYTES)
        raw = handle.read()
    # surrogateescape keeps bytes that are not UTF-8 exactly as they were
    text = raw.decode("utf-8", errors="surrogateescape")
    clean = scrub(text, secrets)
    if clean == text and size <= MAX_SCRUB_BYTES:
        return 0
    tmp = path.with_name(path.name + ".scrub")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(clean.encode("utf-8", errors="surrogateescape"))
    os.replace(tmp, path)
    return 1


def scrub_result(result: CellResult, secrets: Iterable[str] = ()) -> CellResult:
    """The result's free text (message, log tail, frames, the fields `extra` held) without secrets, in place."""
    secrets = list(secrets)
    result.message = scrub(result.message, secrets)
    result.log_tail = [scrub(line, secrets) for line in result.log_tail]
    result.stuck_frames = [scrub(line, secrets) for line in result.stuck_frames]
    result.retries = [scrub(line, secrets) for line in result.retries]
    for name in FROM_EXTRA:
        setattr(result, name, _scrub_value(getattr(result, name), secrets))
    return result


def _scrub_value(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, dict):
        return {k: _scrub_value(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_scrub_value(v, secrets) for v in value)
    return value
