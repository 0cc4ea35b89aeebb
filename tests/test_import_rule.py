"""Imports go one way (docs/design/architecture.md): checked on the source, so a new import that breaks the
layering fails here before it becomes a cycle.

- `matrix/contracts/` (outcomes, results, flags, workloads, hang model, YAML source, durations,
  statistics) imports nothing else of ours: it is what both sides read.
- `jobs/` (one cell on one node) imports `jobs/` and the contracts, never the planner, Ray or reports.
- `reports/` imports `reports/` and the contracts: no engine code, no Ray.
- `matrix/` may import `jobs/` and `reports/`; its CLI modules never import each other.
- `fixtures/tiny_model.py` is a leaf (it imports nothing of ours) that anyone may call.
- No cycle among module-level imports.
- No cycle at all inside the flag bisection (`matrix/bisect/`): imports inside functions and under
  TYPE_CHECKING count too, so that each module can be read after the ones it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("matrix", "jobs", "reports", "fixtures", "soakmatrix/api")
LEAVES = ("fixtures.tiny_model",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    parts = parts[1:] if parts[0] == "soakmatrix" else parts   # the API: soakmatrix.api.* -> api.*
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in FOLDERS for p in (REPO / folder).rglob("*.py")
            if "__pycache__" not in p.parts}


def imports_of(path: Path, known: set[str], top_level_only: bool = False) -> set[str]:
    """Our modules (without the `soakmatrix.` prefix) and third-party roots that `path` imports."""
    tree = ast.parse(path.read_text())
    name = module_name(path)
    package = name if is_package(path) else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name.removeprefix("soakmatrix.") if alias.name.startswith("soakmatrix.")
                          else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("soakmatrix."):
                target = node.module.removeprefix("soakmatrix.")
            else:
                found.add((node.module or "").split(".")[0])
                continue
            found.add(target)
            for alias in node.names:   # `from pkg import module`
                if f"{target}.{alias.name}" in known:
                    found.add(f"{target}.{alias.name}")
    return found - {name}


def ours(names: set[str], known: set[str]) -> set[str]:
    return {n for n in names if n in known}


def allowed(importer: str, imported: str) -> bool:
    def within(mod: str, *prefixes: str) -> bool:
        return any(mod == p or mod.startswith(p + ".") for p in prefixes)

    if imported in LEAVES or within(imported, "matrix.contracts"):
        return not within(importer, "matrix.contracts") or within(imported, "matrix.contracts")
    if within(importer, "matrix.contracts") or imported == "matrix.contracts":
        return False
    if within(importer, "jobs"):
        return within(imported, "jobs")
    if within(importer, "reports"):
        return within(imported, "reports")
    if within(importer, "api"):     # the Python API: over the core, under the CLI
        return within(imported, "api", "matrix", "jobs", "reports", "fixtures.sim_testing")
    if within(imported, "api"):
        return within(importer, "matrix.cli", "fixtures")
    if within(importer, "matrix"):
        return within(imported, "matrix", "jobs", "reports")
    return True   # fixtures: the plugins users install may use every part


def test_imports_follow_the_layering():
    known = set(modules())
    wrong = sorted(f"{importer} imports {imported}"
                   for importer, path in modules().items()
                   for imported in ours(imports_of(path, known), known)
                   if not allowed(importer, imported))
    assert not wrong, "imports against the layering (docs/design/architecture.md):\n" + "\n".join(wrong)


def test_ray_stays_out_of_jobs_reports_and_contracts():
    offenders = sorted(name for name, path in modules().items()
                       if name.startswith(("jobs", "reports", "matrix.contracts"))
                       and "ray" in imports_of(path, set(modules())))
    assert not offenders


def test_cli_modules_never_import_each_other():
    known = set(modules())
    commands = {n for n in known if n.startswith("matrix.cli.") and n != "matrix.cli.__main__"}
    wrong = sorted(f"{n} imports {m}" for n in commands
                   for m in ours(imports_of(modules()[n], known), known) if m in commands or m == "matrix.cli")
    assert not wrong, "shared command code belongs in matrix/run.py or its subsystem:\n" + "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    cycles, index, low, stack, on_stack, counter = [], {}, {}, [], set(), [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _graph(known: set[str], names: dict[str, Path], top_level_only: bool) -> dict[str, set[str]]:
    graph = {n: {m for m in ours(imports_of(p, known, top_level_only=top_level_only), known) if m in names}
             for n, p in names.items()}
    # a package's own __init__ importing its submodules is how packages re-export; not a cycle
    for n in graph:
        graph[n] = {m for m in graph[n] if not m.startswith(n + ".")}
    return graph


def test_no_cycle_among_module_level_imports():
    known = set(modules())
    cycles = _cycles(_graph(known, modules(), top_level_only=True))
    assert not cycles, f"import cycles: {cycles}"


PACKAGES_WITHOUT_ANY_CYCLE = ("matrix.bisect",)


def test_no_cycle_at_all_inside_the_flag_bisection():
    known = set(modules())
    for package in PACKAGES_WITHOUT_ANY_CYCLE:
        names = {n: p for n, p in modules().items() if n.startswith(package + ".")}
        cycles = _cycles(_graph(known, names, top_level_only=False))
        assert not cycles, f"import cycles in {package} (function-level and TYPE_CHECKING imports count): {cycles}"


def test_the_cycle_check_sees_an_import_inside_a_function_or_under_type_checking():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .x import X\n"
                     "def f():\n    from .y import g\n")
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {"x", "y"} <= found


def test_the_rule_itself_catches_a_wrong_import():
    assert not allowed("jobs.soak", "matrix.plan")
    assert not allowed("reports.junit", "jobs.soak")
    assert not allowed("matrix.contracts.flags", "matrix.spec")
    assert allowed("matrix.schedule", "jobs.soak") and allowed("jobs.soak", "matrix.contracts.outcomes")
