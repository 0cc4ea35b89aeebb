"""The command reference (docs/reference/cli.md), written from the real argument parsers.

`python -m soakmatrix.matrix.cli_reference` (or `make docs`) rewrites the file; `--check` exits 1
when the file differs from what the parsers say. tests/test_docs_reference.py runs the same
comparison, so an option added, renamed or reworded without regenerating the page fails the suite.
The text depends on nothing but the parsers: a fixed width, no terminal size, no machine's values.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from soakmatrix.matrix import cli

DEFAULT_PATH = Path("docs/reference/cli.md")
REGENERATE = "make docs  (or: .venv/bin/python -m soakmatrix.matrix.cli_reference)"
WIDTH = 100

HEADER = f"""# Command reference

<!-- Generated from the argument parsers by `{REGENERATE}`.
     Do not edit by hand: tests/test_docs_reference.py fails when this file is stale. -->

Every subcommand and option of `soakmatrix`, as its parser defines it. What each command is for,
with examples, is in the [guide](../index.md); the exit codes are in [exit codes](exit-codes.md).
Each value is checked before any work starts: a value outside the range shown is exit 2 naming the
option.
"""


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser `soakmatrix NAME` builds (the dispatcher in matrix/cli/__init__.py does the same)."""
    module = importlib.import_module(cli.COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"soakmatrix {name}", description=module.HELP)
    module.configure(parser)
    return parser


def _metavar(action: argparse.Action) -> str:
    """An argument's placeholder; argparse also takes a tuple (one name per value)."""
    metavar = action.metavar or action.dest.upper()
    return " ".join(metavar) if isinstance(metavar, tuple) else metavar


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage line, built here rather than by argparse, whose layout differs between Pythons."""
    if parser.usage:
        return parser.usage.strip()
    parts: list[str] = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.help is argparse.SUPPRESS:
            continue
        if not action.option_strings:
            metavar = _metavar(action)
            parts.append(f"[{metavar}]" if action.nargs == "?" else metavar)
            continue
        option = action.option_strings[-1] if len(action.option_strings[-1]) > 2 else action.option_strings[0]
        if action.nargs == 0:
            text = option
        else:
            metavar = "{" + ",".join(map(str, action.choices)) + "}" if action.choices is not None else _metavar(action)
            text = f"{option} {metavar}" + (f" [{metavar} ...]" if action.nargs in ("+", "*") else "")
        parts.append(text if action.required else f"[{text}]")
    lines, line = [], parser.prog
    indent = " " * (len(parser.prog) + 1)
    for part in parts:
        if len(line) + 1 + len(part) > WIDTH and line.strip():
            lines.append(line)
            line = indent + part
        else:
            line += " " + part
    return "\n".join([*lines, line])


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _prose(text: str) -> str:
    """Help text in a table cell: `<out>` would read as an HTML tag."""
    return _cell(text).replace("<", "&lt;").replace(">", "&gt;")


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if action.choices is not None:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    range_text = getattr(action.type, "range_text", "")
    kind = getattr(action.type, "kind", "")
    text = f"`{metavar}`"
    if kind and kind not in ("text",):
        text += f" ({kind}{': ' + range_text if range_text else ''})"
    if action.nargs in ("*", "+", argparse.REMAINDER):
        text += ", repeatable" if action.option_strings else ", any number"
    elif isinstance(action, argparse._AppendAction):
        text += ", repeatable"
    return _cell(text)


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == 0 or default == []:
        return ""
    return _cell(f"`{default}`")


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help is argparse.SUPPRESS:
        return ""
    formatter = parser._get_formatter()
    return _prose(formatter._expand_help(action))


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | value | default | what |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.help is argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest.upper()}`"
        rows.append(f"| {name} | {_value(action)} | {_default(action)} | {_help(parser, action)} |")
    return rows


def render() -> str:
    """The whole page, as the parsers define it now."""
    out = [HEADER]
    out.append("## soakmatrix\n")
    out.append("```\nsoakmatrix [--version] COMMAND [options]\n```\n")
    out.append("| command | what |\n|---|---|")
    out.extend(f"| [`{name}`](#soakmatrix-{name}) | {_cell(text)} |" for name, (_, text) in cli.COMMANDS.items())
    out.append("")
    for name in cli.COMMANDS:
        parser = command_parser(name)
        out.append(f"## soakmatrix {name}\n")
        out.append(_prose(parser.description or "") + "\n")
        out.append(f"```\n{_usage(parser)}\n```\n")
        if name in cli.NEEDS:
            extras = ", ".join(f"`[{e}]`" for e in cli.NEEDS[name])
            out.append(f"Needs the extras {extras} (`pip install 'soakmatrix[all]'`).\n")
        if not parser.usage:
            # sim-engine parses vLLM's argv itself (its own usage): its options are its epilog
            out.extend(_options_table(parser))
            out.append("")
        if parser.epilog:
            out.append("```\n" + parser.epilog.strip("\n") + "\n```\n")
    return "\n".join(out).rstrip("\n") + "\n"


def stale_message(path: Path | str = DEFAULT_PATH) -> str:
    return f"{path} is stale: run `{REGENERATE}` and commit the result"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m soakmatrix.matrix.cli_reference", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_PATH, help="the page to write (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.is_file() else ""
        if current != text:
            print(stale_message(args.out), file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
