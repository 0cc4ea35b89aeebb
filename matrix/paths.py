"""argparse types for the CLI's paths: each is checked where it is read, before any work starts.

An input file must be a regular file that can be read: a FIFO (whose open blocks for ever), a device
(/dev/zero never ends), a directory, a path under a file or a /proc or /sys entry is exit 2 naming the
option and the path; so is one larger than the option's cap. An output file's target must not be a
directory, a device or a FIFO, and the folder it goes in must exist (or be creatable: its nearest
existing ancestor a directory), be writable and not on a read-only file system. An output folder
must not be a file nor lie under one. What can still fail later (a disk that fills up mid-run) is
reported by the writer with its own exit code; these checks catch everything knowable up front.

Each type carries `kind` (path-in, path-out, dir-in, dir-out, log) for tests/test_cli_options.py.
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Callable
from pathlib import Path

from .arguments import MAX_TEXT_CHARS, typed
from .contracts.yamlsrc import LIMITS

PSEUDO_ROOTS = ("/proc", "/sys", "/dev")  # kernel views: never a configuration file or a place for output
REAL_UNDER_PSEUDO = ("/dev/shm",)  # a tmpfs of ordinary files, though it lies under /dev
STDIN = "-"


class PathProblem(argparse.ArgumentTypeError):
    pass


def _fail(path: str, why: str) -> PathProblem:
    return PathProblem(f"{path}: {why}")


def _pseudo(path: str) -> str | None:
    """The kernel file system `path` lies in (/proc, /sys, /dev), after symlinks, or None."""
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root + "/") for root in REAL_UNDER_PSEUDO):
        return None
    for root in PSEUDO_ROOTS:
        if real == root or real.startswith(root + "/"):
            return root
    return None


def _length(path: str) -> None:
    if not path:
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    if len(path) > MAX_TEXT_CHARS or "\x00" in path:
        raise argparse.ArgumentTypeError(f"not a usable path ({len(path)} characters)")


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (a named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _stat(path: str) -> os.stat_result | None:
    """The path's status, None when nothing is there; a path under a file or unreadable is an error."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise _fail(path, "lies under a file, not a directory") from None
    except OSError as exc:
        raise _fail(path, exc.strerror or str(exc)) from None


def check_input_file(path: str, max_bytes: int | None = None) -> str:
    _length(path)
    st = _stat(path)
    if st is None:
        raise _fail(path, "no such file")
    if _pseudo(path) and stat.S_ISREG(st.st_mode):
        raise _fail(path, f"a kernel file under {_pseudo(path)}, not a file of data")
    if not stat.S_ISREG(st.st_mode):
        raise _fail(path, f"{_what(st.st_mode)}, not a file")
    if not os.access(path, os.R_OK):
        raise _fail(path, "not readable (permission denied)")
    if max_bytes is not None and st.st_size > max_bytes:
        raise _fail(path, f"{st.st_size:,} bytes, more than the {max_bytes:,} this option reads")
    return path


def input_file(max_bytes: int | None = None, stdin: bool = False) -> Callable[[str], str]:
    """A regular, readable file (at most `max_bytes`); `-` for stdin when `stdin`."""

    def parse(path: str) -> str:
        if stdin and path == STDIN:
            return path
        return check_input_file(path, max_bytes)

    parse.max_bytes = max_bytes  # type: ignore[attr-defined]
    return typed(parse, "path-in")


CONFIG_FILE = input_file(LIMITS.max_bytes)  # a matrix, hang model, builds or known-issues file
CONFIG_OR_STDIN = input_file(LIMITS.max_bytes, stdin=True)


def input_dir(path: str) -> str:
    """An existing directory that can be read."""
    _length(path)
    st = _stat(path)
    if st is None:
        raise _fail(path, "no such directory")
    if not stat.S_ISDIR(st.st_mode):
        raise _fail(path, f"{_what(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, not a directory")
    if _pseudo(path):
        raise _fail(path, f"a kernel directory under {_pseudo(path)}")
    return path


typed(input_dir, "dir-in")


def _nearest_existing(path: str) -> tuple[Path, os.stat_result]:
    """The nearest ancestor of `path` that exists (the path itself first), and its status."""
    current = Path(os.path.abspath(path))
    while True:
        st = _stat(str(current))
        if st is not None:
            return current, st
        if current.parent == current:
            raise _fail(path, "no existing folder above it")
        current = current.parent


def _writable_folder(path: str, folder: Path, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise _fail(
            path, f"lies under {folder}, which is {_what(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}"
        )
    if _pseudo(str(folder)):
        raise _fail(path, f"under {_pseudo(str(folder))}, a kernel file system: no place for output")
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            raise _fail(path, f"{folder} is on a read-only file system")
    except OSError:
        pass
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _fail(path, f"{folder} is not writable (permission denied)")


def check_output_file(path: str) -> str:
    _length(path)
    st = _stat(path)
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise _fail(path, f"{_what(st.st_mode)}: cannot write a file there")
        if _pseudo(path):
            raise _fail(path, f"a kernel file under {_pseudo(path)}: no place for output")
        if not os.access(path, os.W_OK):
            raise _fail(path, "not writable (permission denied)")
    if path.endswith(os.sep):
        raise _fail(path, "ends in a slash: a folder, not a file")
    folder, folder_st = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    _writable_folder(path, folder, folder_st)
    return path


def output_file(path: str) -> str:
    """A file to write (new or replaced): not a directory or device, in a writable folder."""
    return check_output_file(path)


typed(output_file, "path-out")


def output_dir(path: str) -> str:
    """A folder to write into: an existing writable directory or one that can be created."""
    _length(path)
    folder, st = _nearest_existing(path)
    if folder == Path(os.path.abspath(path)) and not stat.S_ISDIR(st.st_mode):
        raise _fail(path, f"{_what(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, not a folder")
    _writable_folder(path, folder, st)
    return path


typed(output_dir, "dir-out")


def log_to_follow(path: str) -> str:
    """A log file followed like `tail -F`: a regular file, or one that does not exist yet in an existing
    folder; `-` for stdin. A FIFO is refused (its open would block until a writer comes): give it as
    stdin with `--log - < FIFO`."""
    if path == STDIN:
        return path
    _length(path)
    st = _stat(path)
    if st is None:
        folder, folder_st = _nearest_existing(os.path.dirname(os.path.abspath(path)))
        if folder != Path(os.path.dirname(os.path.abspath(path))):
            raise _fail(path, f"no such file, and no folder {os.path.dirname(os.path.abspath(path))} to appear in")
        if not stat.S_ISDIR(folder_st.st_mode):
            raise _fail(path, f"lies under {folder}, which is not a directory")
        return path
    if stat.S_ISFIFO(st.st_mode):
        raise _fail(
            path,
            "a FIFO: give it as stdin instead (`--log - < FIFO`), so the watch does not wait for a "
            "writer before it starts",
        )
    return check_input_file(path)


typed(log_to_follow, "log")


def existing_store(path: str) -> str:
    """A history store to read: a regular file, and not an empty one (nothing was ever recorded in it)."""
    _length(path)
    if _stat(path) is None:
        raise _fail(path, "no such history store")
    check_input_file(path)
    if os.stat(path).st_size == 0:
        raise _fail(path, "an empty file: no history store was ever written here")
    return path


typed(existing_store, "path-in")


def empty_store_warning(option: str, path: str | None) -> str | None:
    """A warning for a --store that exists but is empty: a store is started in it, which is rarely what
    a user who named an existing file meant."""
    if path and os.path.isfile(path) and os.path.getsize(path) == 0:
        return f"warning: {option} {path} is an empty file; a new history store is started in it"
    return None
