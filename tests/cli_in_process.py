"""The CLI run in this process, as `soakmatrix ARGV` would run it: its exit code, stdout and stderr.
Faster than a subprocess for the checks that stop at parsing or answer in virtual time; files it
writes are private (umask 077), as the command makes them."""

from __future__ import annotations

import contextlib
import io
import os


def run_cli(argv: list[str]) -> tuple[object, str, str]:
    from soakmatrix.matrix import cli

    out, err = io.StringIO(), io.StringIO()
    umask = os.umask(0o077)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        os.umask(umask)
    return code, out.getvalue(), err.getvalue()
