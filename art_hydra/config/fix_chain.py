"""A report's fixes hold as a chain: applied as the user would paste them, and checked.

A refused config's report ends in fixes; a user pastes the first one and runs again. If
that reveals the next refusal (``rl.loss_type=cispo`` needs ``rl.epsilon_high``), the
first report could have named it. So, only when a config is refused (an accepted one is
composed once), every error's first fix that is plain overrides is applied to the
command line, the result is checked again by the same checks, and what appears is
listed in the same report, marked as appearing once those fixes are applied; a few
rounds, until nothing new appears.

Three pieces of knowledge live here, once: how a fix applies to a command line
(:func:`applied`), how a pasted fix's overrides settle with those they replace
(:func:`settled`: the last word on a key wins, ``~key`` takes back an unknown key), and
when a fix repeats the value it replaces (:func:`repeats`).
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, ListConfig, OmegaConf

from art_hydra.config.bounds import type_hints
from art_hydra.config.problems import Fix, Placeholder, Problem, override_value
from art_hydra.config.schema import RunConfig

#: How many times the fixes are applied and the config checked again: each round's
#: fixes may reveal the next refusal; three cover every chain seen, and bound the time a
#: refusal takes.
ROUNDS = 3

#: A re-check of a command line: its problems and its resolved config (None where it
#: did not compose). The CLI's runs composition then the world pre-flight; compose()
#: composition alone: the same checks that refused the config.
Check = Callable[[list[str]], tuple[list[Problem], DictConfig | None]]


def _key(text: str) -> str:
    return text.lstrip("+~").partition("=")[0]


def applied(overrides: Sequence[str], remedy: Fix) -> list[str]:
    """``overrides`` with ``remedy`` in place: the overrides it drops are left out, each
    of its values replaces any override of the same key, and is added last."""
    dropped = {d.lstrip("~") for d in remedy.drops}
    out = [o for o in overrides if _key(o) not in dropped]
    for key, value in remedy.sets:
        bare = key.lstrip("+~")
        out = [o for o in out if _key(o) != bare]
        out.append(f"{key}={override_value(value)}")
    return out


#: Keys whose value chooses code, or widens what may run.
_CODE_KEYS = frozenset({"task.generator", "task.allowed_modules", "model.trust_remote_code"})


def chooses_code(key: str, value: Any) -> bool:
    """Whether setting ``key`` to ``value`` chooses code or what may run (a ``_target_``,
    a generator, the allowed modules, remote code, anything of Hydra's own but its
    folders). Only the user's hand may do that: the chain never applies such a fix (its
    value may come from a config file or a run's record), and its re-checks keep the
    command line's own hand (:mod:`art_hydra.config.trust`)."""
    bare = key.lstrip("+~")
    if bare in _CODE_KEYS or "_target_" in f"{bare}={override_value(value)}":
        return True
    return bare.startswith("hydra.") and bare not in ("hydra.run.dir", "hydra.sweep.dir")


def appliable(problem: Problem) -> Fix | None:
    """The problem's first fix, where it is overrides a command line can take as they
    are (no ``<...>`` to fill in, not an instruction) and chooses no code."""
    remedy = problem.fix
    if not isinstance(remedy, Fix) or remedy.has_placeholder:
        return None
    if any(chooses_code(key, value) for key, value in remedy.sets):
        return None
    if not remedy.sets and not [d for d in remedy.drops if not d.startswith("~")]:
        return None
    return remedy


# ---- a fix pasted after the command line --------------------------------------------


def schema_type(key: str) -> tuple[Any, bool]:
    """``(the type of key in the schema, whether its section is a dataclass that lacks
    it)``: Any where the schema does not say (inside a list or an open mapping). The one
    walk of the schema's types by a dotted key (composition reads it too)."""
    cls: Any = RunConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return Any, False
        hints = type_hints(cls)
        if part not in hints:
            return Any, i == len(parts) - 1
        cls = hints[part]
    return cls, False


def _whole(key: str) -> bool:
    """Whether an override of ``key`` replaces everything under it: a list field of the
    schema (``task.rewards``). A mapping merges key by key, as Hydra merges it."""
    kind, _ = schema_type(key)
    return typing.get_origin(kind) is list


def _is_mapping(override: Override) -> bool:
    try:
        return isinstance(override.value(), dict)
    except Exception:
        return True  # not plainly a leaf: left as written


def _group(key: str) -> bool:
    """Whether ``key`` names a config group (a section of the schema, or Hydra's own)."""
    return "/" in key or dataclasses.is_dataclass(schema_type(key)[0])


def _replaces(override: Override) -> bool:
    """Whether a plain override replaces the key's earlier overrides: a leaf, a list or a
    group choice. A mapping value merges into what is there (``task.params={a: 1}``, or
    ``task={path: x}`` beside ``task=jsonl``), as does any value of a mapping field; a
    sweep, an add and a package are left as written."""
    if override.is_sweep_override() or override.is_add() or override.package is not None:
        return False
    if typing.get_origin(schema_type(override.key_or_group)[0]) is dict:
        return False
    return not _is_mapping(override)


def settled(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with those a later one replaces left out, so that a fix pasted after
    the command line means what the report says (Hydra applies every override, and stops
    at the first that fails, even one a later override makes moot):

    - a later ``key=value`` of a leaf, a list or a group choice (not ``+``, not a sweep,
      not a mapping) replaces earlier overrides of the same key that are not mappings,
      and of keys inside it where it is a list (``task.rewards``); where one it replaces
      added a leaf (``+``/``++``), it adds it too (``++key=value``), as that key is not
      in the config without it (a group added with ``+`` and chosen again is chosen:
      ``+backend=torch backend=torch``);
    - ``~key`` takes back earlier overrides of ``key`` where the schema's section does not
      have it (``+trainer.lerning_rate=1e-5 ... ~trainer.lerning_rate``): Hydra cannot
      delete a key from a typed section, and the key was only ever the user's own; so
      for Hydra's own settings (``hydra.sweeper.params={...} ... ~hydra.sweeper.params``).

    A command line Hydra accepts means the same before and after."""
    parser = OverridesParser.create()
    parsed: list[Override | None] = []
    for text in overrides:
        try:
            parsed.append(parser.parse_override(text))
        except Exception:
            parsed.append(None)  # composition reports it
    out = list(overrides)
    keep = [True] * len(overrides)
    for i, override in enumerate(parsed):
        if override is None or override.is_sweep_override():
            continue
        key = override.key_or_group
        if override.is_delete():
            if schema_type(key)[1] or key.startswith("hydra."):
                earlier = [j for j in range(i) if _sets(parsed[j], key) and keep[j]]
                if earlier:
                    keep[i] = False
                    for j in earlier:
                        keep[j] = False
            continue
        if not _replaces(override):
            continue
        whole = _whole(key)
        for j in range(i):
            other = parsed[j]
            if (
                other is None
                or not keep[j]
                or other.is_delete()
                or other.is_sweep_override()
                or other.package != override.package
                or _is_mapping(other)
            ):
                continue
            if other.key_or_group == key or (whole and other.key_or_group.startswith(f"{key}.")):
                keep[j] = False
                added = other.is_add() or other.is_force_add()
                if added and other.key_or_group == key and not _group(key):
                    out[i] = "++" + out[i].lstrip("+")
    return [text for text, kept in zip(out, keep, strict=True) if kept]


def _sets(override: Override | None, key: str) -> bool:
    return override is not None and not override.is_delete() and override.key_or_group == key


# ---- a fix that repeats the value it replaces ---------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, enum.Enum):
        return value.name
    return value


def _same(a: Any, b: Any) -> bool:
    a, b = _plain(a), _plain(b)
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not (isinstance(a, bool) or isinstance(b, bool))
    ):
        return float(a) == float(b)
    return a == b or override_value(a) == override_value(b)


_ABSENT = object()


def repeats(problem: Problem, resolved: DictConfig | None, overrides: Sequence[str]) -> bool:
    """Whether ``problem``'s first fix changes nothing: it drops no override, and each of
    its values is the one the problem names (``eval.fraction=0.5`` told
    ``eval.fraction=0.5``) or, for a key the command line does not set, the one the
    config already holds."""
    remedy = problem.fix
    if not isinstance(remedy, Fix) or not remedy.sets or remedy.drops:
        return False
    given = {_key(o) for o in overrides}
    for key, value in remedy.sets:
        bare = key.lstrip("+~")
        if isinstance(value, Placeholder):
            return False
        if bare == problem.key and _same(problem.value, value):
            continue
        if bare in given or resolved is None:
            return False
        now = OmegaConf.select(resolved, bare, default=_ABSENT, throw_on_missing=False)
        if now is _ABSENT or not _same(now, value):
            return False
    return True


# ---- the chain ----------------------------------------------------------------------


def _identity(problem: Problem) -> tuple[str, str]:
    return problem.key, problem.reason


@dataclass
class Chain:
    """What applying a refused config's fixes, round after round, showed."""

    #: The errors the fixes reveal, each with the round it appears in (1: once the first
    #: report's fixes are applied), in the order found.
    revealed: list[tuple[int, Problem]] = field(default_factory=list)
    #: Errors whose fix, applied, left the same problem (a fix that does not hold).
    stuck: list[Problem] = field(default_factory=list)
    #: Errors whose fix changes nothing (it repeats the value it replaces).
    repeated: list[Problem] = field(default_factory=list)
    #: The command line once every round's fixes are applied.
    overrides: list[str] = field(default_factory=list)


def follow(
    problems: Sequence[Problem],
    resolved: DictConfig | None,
    overrides: Sequence[str],
    check: Check,
    rounds: int = ROUNDS,
) -> Chain:
    """Apply every error's first fix that is overrides to ``overrides``, check the result
    with ``check`` and collect the errors not seen before; again with those, up to
    ``rounds`` times or until nothing new appears."""
    chain = Chain(overrides=list(overrides))
    seen = {_identity(p) for p in problems if p.is_error}
    current = [p for p in problems if p.is_error]
    for round_number in range(1, rounds + 1):
        fixed = list(chain.overrides)
        tried: list[Problem] = []
        for problem in current:
            remedy = appliable(problem)
            if remedy is None:
                continue
            if repeats(problem, resolved, chain.overrides):
                chain.repeated.append(problem)
                continue
            fixed = applied(fixed, remedy)
            tried.append(problem)
        if not tried:
            break
        after, resolved = check(fixed)
        errors_after = [p for p in after if p.is_error]
        still = {_identity(p) for p in errors_after}
        chain.stuck += [p for p in tried if _identity(p) in still]
        new = [p for p in errors_after if _identity(p) not in seen]
        chain.overrides = fixed
        if not new:
            break
        seen |= {_identity(p) for p in new}
        chain.revealed += [(round_number, p) for p in new]
        current = new
    return chain
