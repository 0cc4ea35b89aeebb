"""YAML with line numbers: load a document into plain Python values plus the line of every key,
and collect problems so a loader can report every error at once (file, line, key)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple  # a key path, e.g. ("axes", "mtp", 2)


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class SpecError(Exception):
    """Every problem found in one or more input files."""

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.key))
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass
class Source:
    """A loaded YAML document: its values, where each key path sits, and problems found so far."""

    file: str
    data: Any
    lines: dict[tuple, int]
    problems: list[Problem] = field(default_factory=list)

    def line(self, path: tuple) -> int:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)

    def error(self, path: tuple, message: str) -> None:
        self.problems.append(Problem(self.file, self.line(path), dotted(path), message))

    def raise_if_any(self) -> None:
        if self.problems:
            raise SpecError(self.problems)


def dotted(path: tuple) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class _Loader(yaml.SafeLoader):
    pass


def load(path: str | Path, text: str | None = None) -> Source:
    """Parse a YAML file; a syntax error becomes a SpecError naming its line."""
    name = str(path)
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError([Problem(name, 0, "", f"cannot read: {exc.strerror or exc}")]) from exc
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        raise SpecError([Problem(name, line, "", f"invalid YAML: {getattr(exc, 'problem', exc)}")]) from exc
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}
    problems: list[Problem] = []
    data = _build(node, (), lines, problems, name, loader) if node is not None else None
    source = Source(name, data, lines, problems)
    return source


def _build(node: yaml.Node, path: tuple, lines: dict, problems: list, name: str, loader: _Loader) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):
                problems.append(Problem(name, key_node.start_mark.line + 1, dotted(path), "a key must be a scalar"))
                continue
            if key in out:
                problems.append(Problem(name, key_node.start_mark.line + 1, dotted(path + (key,)), "duplicate key"))
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _build(value_node, path + (key,), lines, problems, name, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, path + (i,), lines, problems, name, loader) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)
