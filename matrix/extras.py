"""The optional parts of soakmatrix: which extra brings which imports, and the error that names it.

`pip install soakmatrix` is the light core (`watch`, `plan`, `sim-engine`, the pytest plugin); Ray,
the dashboard and bisection's statistics come with extras (docs/guide/install.md). A command that needs an
extra checks for it before it starts any work, so a missing one is a line saying what to install,
never a traceback hours into a run:

    soakmatrix run needs Ray, plotly, jinja2 and scipy: pip install 'soakmatrix[ray,reports]'

The check finds modules without importing them (`importlib.util.find_spec`), so asking costs nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    name: str  # as in `pip install 'soakmatrix[NAME]'` and pyproject's optional-dependencies
    modules: tuple[str, ...]  # top-level imports it brings (also the distributions' names here)
    labels: tuple[str, ...]  # how a message names them


EXTRAS: dict[str, Extra] = {
    e.name: e
    for e in (
        Extra("ray", ("ray",), ("Ray",)),
        Extra("reports", ("plotly", "jinja2", "scipy"), ("plotly", "jinja2", "scipy")),
        Extra("bisect", ("scipy", "numpy"), ("scipy", "numpy")),
    )
}


class MissingExtra(Exception):
    """Modules of one or more extras are not installed; `line(command)` is what a user reads."""

    def __init__(self, extras: Sequence[str], labels: Sequence[str]):
        self.extras = tuple(extras)
        self.labels = tuple(labels)
        super().__init__(self.line("this"))

    def line(self, for_what: str) -> str:
        return f"{for_what} needs {_and(self.labels)}: {install_hint(self.extras)}"


def install_hint(extras: Iterable[str]) -> str:
    return f"pip install 'soakmatrix[{','.join(extras)}]'"


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed install counts as missing
        return False


def missing(extras: Iterable[str], present: Callable[[str], bool] = installed) -> MissingExtra | None:
    """What of `extras` is not installed, as the error to raise; None when everything is there."""
    names: list[str] = []
    labels: list[str] = []
    for name in extras:
        extra = EXTRAS[name]
        absent = [label for module, label in zip(extra.modules, extra.labels, strict=True) if not present(module)]
        if absent:
            names.append(name)
            labels.extend(label for label in absent if label not in labels)
    return MissingExtra(names, labels) if names else None


def require(*extras: str, present: Callable[[str], bool] = installed) -> None:
    """Raise MissingExtra unless every module of `extras` is installed."""
    problem = missing(extras, present)
    if problem is not None:
        raise problem


def from_import_error(
    exc: ImportError, among: Sequence[str] = (), present: Callable[[str], bool] = installed
) -> MissingExtra | None:
    """The extra whose module an ImportError says is missing (an import not guarded by `require`),
    naming every module of it that is absent; `among`, the command's extras, first (scipy is in two)."""
    root = (getattr(exc, "name", None) or "").split(".")[0]
    for extra in [*(EXTRAS[n] for n in among), *EXTRAS.values()]:
        if root in extra.modules:
            label = extra.labels[extra.modules.index(root)]
            return missing([extra.name], lambda m: m != root and present(m)) or MissingExtra([extra.name], [label])
    return None


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
