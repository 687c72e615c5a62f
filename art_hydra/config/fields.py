"""Each config key declared once, on its schema field.

A field of :mod:`art_hydra.config.schema` states everything the project says about its
key in its metadata: the help text (``help=``), its single-field limits (the
:class:`~art_hydra.config.bounds.Bound`), whether a resume may change it
(``resume="may_change"``; fixed otherwise) and, for keys added after run folders were
first written, the value that reproduces runs saved before it existed (``legacy=``).
Reports, the README's key table, the resume comparison and the legacy fill all read
it from here, so a new key is documented, bounded and classified where it is defined.

Pure functions over dataclasses: no torch, on the compose path.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING

from art_hydra.config.bounds import Bound, describe, schema_default, type_hints

#: The resume rules a field may declare.
FIXED = "fixed"
MAY_CHANGE = "may_change"
RESUME_RULES = (FIXED, MAY_CHANGE)


class _NoLegacy:
    """Marks a field that existed when run folders were first written."""

    def __repr__(self) -> str:
        return "NO_LEGACY"


NO_LEGACY: Any = _NoLegacy()


def _meta(help: str, resume: str, legacy: Any, limits: dict[str, Any]) -> dict[str, Any]:
    if resume not in RESUME_RULES:
        raise ValueError(f"resume={resume!r}: expected one of {RESUME_RULES}")
    meta: dict[str, Any] = {"help": " ".join(help.split()), "resume": resume, "legacy": legacy}
    if limits:
        meta["bound"] = Bound(**limits)
    return meta


def setting(
    default: Any = MISSING,
    *,
    help: str,
    factory: Any = None,
    resume: str = FIXED,
    legacy: Any = NO_LEGACY,
    **limits: Any,
) -> Any:
    """A schema field with its help, resume rule, legacy value and (with ``limits``) a
    :class:`Bound` (``gt``, ``ge``, ``lt``, ``le``, ``why``, ``choices`` ...)."""
    meta = _meta(help, resume, legacy, limits)
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def section(
    cls: type, *, help: str, when: tuple[str, Enum] | None = None, resume: str = FIXED
) -> Any:
    """A nested section; with ``when`` its bounds apply only when ``key == value``."""
    meta = _meta(help, resume, NO_LEGACY, {})
    if when:
        meta["when"] = when
    return field(default_factory=cls, metadata=meta)


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
    from art_hydra.config.schema import RunConfig

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
    return f"`{_plain(value)}`".replace("'", "")


def _has_limits(bound: Bound) -> bool:
    limits = (bound.gt, bound.ge, bound.lt, bound.le)
    return any(x is not None for x in limits) or bool(bound.choices) or bound.nonempty


def key_table_markdown() -> str:
    """The README's key table: one row per key, from the schema's metadata."""
    rows = ["| key | default | resume | what it is |", "|---|---|---|---|"]
    for key, cls, name in leaves():
        info = field_info(cls, name)
        help_text = info.help
        if info.bound is not None and _has_limits(info.bound):
            help_text += f" ({describe(info.bound).removeprefix('must ')})"
        resume = "may change" if info.resume == MAY_CHANGE else "fixed"
        default = _cell(_default_text(cls, name))
        rows.append(f"| `{key}` | {default} | {resume} | {_cell(help_text)} |")
    return "\n".join(rows) + "\n"


#: The markers around the generated table in README.md.
README_START = "<!-- keys:start -->"
README_END = "<!-- keys:end -->"


def main(argv: list[str]) -> int:
    """``python -m art_hydra.config.fields --readme`` prints the README's key table."""
    if argv != ["--readme"]:
        print("usage: python -m art_hydra.config.fields --readme", file=sys.stderr)
        return 2
    sys.stdout.write(key_table_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
