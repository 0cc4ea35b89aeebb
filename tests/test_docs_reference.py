"""docs/reference/cli.md is what the argument parsers say: regenerated in memory and compared.

An option added, renamed or reworded without `make docs` fails here, with the command to run."""

from __future__ import annotations

import difflib

from soakmatrix.matrix import cli_reference as reference

from tests.conftest import REPO

PAGE = REPO / "docs" / "reference" / "cli.md"


def test_cli_reference_is_current():
    expected = reference.render()
    current = PAGE.read_text() if PAGE.is_file() else ""
    if current != expected:
        diff = "".join(list(difflib.unified_diff(current.splitlines(True), expected.splitlines(True),
                                                 "docs/reference/cli.md", "from the parsers"))[:40])
        raise AssertionError(f"{reference.stale_message('docs/reference/cli.md')}\n{diff}")


def test_every_command_and_option_is_in_the_reference():
    text = reference.render()
    for name in reference.cli.COMMANDS:
        assert f"## soakmatrix {name}\n" in text
        parser = reference.command_parser(name)
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in text or option in text, (name, option)


def test_check_mode_says_stale(tmp_path, capsys):
    page = tmp_path / "cli.md"
    page.write_text("old\n")
    assert reference.main(["--out", str(page), "--check"]) == 1
    assert "is stale: run `make docs" in capsys.readouterr().err
    assert reference.main(["--out", str(page)]) == 0
    assert reference.main(["--out", str(page), "--check"]) == 0


def test_the_store_schema_in_the_reference_is_the_real_one(tmp_path):
    """docs/reference/outputs.md shows every table, column and index a fresh history store has."""
    import sqlite3

    from soakmatrix.reports.history import HistoryStore
    from soakmatrix.reports.history_schema import SCHEMA_VERSION

    with HistoryStore(tmp_path / "store.sqlite") as _:
        pass
    page = (REPO / "docs" / "reference" / "outputs.md").read_text()
    schema = page[page.index("```sql"):]
    schema = schema[:schema.index("```\n", 6)]
    db = sqlite3.connect(tmp_path / "store.sqlite")
    missing = []
    for kind, name in db.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"):
        if f"CREATE {kind.upper()} {name} " not in schema and f"CREATE {kind.upper()} {name}(" not in schema:
            missing.append(f"{kind} {name}")
        if kind == "table":
            for column in db.execute(f"PRAGMA table_info({name})"):
                if f"\n    {column[1]} " not in schema:
                    missing.append(f"column {name}.{column[1]}")
    assert not missing, f"docs/reference/outputs.md lacks what a fresh store has: {missing}"
    assert f"(now {SCHEMA_VERSION})" in page, "docs/reference/outputs.md names another schema version"


def first_block(page: str, language: str, after: str = "") -> str:
    text = (REPO / "docs" / "reference" / page).read_text()
    start = text.index(f"```{language}\n", text.index(after)) + len(language) + 4
    return text[start:text.index("```", start)]


def test_the_reference_examples_load():
    """The examples of the file formats are accepted by the loaders they document."""
    from soakmatrix.matrix.build_bisect.specs import parse_builds_text
    from soakmatrix.matrix.contracts.hangmodel import load_hang_model
    from soakmatrix.matrix.spec import load_matrix

    model = load_hang_model("hang-model.md", text=first_block("hang-model.md", "yaml"))
    assert [h.id for h in model.hangs] == ["mtp-cudagraph", "regression"]
    matrix = load_matrix("matrix-yaml.md", text=first_block("matrix-yaml.md", "yaml"))
    assert matrix.name == "nightly" and "block_size" in matrix.registry
    builds = parse_builds_text(first_block("builds.md", "", after="## The builds list"), "builds.md")
    assert [b.kind for b in builds] == ["pip", "pip", "pip", "image", "python", "pip"]


def test_every_junit_property_is_in_the_reference():
    """Each test-case property reports/junit.py and reports/regressions.py write is documented."""
    import re

    written = set()
    for name in ("junit.py", "regressions.py"):
        source = (REPO / "reports" / name).read_text()
        written |= set(re.findall(r'props\["([\w.]+)"\]', source))
        written |= set(re.findall(r'"((?:regression|known_issue)[\w.]*)":', source))
    page = (REPO / "docs" / "reference" / "outputs.md").read_text()
    section = page[page.index("Test-case properties:"):page.index("## The probe journal")]
    documented = set(re.findall(r"`([\w.]+)`", section)) | {f"known_issue{k}" for k in re.findall(r"`(\.\w+)`", section)}
    missing = sorted(p for p in written if p not in documented)
    assert not missing, f"docs/reference/outputs.md lacks the JUnit properties {missing}"
