"""Field documentation read from the schema's source comments.

Each schema field carries a one-line comment above it. Reports quote that comment
when a mandatory value is missing or a key is misspelt, so the user sees what the
field means without opening the code; the tests use it to check that no field goes
undocumented. Parsing happens only on those paths, never on a valid run.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Map each field of dataclass ``cls`` to the comment line just above it ('' if none)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    docs: dict[str, str] = {}
    class_def = ast.parse(source).body[0]
    assert isinstance(class_def, ast.ClassDef)
    for stmt in class_def.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            above = lines[stmt.lineno - 2].strip() if stmt.lineno >= 2 else ""
            docs[stmt.target.id] = above[1:].strip() if above.startswith("#") else ""
    return docs


def field_doc(cls: type, name: str) -> str:
    """The comment documenting field ``name`` of dataclass ``cls``, or ''."""
    if not dataclasses.is_dataclass(cls):
        return ""
    return field_docs(cls).get(name, "")
