"""Each config key declared once, on its schema field.

A field of :mod:`art_hydra.config.schema`, declared with
:func:`~art_hydra.config.bounds.setting` or :func:`~art_hydra.config.bounds.section`,
states everything the project says about its key in its metadata: the help text
(``help=``), its single-field limits (the :class:`~art_hydra.config.bounds.Bound`),
whether a resume may change it (``resume="may_change"``; fixed otherwise) and, for keys
added after run folders were first written, the value that reproduces runs saved before
it existed (``legacy=``). Reports, the documentation's key table (docs/config-keys.md),
the resume comparison and the legacy fill all read it from here, so a new key is
documented, bounded and classified where it is defined.

Pure functions over dataclasses: no torch, on the compose path.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from omegaconf import MISSING

from art_hydra.config.bounds import (
    FIXED,
    MAY_CHANGE,
    NO_LEGACY,
    RESUME_RULES,
    Bound,
    describe,
    schema_default,
    type_hints,
)
from art_hydra.config.schema import RunConfig

__all__ = [
    "FIXED",
    "MAY_CHANGE",
    "NO_LEGACY",
    "RESUME_RULES",
    "FieldInfo",
    "default",
    "field_info",
    "help_of",
    "info_of",
    "key_help_text",
    "key_table_markdown",
    "leaves",
    "legacy_values",
    "may_change",
    "may_change_keys",
]


@dataclass(frozen=True)
class FieldInfo:
    """What the schema says about one key."""

    help: str
    bound: Bound | None
    #: ``fixed`` or ``may_change`` (on resume).
    resume: str
    #: The value that reproduces runs saved before the key existed, or :data:`NO_LEGACY`.
    legacy: Any

    @property
    def has_legacy(self) -> bool:
        return self.legacy is not NO_LEGACY


def _field(cls: type, name: str) -> dataclasses.Field[Any]:
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def field_info(cls: type, name: str) -> FieldInfo:
    """The metadata of field ``name`` of schema dataclass ``cls``."""
    meta = _field(cls, name).metadata
    return FieldInfo(
        help=meta.get("help", ""),
        bound=meta.get("bound"),
        resume=meta.get("resume", FIXED),
        legacy=meta.get("legacy", NO_LEGACY),
    )


def help_of(cls: type, name: str) -> str:
    """The full help text of field ``name`` of dataclass ``cls`` ('' if it has none)."""
    if not dataclasses.is_dataclass(cls):
        return ""
    try:
        return field_info(cls, name).help
    except KeyError:
        return ""


def _root() -> type:
    return RunConfig


def default(key: str) -> Any:
    """The schema's default for the dotted ``key`` (what a fix that restores it sets)."""
    return schema_default(_root(), key)


def leaves(cls: type | None = None, prefix: str = "") -> Iterator[tuple[str, type, str]]:
    """``(dotted key, owning dataclass, field name)`` for every leaf key of the schema."""
    cls = cls or _root()
    for f in dataclasses.fields(cls):
        kind = type_hints(cls)[f.name]
        if dataclasses.is_dataclass(kind):
            yield from leaves(kind, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", cls, f.name


def info_of(key: str, cls: type | None = None) -> FieldInfo | None:
    """The metadata of the deepest schema field on the dotted ``key`` (``task.params.x``
    is governed by ``task.params``), or None when ``key`` is not in the schema."""
    cls = cls or _root()
    head, _, rest = key.partition(".")
    if not dataclasses.is_dataclass(cls) or head not in {f.name for f in dataclasses.fields(cls)}:
        return None
    kind = type_hints(cls)[head]
    if rest and dataclasses.is_dataclass(kind):
        return info_of(rest, kind)
    return field_info(cls, head)


def _section_of(key: str) -> tuple[type, str] | None:
    """The deepest schema section on the dotted ``key``, and its dotted prefix."""
    cls, prefix = _root(), ""
    for part in key.split(".")[:-1]:
        names = {f.name for f in dataclasses.fields(cls)}
        kind = type_hints(cls).get(part) if part in names else None
        if not dataclasses.is_dataclass(kind):
            break
        cls, prefix = kind, f"{prefix}{part}."
    return (cls, prefix) if prefix else None


def may_change(key: str) -> bool:
    """Whether a resume may change ``key``. A key the schema no longer has (one a saved
    config holds from an older version) may change only inside a section whose every
    key may change, as ``queue.*`` did."""
    found = info_of(key)
    if found is not None:
        return found.resume == MAY_CHANGE
    owner = _section_of(key)
    if owner is None:
        return False
    keys = [k for k, _, _ in leaves(*owner)]
    return bool(keys) and all(may_change(k) for k in keys)


def _plain(value: Any) -> Any:
    return value.name if isinstance(value, Enum) else value


@functools.cache
def legacy_values() -> dict[str, Any]:
    """Key -> the value that reproduces runs saved before the key existed (as saved in
    ``run_config.yaml``: enums by name)."""
    return {
        key: _plain(field_info(cls, name).legacy)
        for key, cls, name in leaves()
        if field_info(cls, name).has_legacy
    }


def may_change_keys() -> list[str]:
    """The keys a resume may change, a section whose every key may change as ``section.*``."""
    out: list[str] = []
    root = _root()
    for f in dataclasses.fields(root):
        kind = type_hints(root)[f.name]
        if not dataclasses.is_dataclass(kind):
            if may_change(f.name):
                out.append(f.name)
            continue
        keys = [k for k, _, _ in leaves(kind, f"{f.name}.")]
        changing = [k for k in keys if may_change(k)]
        out += [f"{f.name}.*"] if changing == keys else changing
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default_text(cls: type, name: str) -> str:
    f = _field(cls, name)
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is MISSING:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{_plain(value)}`".replace("'", "")


def _limits_text(cls: type, name: str, bound: Bound | None) -> str:
    """The field's limits in a few words ("in (0, 1]", "at least 1", "one of a, b")."""
    kind = type_hints(cls)[name]
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "one of " + ", ".join(kind.__members__)
    if bound is None:
        return ""
    if bound.registry:
        from art_hydra.config.key_registries import describe_registry

        return describe_registry(bound.registry)
    limits = (bound.gt, bound.ge, bound.lt, bound.le)
    if not (any(x is not None for x in limits) or bound.choices or bound.nonempty):
        return ""
    text = describe(bound).removeprefix("must ")
    if text == "not be empty":
        return "not empty"
    return text.removeprefix("lie ").removeprefix("be ")


def key_table_markdown() -> str:
    """The documentation's key table: one row per key, from the schema's metadata."""
    rows = ["| key | default | limits | resume | what it is |", "|---|---|---|---|---|"]
    for key, cls, name in leaves():
        info = field_info(cls, name)
        resume = "may change" if info.resume == MAY_CHANGE else "fixed"
        cells = (
            f"`{key}`",
            _default_text(cls, name),
            _limits_text(cls, name, info.bound),
            resume,
            info.help,
        )
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def key_help_text(width: int = 88) -> str:
    """Every key for ``art-hydra --help``: its default, limits and resume rule on one line,
    its help wrapped below it."""
    blocks = []
    for key, cls, name in leaves():
        info = field_info(cls, name)
        default_text = _default_text(cls, name).strip("`")
        facts = [
            "required" if default_text == "(required)" else f"default {default_text}",
            _limits_text(cls, name, info.bound),
            "a resume may change it" if info.resume == MAY_CHANGE else "",
        ]
        head = f"{key}  ({'; '.join(f for f in facts if f)})"
        body = textwrap.fill(
            info.help,
            width,
            initial_indent="    ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
        blocks.append(f"{head}\n{body}")
    return "\n".join(blocks)


#: The documentation page that holds the generated key table, from the repository root.
KEY_TABLE_PAGE = "docs/config-keys.md"
#: The markers around the generated table on that page.
TABLE_START = "<!-- keys:start -->"
TABLE_END = "<!-- keys:end -->"


def main(argv: list[str]) -> int:
    """``python -m art_hydra.config.fields --markdown`` prints the key table of
    docs/config-keys.md (``--readme``, its name from when the README held the table, too)."""
    if argv not in (["--markdown"], ["--readme"]):
        print("usage: python -m art_hydra.config.fields --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(key_table_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
