"""Engine builds: the `builds:` section of a matrix file, and how each build reaches a cell through
Ray's `runtime_env` (Ray installs or starts it on the node; soakmatrix installs nothing itself).

| kind | YAML | runtime_env |
|---|---|---|
| pip | `pip: vllm==0.11.0` (a version, a wheel path or URL, `vllm @ git+https://...@SHA`) | `pip: {packages: [...], pip_check: false}`: a virtualenv on top of the node's Python |
| image | `image: vllm/vllm-openai:v0.11.0` | `image_uri`: the worker runs in the container (Ray's replacement for `container`) |
| python | `python: /opt/vllm-0.11/bin/python` | `py_executable`: the worker runs under that interpreter |

`setup_timeout` becomes `config.setup_timeout_seconds`, so an install that stalls ends as Ray's
`RuntimeEnvSetupError` (a config or infra error of that build, `setup_error_outcome`), never a hang.
The order of the section is the builds' history order (ordinal 0 first).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from soakmatrix.matrix.contracts.outcomes import Outcome

from .spec_types import BUILD_KINDS, Build

BUILD_KEYS = {*BUILD_KINDS, "setup_timeout"}

# The environment variables that tell the engine (the simulator's hang model, the fault plugin) its build.
BUILD_ENV = "SOAKMATRIX_BUILD"
BUILD_ORDINAL_ENV = "SOAKMATRIX_BUILD_ORDINAL"


def builds_section(
    value: Any, err: Callable[[tuple, str], None], mapping: Callable[..., dict], duration: Callable[..., float]
) -> dict[str, Build]:
    """Named builds in the file's order; each needs exactly one of `pip`, `image`, `python`.
    Problems go to `err(path, message)` (the loader's, so every problem is reported at once)."""
    if value is not None and not isinstance(value, dict):
        err(("builds",), "expected a mapping of build name -> {pip|image|python: ...}")
        return {}
    if value == {}:
        err(("builds",), "empty: leave `builds` out to run the engine already installed, or name one")
    out: dict[str, Build] = {}
    for name, spec in (value or {}).items():
        path = ("builds", name)
        if not isinstance(name, str) or not name.strip() or "|" in name or "," in name:
            err(path, f"a build name must be a non-empty string without `|` or `,`, got {name!r}")
            continue
        spec = mapping(spec, path, BUILD_KEYS)
        kinds = [k for k in BUILD_KINDS if k in spec]
        if len(kinds) != 1:
            err(path, f"needs exactly one of {', '.join(BUILD_KINDS)}" + (f", got {', '.join(kinds)}" if kinds else ""))
            continue
        kind = kinds[0]
        what = spec[kind]
        if not isinstance(what, str) or not what.strip():
            err(path + (kind,), f"expected a non-empty string, got {what!r}")
            continue
        if kind == "python" and not what.strip().startswith("/"):
            # Ray starts the worker with it on whichever node it picks: a relative path means nothing there
            err(path + (kind,), f"expected an absolute path to the interpreter on the nodes, got {what!r}")
            continue
        timeout = None
        if "setup_timeout" in spec:
            timeout = duration(spec["setup_timeout"], path + ("setup_timeout",), positive=True)
        out[name] = Build(name, len(out), kind, what.strip(), timeout)
    return out


def runtime_env_for(build: Build) -> dict[str, Any]:
    """The runtime_env of a cell's Ray task for `build` (plain values: it crosses into the SoakSpec)."""
    if build.kind == "pip":
        env: dict[str, Any] = {"pip": {"packages": [build.value], "pip_check": False}}
    elif build.kind == "image":
        env = {"image_uri": build.value}
    elif build.kind == "python":
        env = {"py_executable": build.value}
    else:
        raise ValueError(f"unknown build kind {build.kind!r}")
    if build.setup_timeout_s is not None:
        env["config"] = {"setup_timeout_seconds": max(1, round(build.setup_timeout_s))}
    return env


def build_env(build: Build) -> dict[str, str]:
    """What the engine process is told of its build (`when: {build: ...}` in a hang model reads it)."""
    return {BUILD_ENV: build.name, BUILD_ORDINAL_ENV: str(build.ordinal)}


def describe(build: Build) -> str:
    return f"{build.kind}: {build.value}"


# Ray's words when the setup ran out of time, and pip's when the network failed: worth a retry on
# another node. Anything else (no such version, no such image, a wheel that will not install) is the build's.
_TRANSIENT = re.compile(
    r"Failed to install runtime_env within the timeout|NewConnectionError|ReadTimeoutError|"
    r"Temporary failure in name resolution|Connection (refused|reset)|Network is unreachable|"
    r"TLS handshake timeout|i/o timeout",
    re.IGNORECASE,
)


def setup_error_outcome(message: str) -> Outcome:
    """A build that Ray could not set up: `config_error` (the requirement does not resolve, the image
    does not exist: rerunning changes nothing), or `infra_error` when the message reads as a timeout or
    a network failure (retried on another node, like any infra error)."""
    return Outcome.INFRA_ERROR if _TRANSIENT.search(message or "") else Outcome.CONFIG_ERROR
