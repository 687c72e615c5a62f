"""The package's import graph: no cycles, every import points down a floor (the rooms of
DESIGN.md's layout), and the config layer never imports the Hydra plugin or the engine."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    """Module -> project modules it imports, at module level or inside functions."""
    files = [*ROOT.glob("art_hydra/**/*.py"), *ROOT.glob("hydra_plugins/**/*.py")]
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import sub` depends on the submodule; `from mod import x` on mod.
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], dict.fromkeys(graph, 0), []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in graph[node]:
            if state[dep] == 1:
                found.append([*stack[stack.index(dep) :], dep])
            elif state[dep] == 0:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in graph:
        if state[node] == 0:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


#: The floor every layer may stand on: standard library only, importing nothing of
#: art_hydra outside this set (where code is imported from, paths and JSON read within
#: bounds).
FOUNDATION = frozenset(
    {"art_hydra.import_path", "art_hydra.moved", "art_hydra.safe_paths", "art_hydra.safe_json"}
)


def test_the_foundation_modules_stand_on_nothing_else() -> None:
    graph = _graph()
    for module in FOUNDATION:
        assert graph[module] <= FOUNDATION, f"{module} imports {graph[module] - FOUNDATION}"


def test_the_config_layer_imports_neither_the_plugin_nor_the_engine() -> None:
    graph = _graph()
    for module, deps in graph.items():
        if module.startswith("art_hydra.config"):
            bad = {d for d in deps if not d.startswith("art_hydra.config")} - FOUNDATION
            assert not bad, f"{module} imports {bad}"


#: The floors, lowest first: a module imports only from its own floor or those below.
#: A package name covers its submodules; a set names single modules.
FLOORS: tuple[str | frozenset[str], ...] = (
    FOUNDATION | {"art_hydra.errors", "art_hydra.workers"},
    "art_hydra.config",
    # Files read as data: model folders, their tokenizers, the chat templates.
    frozenset({"art_hydra.model_files", "art_hydra.folder_tokenizer", "art_hydra.templates"}),
    "art_hydra.tasks",
    "art_hydra.runs",
    "art_hydra.trackers",
    "art_hydra.engine",
    "art_hydra.preflight",
    frozenset({"art_hydra.run"}),
    "art_hydra.sweeps",
    "art_hydra.commands",
    frozenset({"art_hydra", "art_hydra.__main__"}),
    "hydra_plugins",
)


def _floor(module: str) -> int:
    for number, floor in enumerate(FLOORS):
        if isinstance(floor, frozenset):
            if module in floor:
                return number
        elif module == floor or module.startswith(floor + "."):
            return number
    raise AssertionError(f"{module} stands on no floor: add it to FLOORS (or a room of it)")


def test_every_import_points_down_a_floor() -> None:
    """A room may use the rooms below it, never one above: the engine never imports a
    command, the run records never import the engine, the pre-flight never the sweeps."""
    upward = [
        f"{module} -> {dep}"
        for module, deps in sorted(_graph().items())
        for dep in sorted(deps)
        if _floor(dep) > _floor(module)
    ]
    assert upward == []


def test_the_top_level_keeps_few_modules() -> None:
    """The flat top level is what issue 33 ended: a new module goes into its room."""
    top = sorted(p.stem for p in (ROOT / "art_hydra").glob("*.py"))
    assert len(top) <= 12, top
