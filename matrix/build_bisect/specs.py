"""Where `soakmatrix bisect --builds FILE|GOOD..BAD` gets its ordered list of builds.

* **A builds file**: one build per line, oldest (the good one) first, the bad one last; blank lines
  and `#` comments are skipped. A line is a build spec (a pip requirement such as `vllm==0.6.3`,
  a wheel path or URL, `vllm @ git+https://...@SHA`, `image:REF` for a container image,
  `python:/path/to/python` for an interpreter already on the nodes), optionally named:
  `NAME: SPEC` (NAME without spaces; a pip requirement never holds ": ").
* **GOOD..BAD**: two commits; the commits between them come from a `rev_list(good, bad)` function
  (the user's checkout runs `git rev-list --reverse --first-parent GOOD..BAD`: `git_rev_list`
  makes one), and each commit becomes a spec through a user template holding `{sha}`, e.g.
  `vllm @ git+https://github.com/vllm-project/vllm@{sha}`. Builds are named by their short SHA.

Everything here but `git_rev_list` is pure.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from soakmatrix.matrix.contracts.yamlsrc import SpecError, read_text

RANGE = re.compile(r"^\s*([^.\s]+)\.\.([^.\s]+)\s*$")
NAMED = re.compile(r"^(?P<name>[^\s:]+):\s+(?P<spec>\S.*)$")
SHORT_SHA = 12


class BuildSpecError(ValueError):
    """A builds file or range that cannot be read (the CLI's exit 2)."""


@dataclass(frozen=True)
class BuildSpec:
    name: str
    spec: str

    @property
    def kind(self) -> str:
        """pip | image | python: which runtime_env field the spec goes to."""
        if self.spec.startswith("image:"):
            return "image"
        if self.spec.startswith("python:"):
            return "python"
        return "pip"

    @property
    def value(self) -> str:
        return self.spec.split(":", 1)[1] if self.kind != "pip" else self.spec


def parse_builds_text(text: str, source: str = "builds file") -> list[BuildSpec]:
    out: list[BuildSpec] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        named = NAMED.match(line)
        if named and not line.startswith(("image:", "python:")):
            spec = BuildSpec(named["name"], named["spec"].strip())
        else:
            spec = BuildSpec(line, line)
        if spec.kind != "pip" and not spec.value.strip():
            raise BuildSpecError(f"{source}:{number}: {spec.kind} build without a value")
        out.append(spec)
    _check(out, source)
    return out


def parse_builds_file(path: str | Path) -> list[BuildSpec]:
    try:  # within the limits of every input file: a FIFO, /dev/zero or a huge file is refused
        text = read_text(path, what="builds file")
    except SpecError as e:
        raise BuildSpecError(f"the builds file: {e}") from e
    return parse_builds_text(text, str(path))


def parse_range(arg: str) -> tuple[str, str] | None:
    """`GOOD..BAD` as (good, bad), or None when `arg` is not a range (then it names a file)."""
    m = RANGE.match(arg)
    return (m[1], m[2]) if m else None


def builds_from_range(
    good: str, bad: str, template: str, rev_list: Callable[[str, str], Sequence[str]]
) -> list[BuildSpec]:
    """The good commit, then every commit of `rev_list(good, bad)` (oldest first, ending at bad),
    each turned into a build spec by `template`."""
    if "{sha}" not in template:
        raise BuildSpecError(f"the build template must hold {{sha}}, got {template!r}")
    commits = [c.strip() for c in rev_list(good, bad) if c.strip()]
    if not commits:
        raise BuildSpecError(f"no commits between {good} and {bad}: is {good} an ancestor of {bad}?")
    if not _same_commit(commits[-1], bad):
        raise BuildSpecError(f"the commits of {good}..{bad} do not end at {bad} (got {commits[-1]})")
    out = [BuildSpec(sha[:SHORT_SHA], template.format(sha=sha)) for sha in [good, *commits]]
    _check(out, f"{good}..{bad}")
    return out


def resolve_builds(
    arg: str, template: str | None = None, rev_list: Callable[[str, str], Sequence[str]] | None = None
) -> list[BuildSpec]:
    """`--builds FILE|GOOD..BAD`: a range when it looks like one and no such file exists."""
    rng = parse_range(arg)
    if rng is None or Path(arg).exists():
        return parse_builds_file(arg)
    if template is None or rev_list is None:
        raise BuildSpecError(
            f"{arg} is a commit range: it needs a build template with {{sha}} "
            "(e.g. 'vllm @ git+https://github.com/vllm-project/vllm@{sha}') and a checkout"
        )
    return builds_from_range(*rng, template, rev_list)


def git_rev_list(checkout: str | Path) -> Callable[[str, str], list[str]]:
    """`rev_list` over a local git checkout: first-parent commits of GOOD..BAD, oldest first."""

    def run(good: str, bad: str) -> list[str]:
        try:
            done = subprocess.run(
                ["git", "-C", str(checkout), "rev-list", "--reverse", "--first-parent", f"{good}..{bad}"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            )
            full_bad = subprocess.run(
                ["git", "-C", str(checkout), "rev-parse", bad], capture_output=True, text=True, check=True, timeout=60
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            raise BuildSpecError(f"git rev-list {good}..{bad} in {checkout} failed: {detail.strip()}") from e
        commits = done.stdout.split()
        return commits[:-1] + [full_bad] if commits else commits

    return run


def _same_commit(a: str, b: str) -> bool:
    n = min(len(a), len(b))
    return n >= 4 and a[:n].lower() == b[:n].lower()


def _check(builds: list[BuildSpec], source: str) -> None:
    if len(builds) < 2:
        raise BuildSpecError(
            f"{source}: need at least two builds (the good one first, the bad one last), got {len(builds)}"
        )
    seen: dict[str, int] = {}
    for i, b in enumerate(builds):
        if b.name in seen:
            raise BuildSpecError(
                f"{source}: build {b.name!r} is listed twice (positions {seen[b.name] + 1} and {i + 1})"
            )
        seen[b.name] = i
