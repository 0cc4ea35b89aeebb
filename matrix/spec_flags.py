"""The flag sections of a matrix file: `flags:` (custom flags, added to the registry), `axes:`,
`baseline:` and the `include:`/`exclude:` rules, each value checked against its flag. `FlagSections`
is mixed into `matrix.spec`'s loader, whose `err`, `mapping` and `known` report every problem at its
file, line and key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .contracts import flags as flagmod
from .contracts.flags import Flag
from .spec_types import CELL_KEYS

CUSTOM_FLAG_KEYS = {"type", "argv", "env", "choices", "default", "doc"}


class FlagSections:
    """The loader's readers of the flag sections; `registry` is the flags known so far (built in, then
    the matrix's own)."""

    registry: dict[str, Flag]

    # the loader's (matrix.spec): report a problem, read a mapping, check a name among those declared
    def err(self, path: tuple, message: str) -> None:
        raise NotImplementedError

    def mapping(self, value: Any, path: tuple, allowed: set[str] | None = None) -> dict:
        raise NotImplementedError

    def known(self, value: Any, known: Mapping, path: tuple, what: str) -> bool:
        raise NotImplementedError

    def custom_flags(self, value: Any) -> None:
        for name, spec in self.mapping(value, ("flags",)).items():
            path = ("flags", name)
            spec = self.mapping(spec, path, CUSTOM_FLAG_KEYS)
            if name in flagmod.REGISTRY:
                self.err(path, "redefines a built-in flag")
                continue
            kind = spec.get("type", "str")
            if kind not in ("bool", "int", "choice", "str"):
                self.err(path + ("type",), f"{kind!r} is not one of bool, int, choice, str")
                continue
            argv = spec.get("argv", [])
            if isinstance(argv, str):
                argv = argv.split()
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                self.err(path + ("argv",), "expected a list of strings (use {value} for the value)")
                continue
            env = spec.get("env", {}) or {}
            if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
                self.err(path + ("env",), "expected a mapping of variable -> string template")
                continue
            if not argv and not env:
                self.err(path, "a custom flag needs `argv` or `env`")
                continue
            choices = spec.get("choices")
            if kind == "choice" and not isinstance(choices, list):
                self.err(path + ("choices",), "a choice flag needs a list of choices")
                continue
            self.registry[name] = flagmod.raw_flag(
                name,
                "str" if kind == "choice" and choices is None else kind,
                argv,
                env,
                choices,
                spec.get("default"),
                spec.get("doc", ""),
            )

    def flag_value(self, name: Any, value: Any, path: tuple) -> bool:
        flag = self.registry.get(name)
        if flag is None:
            self.err(path, f"unknown flag {name!r}; known: {', '.join(self.registry)}")
            return False
        problem = flag.check(value)
        if problem:
            self.err(path, problem)
            return False
        return True

    def axes(self, value: Any) -> dict[str, tuple]:
        out = {}
        for name, values in self.mapping(value, ("axes",)).items():
            path = ("axes", name)
            if name in CELL_KEYS:
                self.err(path, f"{name!r} is not a flag: list {name}s under `{name}s:`")
                continue
            if name not in self.registry:
                self.err(path, f"unknown flag {name!r}; known: {', '.join(self.registry)}")
                continue
            if not isinstance(values, list):
                values = [values]
            if not values:
                self.err(path, "an axis needs at least one value")
                continue
            checked = [self.flag_value(name, v, path + (i,)) for i, v in enumerate(values)]  # each error reported
            ok = all(checked)
            if len(set(map(repr, values))) != len(values):
                self.err(path, "an axis lists a value twice")
                ok = False
            if ok:
                out[name] = tuple(values)
        return out

    def flag_values(self, value: Any, path: tuple) -> dict[str, Any]:
        out = {}
        for name, v in self.mapping(value, path).items():
            if self.flag_value(name, v, path + (name,)):
                out[name] = v
        return out

    def rules(
        self,
        value: Any,
        path: tuple,
        models: Mapping,
        gpus: Mapping,
        workloads: Mapping,
        axes: Mapping[str, tuple] | None = None,
    ) -> tuple:
        """include/exclude entries; with `axes` (exclude), a flag must be an axis and its value one of the
        axis's, as GitHub Actions refuses an exclude that names no key of the matrix: an entry that can
        match nothing is a mistake, not a no-op."""
        if value is None:
            return ()
        if not isinstance(value, list):
            self.err(path, "expected a list of mappings")
            return ()
        out = []
        for i, entry in enumerate(value):
            epath = path + (i,)
            if not isinstance(entry, dict) or not entry:
                self.err(epath, "expected a non-empty mapping of model/gpu/workload/flag -> value")
                continue
            ok = True
            for key, v in entry.items():
                kpath = epath + (key,)
                if key == "model":
                    ok &= self.known(v, models, kpath, "model")
                elif key == "gpu":
                    ok &= self.known(v, gpus, kpath, "GPU type")
                elif key == "workload":
                    ok &= self.known(v, workloads, kpath, "workload")
                elif axes is not None and key in self.registry and key not in axes:
                    self.err(
                        kpath,
                        f"{key!r} is not an axis of this matrix, so this entry excludes nothing; "
                        f"axes: {', '.join(axes) or 'none'}",
                    )
                    ok = False
                elif not self.flag_value(key, v, kpath):
                    ok = False
                elif axes is not None and not any(_same_value(v, a) for a in axes[key]):
                    self.err(
                        kpath,
                        f"{v!r} is not a value of the {key} axis ({', '.join(map(repr, axes[key]))}), "
                        "so this entry excludes nothing",
                    )
                    ok = False
            if ok:
                out.append(dict(entry))
        return tuple(out)


def _same_value(a: Any, b: Any) -> bool:
    return a == b and isinstance(a, bool) == isinstance(b, bool)
