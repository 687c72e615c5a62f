"""Single-field bounds, declared next to the schema fields and checked by one walker.

A field's bound lives in its dataclass metadata (``setting(0.2, gt=0, lt=1, why=..., help=...)``,
next to its help text, resume rule and legacy value: see :mod:`art_hydra.config.fields`),
so a new setting states its own limits where it is defined and needs no validator.
The walker checks every field of the schema against its bound, plus two rules that
hold for every float: it must be finite, and a nonzero value must stay nonzero and
finite in float32 (the dtype it will live in). The fix it proposes is the schema's own
default, read from the dataclass, never restated.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from art_hydra.config.problems import Kind, Problem, Severity, fix, placeholder

#: The smallest positive normal float32 and the largest float32.
FLOAT32_TINY = 1.1754943508222875e-38
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Bound:
    """Limits on one field's value; every limit left as None does not apply."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    #: Why the limit holds; shown after what it requires.
    why: str = ""
    #: Refuse empty strings and lists.
    nonempty: bool = False
    #: The only values a string field takes.
    choices: tuple[str, ...] = ()
    #: Other spellings accepted for a choice (YAML reads ``off`` as false).
    aliases: tuple[tuple[str, str], ...] = ()
    #: The value lives in a float32 tensor (floats only; seconds of a timeout do not).
    float32: bool = True
    #: ``(key, value)``: the bound applies only when that key has that value.
    when: tuple[str, Any] | None = None
    #: The string names an entry of this registry (:mod:`art_hydra.config.key_registries`).
    registry: str = ""


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
    entries: type | None = None,
    **limits: Any,
) -> Any:
    """A schema field with its help, resume rule, legacy value and (with ``limits``) a
    :class:`Bound` (``gt``, ``ge``, ``lt``, ``le``, ``why``, ``choices`` ...).

    ``entries`` is the dataclass each entry of a list annotated ``list[Any]`` fits, with
    keys of its own besides: OmegaConf would close a ``list[Entry]`` to the entry's fields,
    so it sees an open list while :func:`type_hints` (every check's view) reads
    ``list[Entry]`` (the fit types each entry, :mod:`art_hydra.config.structure`)."""
    meta = _meta(help, resume, legacy, limits)
    if entries is not None:
        meta["entries"] = entries
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


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
        if "entries" in f.metadata:
            hints[f.name] = list.__class_getitem__(f.metadata["entries"])
    return hints


def entry_class(cls: type, name: str) -> type | None:
    """The dataclass each entry of the open-mapping list ``name`` of ``cls`` fits (see
    :func:`setting`), or None."""
    found = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    return found.metadata.get("entries") if found is not None else None


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def schema_default(cls: type, dotted: str) -> Any:
    """The schema's default for ``dotted`` (a path below ``cls``)."""
    head, _, rest = dotted.partition(".")
    f = {x.name: x for x in dataclasses.fields(cls)}[head]
    if rest:
        return schema_default(type_hints(cls)[head], rest)
    return _default(f)


def canonical(bound: Bound, value: Any) -> Any:
    """The value with an alias replaced by the choice it stands for."""
    return dict(bound.aliases).get(str(value), value) if bound.aliases else value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def describe(bound: Bound) -> str:
    """What the bound requires, in words ("must lie in (0, 1)")."""
    low = ("(", bound.gt) if bound.gt is not None else ("[", bound.ge)
    high = (")", bound.lt) if bound.lt is not None else ("]", bound.le)
    if low[1] is not None and high[1] is not None:
        return f"must lie in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
    if bound.gt is not None:
        return f"must be > {_num(bound.gt)}"
    if bound.ge is not None:
        return (
            f"must be at least {_num(bound.ge)}"
            if bound.ge >= 1
            else f"must be >= {_num(bound.ge)}"
        )
    if bound.lt is not None:
        return f"must be < {_num(bound.lt)}"
    if bound.le is not None:
        return f"must be <= {_num(bound.le)}"
    if bound.choices:
        return f"must be one of {', '.join(bound.choices)}"
    return "must not be empty"


def _violates(bound: Bound, value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (
            (bound.gt is not None and not value > bound.gt)
            or (bound.ge is not None and not value >= bound.ge)
            or (bound.lt is not None and not value < bound.lt)
            or (bound.le is not None and not value <= bound.le)
        )
    if bound.choices and isinstance(value, str):
        return canonical(bound, value) not in bound.choices
    return bound.nonempty and (value is None or len(value) == 0)


def _float_problem(path: str, value: float, bound: Bound | None, default: Any) -> Problem | None:
    if not math.isfinite(value):
        reason = "must be a finite number: NaN or infinity cannot train."
    elif (bound is None or bound.float32) and value != 0 and not abs(value) >= FLOAT32_TINY:
        reason = (
            f"is nonzero in Python but 0 in float32, the dtype it is used in (the smallest "
            f"normal float32 is {FLOAT32_TINY:.3g}), so it acts as 0."
        )
    elif (bound is None or bound.float32) and abs(value) > FLOAT32_MAX:
        reason = f"is infinite in float32, the dtype it is used in (largest {FLOAT32_MAX:.3g})."
    else:
        return None
    return Problem(path, value, reason, _fix(path, default), Kind.bound)


def _fix(path: str, default: Any) -> Any:
    if default is MISSING:
        return fix({path: placeholder("value")})
    return fix({path: default}, "the default")


def _applies(root: DictConfig, when: tuple[str, Any] | None) -> bool:
    return when is None or OmegaConf.select(root, when[0]) == when[1]


def bound_problems(
    cfg: DictConfig, cls: type, prefix: str = "", root: Any = None
) -> Iterator[Problem]:
    """Every field of ``cfg`` (a resolved config typed by dataclass ``cls``) out of bounds."""
    root = cfg if root is None else root
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        value = cfg.get(f.name)
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            if isinstance(value, DictConfig) and _applies(root, f.metadata.get("when")):
                yield from bound_problems(value, kind, f"{path}.", root)
            continue
        problem = _field_problem(root, path, f, value)
        if problem is not None:
            yield problem


def bound_problems_of(root: DictConfig, cls: type, keys: Iterable[str]) -> list[Problem]:
    """What :func:`bound_problems` reports about ``keys`` alone, in its order: enough
    after changing only those keys of a config that had no bound problem, unless one of
    them decides whether a bound applies (see :func:`condition_keys`)."""
    fields_of = _schema_leaves(cls)
    found = []
    for path in sorted((k for k in set(keys) if k in fields_of), key=list(fields_of).index):
        sections, f = fields_of[path]
        if all(_applies(root, when) for when in sections):
            problem = _field_problem(root, path, f, OmegaConf.select(root, path))
            if problem is not None:
                found.append(problem)
    return found


@functools.cache
def _schema_leaves(cls: type, prefix: str = "") -> dict[str, tuple[tuple, Any]]:
    """``path -> (the when-conditions of its sections, its dataclass field)``, in schema
    order."""
    found: dict[str, tuple[tuple, Any]] = {}
    for f in dataclasses.fields(cls):
        kind = type_hints(cls)[f.name]
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(kind):
            when = f.metadata.get("when")
            for sub, (sections, g) in _schema_leaves(kind, f"{path}.").items():
                found[sub] = (((when,) if when else ()) + sections, g)
        else:
            found[path] = ((), f)
    return found


@functools.cache
def condition_keys(cls: type) -> frozenset[str]:
    """Every key a section's or a bound's ``when`` reads."""
    found: set[str] = set()
    for f in dataclasses.fields(cls):
        for when in (f.metadata.get("when"), getattr(f.metadata.get("bound"), "when", None)):
            if when is not None:
                found.add(when[0])
        kind = type_hints(cls)[f.name]
        if dataclasses.is_dataclass(kind):
            found |= condition_keys(kind)
    return frozenset(found)


def _registry_problem(path: str, value: str, registry: str, default: Any) -> Problem | None:
    """A name its registry does not hold, with the nearest registered name as the fix."""
    from art_hydra.config.key_registries import REGISTRIES, describe_registry, foreign_name_problem

    if value in REGISTRIES[registry].names():
        return None
    foreign = foreign_name_problem(registry, path, value)
    if foreign is not None:
        return foreign
    near = REGISTRIES[registry].nearest(value)
    return Problem(
        path,
        value,
        f"is not {describe_registry(registry)}"
        + (f" (did you mean {near}?)" if near else "")
        + "; register one with its decorator in a module the launcher imports or an "
        "installed package's entry point.",
        fix({path: near}) if near else _fix(path, default),
        Kind.bound,
        Severity.error,
    )


def _field_problem(root: Any, path: str, f: Any, value: Any) -> Problem | None:
    bound: Bound | None = f.metadata.get("bound")
    if bound is not None and not _applies(root, bound.when):
        return None
    default = _default(f)
    if isinstance(value, float):
        problem = _float_problem(path, value, bound, default)
        if problem is not None:
            return problem
    if bound is not None and bound.registry and isinstance(value, str):
        return _registry_problem(path, value, bound.registry, default)
    if bound is not None and value is not None and _violates(bound, value):
        reason = describe(bound) + (f": {bound.why}" if bound.why else ".")
        return Problem(path, value, reason, _fix(path, default), Kind.bound, Severity.error)
    return None
