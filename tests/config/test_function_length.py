"""The recipe shape holds: no function in the package runs past a screen, so a run and
each of its builders read top to bottom (issue 21's rule, kept by this test)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The longest a function may be, decorators and docstring included.
MOST_LINES = 60


def test_no_function_is_longer_than_a_screen() -> None:
    files = [*ROOT.glob("art_hydra/**/*.py"), *ROOT.glob("hydra_plugins/**/*.py")]
    assert files
    longer = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MOST_LINES:
                    longer.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not longer, "split these into named steps:\n" + "\n".join(longer)
