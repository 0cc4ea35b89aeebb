"""YAML with line numbers and limits: load a document into plain Python values plus the line of every
key, and collect problems so a loader can report every error at once (file, line, key).

Every input file (matrix, hang model) comes through here, and input may be hostile or broken: a
file is read only up to `Limits.max_bytes`, must be UTF-8 without NUL bytes, may nest only so deep,
may expand aliases only to so many values (an alias bomb is refused, not built), and may not hold
scalars past a length, Python-object tags, numbers Python cannot hold or NaN/infinity. Merge keys
(`<<: *defaults`) are supported, with explicit keys overriding merged ones as YAML 1.1 says.
Each refusal is a `Problem` with its line, never a traceback.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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


@dataclass(frozen=True)
class Limits:
    """What a configuration file may hold. Far above any real matrix or hang model (a nightly matrix is
    a few KB, nests 5 deep, holds hundreds of values), far below what hurts a CI runner."""

    max_bytes: int = 1 << 20
    max_depth: int = 40
    max_values: int = 100_000  # after alias expansion
    max_scalar_chars: int = 65_536


LIMITS = Limits()

MERGE_TAG = "tag:yaml.org,2002:merge"
PLAIN_TAGS = {
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq", "merge", "timestamp")
}


class _Loader(yaml.SafeLoader):
    pass


class _TooMuch(Exception):
    """A limit was reached while building: stop building, report once."""

    def __init__(self, line: int, key: str, message: str):
        super().__init__(message)
        self.line, self.key, self.message = line, key, message


def read_text(path: str | Path, limits: Limits = LIMITS, what: str = "") -> str:
    """A file's text, read at most `limits.max_bytes` + 1 bytes (so `/dev/zero` or a huge file cannot
    exhaust memory), decoded as UTF-8. Problems raise SpecError naming the file and line."""
    name = str(path)
    try:
        # non-blocking: a FIFO's open would wait for a writer for ever; only a regular file is read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SpecError([Problem(name, 0, "", f"cannot read: {exc.strerror or exc}")]) from exc
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(mode)
                else "a FIFO (a named pipe)"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file"
            )
            raise SpecError([Problem(name, 0, "", f"{kind}, not a {what or 'file'}")])
        try:
            raw = handle.read(limits.max_bytes + 1)
        except OSError as exc:
            raise SpecError([Problem(name, 0, "", f"cannot read: {exc.strerror or exc}")]) from exc
    if len(raw) > limits.max_bytes:
        raise SpecError(
            [
                Problem(
                    name,
                    0,
                    "",
                    f"{what or 'file'} larger than {limits.max_bytes // 1024} KiB: not a configuration file?",
                )
            ]
        )
    return decode(name, raw)


def decode(name: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpecError(
            [Problem(name, line, "", f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})")]
        ) from exc


def load(path: str | Path, text: str | None = None, limits: Limits = LIMITS) -> Source:
    """Parse a YAML file within `limits`; a syntax error or a refused construct becomes a SpecError
    naming its line."""
    name = str(path)
    if text is None:
        text = read_text(path, limits)
    elif len(text) > limits.max_bytes:
        raise SpecError([Problem(name, 0, "", f"larger than {limits.max_bytes // 1024} KiB")])
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise SpecError([Problem(name, line, "", "a NUL byte: not a text file")])
    _check_nesting(name, text, limits)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_problem(name, exc, text)]) from exc
    except RecursionError as exc:  # _check_nesting bounds depth; this is a second fence
        raise SpecError([Problem(name, 0, "", "nested too deeply")]) from exc
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}
    problems: list[Problem] = []
    data = None
    if node is not None:
        builder = _Builder(name, loader, lines, problems, limits)
        try:
            data = builder.build(node, (), 0)
        except _TooMuch as exc:
            problems.append(Problem(name, exc.line, exc.key, exc.message))
            data = None
    return Source(name, data, lines, problems)


class _Mark(Protocol):  # PyYAML's Mark, or its C extension's
    @property
    def line(self) -> int: ...


def _line(mark: _Mark | None) -> int:
    """The 1-based line of a YAML mark; 0 for none (events and errors may carry none)."""
    return mark.line + 1 if mark is not None else 0


def _yaml_problem(name: str, exc: yaml.YAMLError, text: str = "") -> Problem:
    line = _line(getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None))
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        return Problem(name, line, "", f"not YAML text: {exc.reason} (character {exc.character!r})")
    return Problem(name, line, "", f"invalid YAML: {getattr(exc, 'problem', None) or exc}")


def _check_nesting(name: str, text: str, limits: Limits) -> None:
    """Walk the parser's events (an iterative state machine, unlike the recursive composer) and
    refuse deep nesting and huge scalars before anything recursive sees the document."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > limits.max_depth:
                    raise SpecError(
                        [Problem(name, _line(event.start_mark), "", f"nested more than {limits.max_depth} levels deep")]
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, yaml.ScalarEvent) and len(event.value) > limits.max_scalar_chars:
                raise SpecError(
                    [
                        Problem(
                            name,
                            _line(event.start_mark),
                            "",
                            f"a value longer than {limits.max_scalar_chars} characters",
                        )
                    ]
                )
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_problem(name, exc, text)]) from exc


class _Builder:
    """Node graph -> plain values, expanding aliases within a budget and recording each key's line."""

    def __init__(self, name: str, loader: _Loader, lines: dict, problems: list, limits: Limits):
        self.name, self.loader, self.lines, self.problems, self.limits = name, loader, lines, problems, limits
        self.values = 0

    def problem(self, node: yaml.Node, path: tuple, message: str) -> None:
        self.problems.append(Problem(self.name, node.start_mark.line + 1, dotted(path), message))

    def build(self, node: yaml.Node, path: tuple, depth: int) -> Any:
        self.values += 1
        if self.values > self.limits.max_values:
            raise _TooMuch(
                node.start_mark.line + 1,
                dotted(path[:1]),
                f"more than {self.limits.max_values} values once aliases are expanded (an alias bomb?)",
            )
        if depth > self.limits.max_depth:  # an alias may nest a document inside itself
            raise _TooMuch(
                node.start_mark.line + 1,
                dotted(path[:4]) + "...",
                f"nested more than {self.limits.max_depth} levels deep (through aliases)",
            )
        self.lines.setdefault(path, node.start_mark.line + 1)
        if node.tag not in PLAIN_TAGS:
            self.problem(node, path, f"tag {node.tag!r} is not allowed (plain YAML values only)")
            return None
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _scalar(self, node: yaml.Node, path: tuple) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except ValueError:  # an integer past Python's 4300-digit limit, a malformed timestamp
            self.problem(
                node,
                path,
                f"cannot read {node.value[:40]!r}{'...' if len(node.value) > 40 else ''}: "
                "not a number or date Python can hold",
            )
            return None
        except yaml.YAMLError as exc:
            self.problem(node, path, f"cannot read {node.value[:40]!r}: {getattr(exc, 'problem', None) or exc}")
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(node, path, f"{node.value!r} is not a finite number")
            return None
        if isinstance(value, (bytes, set)):
            self.problem(node, path, f"a {type(value).__name__} value is not allowed here")
            return None
        return value

    def _mapping(self, node: yaml.MappingNode, path: tuple, depth: int) -> dict:
        merged: dict[Any, Any] = {}
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                self._merge(value_node, path, depth, merged)
                continue
            key = self._key(key_node, path)
            if key is _NO_KEY:
                continue
            if key in out:
                self.problem(key_node, path + (key,), "duplicate key")
            self.lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = self.build(value_node, path + (key,), depth + 1)
        return {**merged, **out}

    def _merge(self, value_node: yaml.Node, path: tuple, depth: int, merged: dict) -> None:
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                self.problem(source, path + ("<<",), "a merge key (<<) takes a mapping or a list of mappings")
                continue
            values = self._mapping(source, path, depth + 1)
            for key, value in values.items():
                merged.setdefault(key, value)  # YAML 1.1: earlier sources take precedence

    def _key(self, key_node: yaml.Node, path: tuple) -> Any:
        if not isinstance(key_node, yaml.ScalarNode):
            self.problem(key_node, path, "a key must be a scalar")
            return _NO_KEY
        key = self._scalar(key_node, path)
        if key is None and key_node.value not in ("", "~", "null", "Null", "NULL"):
            return _NO_KEY
        return key


_NO_KEY = object()
