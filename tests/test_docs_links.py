"""Every relative link in the README, the CHANGELOG and docs/ resolves: the file (or folder) exists,
and a `#fragment` names a heading of the file it points into. The product's text names no issue or
item numbers a user cannot look up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

# Pages another change adds; a link to one is checked once it exists. Empty this when they land.
WRITTEN_ELSEWHERE: set[str] = set()

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]


def links(page: Path) -> list[tuple[int, str]]:
    out, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)   # code spans hold no links
        out += [(number, target) for target in LINK.findall(line)]
    return out


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def broken(page: Path) -> list[str]:
    problems = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(REPO)}:{number}: {target}"
        try:
            relative = resolved.relative_to(REPO).as_posix()
        except ValueError:
            problems.append(f"{where}: outside the repository")
            continue
        if not resolved.exists():
            if relative not in WRITTEN_ELSEWHERE:
                problems.append(f"{where}: no such file")
            continue
        if fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{where}: no heading #{fragment} in {relative}")
    return problems


def test_every_relative_link_resolves():
    problems = [p for page in pages() for p in broken(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_checker_sees_a_broken_link(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A page\n\n[ok](b.md#b-page) [gone](missing.md) [bad](b.md#nowhere)\n"
                               "```\n[in a fence](nowhere.md)\n```\n")
    (docs / "b.md").write_text("# B page\n")
    import tests.test_docs_links as me
    monkeypatch.setattr(me, "REPO", tmp_path)
    problems = me.broken(docs / "a.md")
    assert [p.split(": ", 1)[1] for p in problems] == ["missing.md: no such file",
                                                        "b.md#nowhere: no heading #nowhere in docs/b.md"]


ISSUE = re.compile(r"issue #?[0-9]{1,3}|\(item [0-9]+", re.IGNORECASE)


@pytest.mark.parametrize("folder", ["README.md", "docs", "matrix", "jobs", "reports", "fixtures", "benchmarks"])
def test_no_issue_or_item_numbers_in_the_product(folder):
    root = REPO / folder
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and p.suffix in
                                            (".md", ".py", ".yaml", ".yml", ".txt", ".sh", ".html", ".j2", ".service")]
    hits = [f"{p.relative_to(REPO)}:{n}: {line.strip()[:100]}" for p in files
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if ISSUE.search(line)]
    assert not hits, "issue or item numbers a user cannot look up:\n" + "\n".join(hits)


DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w/.-]+\.md")


def test_every_docs_path_named_in_code_and_text_exists():
    """Docstrings, comments, error messages and pages name docs/ pages by path: each must exist."""
    files = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "Makefile", REPO / "pyproject.toml"]
    for folder in ("docs", "matrix", "jobs", "reports", "fixtures", "benchmarks", "tests", "soakmatrix"):
        files += [p for p in (REPO / folder).rglob("*") if p.is_file()
                  and p.suffix in (".md", ".py", ".yaml", ".yml", ".txt", ".sh", ".service", ".toml")]
    missing = [f"{p.relative_to(REPO)}:{n}: {m}" for p in files
               for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
               for m in DOCS_PATH.findall(line)
               if not (REPO / m).exists() and m not in WRITTEN_ELSEWHERE and p.name not in ("CHANGELOG.md", "test_docs_links.py")]
    assert not missing, "docs/ paths that do not exist:\n" + "\n".join(missing)
