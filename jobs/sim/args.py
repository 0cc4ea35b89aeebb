"""`vllm serve` argv -> the simulated engine's configuration (canonical flag values + sim options).

The flag registry (`matrix/contracts/flags.py`) turns canonical flag values into `vllm serve` arguments; this
module is its inverse, so the simulated engine runs exactly the flags a cell asked for. Flags vLLM
knows but the simulator does not model are ignored with a note; values vLLM refuses are refused
here too (`SimUsageError`, exit code 2 before anything listens).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soakmatrix.matrix.contracts import flags as flagmod
from soakmatrix.matrix.contracts.redact import redact_argv

DEFAULT_MAX_MODEL_LEN = 8192
BLOCK_SIZE = 16
SPEC_METHODS_MODELLED = ("mtp", "ngram")
# speculative methods vLLM knows; the simulator runs them as "no speculation" with a note
SPEC_METHODS_KNOWN = (
    "eagle",
    "eagle3",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "suffix",
    "deepseek_mtp",
    "ernie_mtp",
    "qwen3_next_mtp",
    "glm4_moe_mtp",
    "longcat_flash_mtp",
)


class SimUsageError(ValueError):
    """The command line is one vLLM would refuse (or the simulator cannot run)."""


@dataclass
class SimConfig:
    model: str
    flags: dict[str, Any]  # canonical values, vLLM defaults filled in
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = ""
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    num_gpu_blocks: int | None = None  # --num-gpu-blocks-override
    hang_model: str | None = None
    gpu_type: str = ""
    build: tuple[int, str] | None = None  # (ordinal, name) from SOAKMATRIX_BUILD[_ORDINAL]
    time_scale: float = 1.0
    seed: int = 0
    hang_record: str | None = None
    step_time_scale: float = 1.0  # benchmarks: 0 = an infinitely fast GPU
    torch_device: str | None = None  # --torch-device cuda:0: torch drives a real GPU (torch_device.py)
    access_log: bool = True
    log_stats: bool = True
    explicit: set[str] = field(default_factory=set)  # canonical flags given on the command line
    notes: list[str] = field(default_factory=list)  # ignored arguments, for the log

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def max_num_batched_tokens(self) -> int:
        """vLLM's default: 8192 per step with chunked prefill, else enough for one whole prompt."""
        value = self.flags.get("max_num_batched_tokens")
        if value is not None:
            return int(value)
        if self.flags.get("chunked_prefill", True):
            return max(8192, int(self.flags.get("max_num_seqs") or 1))
        return max(self.max_model_len, 8192)

    @property
    def spec_tokens(self) -> int:
        return int(self.flags.get("mtp") or 0) or int(self.flags.get("ngram") or 0)


# Our own options (not vLLM's). value -> attribute
_SIM_OPTIONS = {
    "--hang-model": "hang_model",
    "--gpu-type": "gpu_type",
    "--time-scale": "time_scale",
    "--hang-record": "hang_record",
    "--step-time-scale": "step_time_scale",
    "--torch-device": "torch_device",
}

# vLLM options that take a value and that the simulator reads.
_VALUED = {
    "--host": "host",
    "--port": "port",
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--max-model-len": "max_model_len",
    "--num-gpu-blocks-override": "num_gpu_blocks",
    "--seed": "seed",
}

# Canonical flags with a plain argv spelling: option -> (flag, value or None for "takes a value")
_BOOL_SPELLINGS: dict[str, tuple[str, bool]] = {
    "--async-scheduling": ("async_scheduling", True),
    "--no-async-scheduling": ("async_scheduling", False),
    "--enable-flashinfer-autotune": ("flashinfer_autotune", True),
    "--disable-flashinfer-autotune": ("flashinfer_autotune", False),
    "--no-enable-flashinfer-autotune": ("flashinfer_autotune", False),
    "--enable-prefix-caching": ("prefix_caching", True),
    "--no-enable-prefix-caching": ("prefix_caching", False),
    "--enable-chunked-prefill": ("chunked_prefill", True),
    "--no-enable-chunked-prefill": ("chunked_prefill", False),
    "--enforce-eager": ("enforce_eager", True),
    "--no-enforce-eager": ("enforce_eager", False),
    "--enable-expert-parallel": ("expert_parallel", True),
    "--no-enable-expert-parallel": ("expert_parallel", False),
}
_INT_SPELLINGS = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
}
_JSON_OPTIONS = {
    "--compilation-config": "compilation",
    "-cc": "compilation",
    "-O": "compilation",
    "--speculative-config": "speculative",
}

# vLLM switches that take no value (so a following bare word is not eaten as their value)
_VLLM_SWITCHES = {
    "--trust-remote-code",
    "--disable-log-stats",
    "--disable-log-requests",
    "--enable-log-requests",
    "--disable-uvicorn-access-log",
    "--enable-auto-tool-choice",
    "--disable-frontend-multiprocessing",
    "--enable-lora",
    "--disable-custom-all-reduce",
    "--enable-sleep-mode",
    "--skip-tokenizer-init",
    "--enable-log-outputs",
    "--enable-prompt-tokens-details",
    "--enable-force-include-usage",
    "--disable-fastapi-docs",
    "--enable-server-load-tracking",
    "--headless",
}


def _int(option: str, text: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise SimUsageError(f"argument {option}: invalid int value: {str(text)[:40]!r}") from None


def _check_record(path: str) -> None:
    """--hang-record is appended to (a file, or a FIFO a test reads): never a directory, nor under a file."""
    target = Path(path)
    if target.is_dir():
        raise SimUsageError(f"argument --hang-record: {path}: a directory, not a file")
    above = next((p for p in target.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise SimUsageError(f"argument --hang-record: {path}: {above} is a file, not a folder")


def _float(option: str, text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise SimUsageError(f"argument {option}: invalid float value: {str(text)[:40]!r}") from None


def _json(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SimUsageError(f"argument {option}: invalid JSON {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise SimUsageError(f"argument {option}: expected a JSON object, got {text!r}")
    return value


def parse_sim_argv(argv: Sequence[str], environ: dict[str, str] | None = None) -> SimConfig:
    """Parse `soakmatrix sim-engine` arguments (vLLM's plus ours) into a checked `SimConfig`."""
    environ = dict(os.environ if environ is None else environ)
    args = list(argv)
    values: dict[str, Any] = {}
    canonical: dict[str, Any] = {}
    compilation: dict[str, Any] = {}
    speculative: dict[str, Any] | None = None
    notes: list[str] = []
    positionals: list[str] = []
    i = 0

    def take(option: str) -> str:
        nonlocal i
        if i + 1 >= len(args):
            raise SimUsageError(f"argument {option}: expected one argument")
        i += 1
        return args[i]

    while i < len(args):
        token = args[i]
        inline: str | None = None
        option = token
        if token.startswith("--") and "=" in token:
            option, inline = token.split("=", 1)

        def value(inline: str | None = inline, option: str = option) -> str:
            return inline if inline is not None else take(option)

        if not token.startswith("-") or token == "-":
            positionals.append(token)
        elif option in _SIM_OPTIONS:
            values[_SIM_OPTIONS[option]] = value()
        elif option in _VALUED:
            values[_VALUED[option]] = value()
        elif option in _BOOL_SPELLINGS:
            name, on = _BOOL_SPELLINGS[option]
            canonical[name] = on
        elif option in _INT_SPELLINGS:
            name = _INT_SPELLINGS[option]
            canonical[name] = _int(option, value())
        elif option == "--kv-cache-dtype":
            dtype = value()
            if dtype not in flagmod.KV_CACHE_DTYPES:
                raise SimUsageError(
                    f"argument --kv-cache-dtype: invalid choice: {dtype!r} "
                    f"(choose from {', '.join(flagmod.KV_CACHE_DTYPES)})"
                )
            canonical["kv_cache_dtype"] = dtype
        elif option in _JSON_OPTIONS:
            text = value()
            if _JSON_OPTIONS[option] == "speculative":
                speculative = {**(speculative or {}), **_json(option, text)}
            elif option == "-O" and not text.lstrip().startswith("{"):
                notes.append(f"-O {text} (optimization level) is not modelled")
            else:
                compilation.update(_json(option, text))
        elif option.startswith(("--compilation-config.", "-cc.")):
            compilation[option.split(".", 1)[1]] = value()
        elif option.startswith("--speculative-config."):
            raw = value()
            key = option.split(".", 1)[1]
            speculative = {**(speculative or {}), key: _int(option, raw) if key == "num_speculative_tokens" else raw}
        elif option.startswith("-O") and len(option) > 2:
            notes.append(f"{option} (optimization level) is not modelled")
        elif option in ("--disable-uvicorn-access-log",):
            values["access_log"] = False
        elif option in ("--disable-log-stats",):
            values["log_stats"] = False
        else:
            # a vLLM option the simulator does not model: skip it and its value, if it has one
            if (
                inline is None
                and option not in _VLLM_SWITCHES
                and i + 1 < len(args)
                and not args[i + 1].startswith("-")
            ):
                notes.append(" ".join(redact_argv([option, args[i + 1]])))  # logged: no --api-key value
                i += 1
            else:
                notes.append(redact_argv([token])[0])
        i += 1

    model = values.pop("model", None)
    if positionals:
        if model is not None and positionals[0] != model:
            raise SimUsageError(f"model given twice: {positionals[0]!r} and --model {model!r}")
        model = positionals[0]
        if len(positionals) > 1:
            notes.append("extra positional arguments " + " ".join(positionals[1:]))
    if not model:
        raise SimUsageError("the following arguments are required: model_tag (or --model)")

    # JSON-valued options -> canonical flags
    if "cudagraph_mode" in compilation:
        mode = compilation.pop("cudagraph_mode")
        mode = mode.upper() if isinstance(mode, str) else mode
        if mode not in flagmod.CUDAGRAPH_MODES:
            raise SimUsageError(
                f"--compilation-config: cudagraph_mode: Input should be "
                f"{', '.join(repr(m) for m in flagmod.CUDAGRAPH_MODES)} [input_value={mode!r}]"
            )
        canonical["cudagraph_mode"] = mode
    for key in sorted(compilation):
        notes.append(f"--compilation-config key {key!r} is not modelled")
    if speculative is not None:
        _speculative(speculative, canonical, notes)

    full = flagmod.resolve_defaults(canonical)
    explicit = set(canonical)
    config = SimConfig(model=model, flags=full, explicit=explicit, notes=notes)
    _apply_values(config, values, environ)
    _check(config)
    return config


def _speculative(spec: dict[str, Any], canonical: dict[str, Any], notes: list[str]) -> None:
    method = spec.get("method")
    n = spec.get("num_speculative_tokens")
    if method is None:
        raise SimUsageError("--speculative-config: `method` is required")
    if method not in SPEC_METHODS_MODELLED and method not in SPEC_METHODS_KNOWN:
        raise SimUsageError(f"--speculative-config: Unsupported speculative method: {method!r}")
    if n is None:
        if method == "mtp":
            n = 1  # vLLM takes the model's MTP layer count; the simulated models have one
        else:
            raise SimUsageError(f"--speculative-config: num_speculative_tokens must be provided for method {method!r}")
    if isinstance(n, bool) or not isinstance(n, int):
        raise SimUsageError(f"--speculative-config: num_speculative_tokens must be an integer, got {n!r}")
    if n <= 0:
        raise SimUsageError(
            f"--speculative-config: Value error, num_speculative_tokens must be > 0, got {n}. "
            "Omit --speculative-config to disable speculative decoding."
        )
    if method in SPEC_METHODS_MODELLED:
        canonical[method] = n
    else:
        notes.append(f"speculative method {method!r} runs without speculation in the simulator")
    for key in sorted(set(spec) - {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}):
        notes.append(f"--speculative-config key {key!r} is not modelled")


def _apply_values(config: SimConfig, values: dict[str, Any], environ: dict[str, str]) -> None:
    if "host" in values:
        config.host = values["host"]
    if "port" in values:
        config.port = _int("--port", values["port"])
        if not 0 <= config.port <= 65535:
            raise SimUsageError(f"argument --port: {config.port} is not a port number")
    if "served_model_name" in values:
        config.served_model_name = values["served_model_name"]
    if "max_model_len" in values:
        config.max_model_len = _int("--max-model-len", values["max_model_len"])
        if config.max_model_len < 1:
            raise SimUsageError(f"--max-model-len must be positive, got {config.max_model_len}")
    if "num_gpu_blocks" in values:
        config.num_gpu_blocks = _int("--num-gpu-blocks-override", values["num_gpu_blocks"])
        if config.num_gpu_blocks < 1:
            raise SimUsageError("--num-gpu-blocks-override must be positive")
    if "seed" in values:
        config.seed = _int("--seed", values["seed"])
    if values.get("hang_model"):
        config.hang_model = values["hang_model"]
    config.gpu_type = values.get("gpu_type") or environ.get("SOAKMATRIX_GPU_TYPE", "")
    config.build = _build(environ)
    if "time_scale" in values:
        config.time_scale = _float("--time-scale", values["time_scale"])
        if not config.time_scale > 0:
            raise SimUsageError(f"argument --time-scale: must be > 0, got {config.time_scale}")
    if "step_time_scale" in values:
        config.step_time_scale = _float("--step-time-scale", values["step_time_scale"])
        if config.step_time_scale < 0:
            raise SimUsageError("argument --step-time-scale: must be >= 0")
    if values.get("hang_record"):
        config.hang_record = values["hang_record"]
        _check_record(config.hang_record)
    if "torch_device" in values:
        if not re.fullmatch(r"cuda(?::\d+)?|cpu", str(values["torch_device"])):
            raise SimUsageError(f"argument --torch-device: cuda, cuda:N or cpu, got {values['torch_device']!r}")
        config.torch_device = values["torch_device"]
    config.access_log = values.get("access_log", True)
    config.log_stats = values.get("log_stats", True)


def _build(environ: dict[str, str]) -> tuple[int, str] | None:
    """The engine build a matrix cell runs (matrix/builds.py sets both variables); None outside a build."""
    name, ordinal = environ.get("SOAKMATRIX_BUILD", ""), environ.get("SOAKMATRIX_BUILD_ORDINAL", "")
    if not name and not ordinal:
        return None
    try:
        return (int(ordinal), name) if ordinal else (-1, name)
    except ValueError:
        raise SimUsageError(f"SOAKMATRIX_BUILD_ORDINAL must be an integer, got {ordinal!r}") from None


def _check(config: SimConfig) -> None:
    """Refuse what vLLM refuses for these flags (with vLLM's reasons)."""
    f = config.flags
    for name, flag in flagmod.REGISTRY.items():
        value = f.get(name)
        if value is None and flag.default is None:
            continue
        problem = flag.check(value)
        if problem:
            option = {
                "tp": "--tensor-parallel-size",
                "kv_cache_dtype": "--kv-cache-dtype",
                "max_num_seqs": "--max-num-seqs",
                "max_num_batched_tokens": "--max-num-batched-tokens",
                "mtp": "--speculative-config",
                "ngram": "--speculative-config",
                "cudagraph_mode": "--compilation-config",
            }.get(name, name)
            raise SimUsageError(f"argument {option}: {problem}")
    if f.get("mtp") and f.get("ngram"):
        raise SimUsageError("--speculative-config: only one speculative method at a time")
    if f.get("ngram") and "async_scheduling" in config.explicit and f.get("async_scheduling"):
        raise SimUsageError(
            "Async scheduling is not supported with the ngram speculative method "
            "(--async-scheduling with --speculative-config method=ngram)"
        )
    mnbt = f.get("max_num_batched_tokens")
    if mnbt is not None:
        if mnbt < f["max_num_seqs"]:
            raise SimUsageError(
                f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs ({f['max_num_seqs']})."
            )
        if not f.get("chunked_prefill") and mnbt < config.max_model_len:
            raise SimUsageError(
                f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({config.max_model_len}). "
                "This effectively limits the maximum sequence length to max_num_batched_tokens and makes "
                "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
                "max_model_len."
            )
