"""Fit any config onto the schema, resolved, and report everything that does not fit.

One walk serves every way a config arrives: composed by Hydra, built by hand as a
:class:`RunConfig` or a dict, or mutated after composition. It resolves every
interpolation (``${oc.decode:...}``, ``${oc.env:...}``, ``${hydra:...}`` where a job
view is set), so checks see the values the run will see; it finds the keys Hydra accepts
silently (``+trainer.lerning_rate=1e-5``), ``???`` values, deleted schema fields,
interpolations that do not resolve and values of the wrong type, all of them at once.
What comes out is a typed config with no interpolation left: the values are decided
once, and the run uses them.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from art_hydra.config.bounds import canonical, entry_class, schema_default, type_hints
from art_hydra.config.fields import help_of
from art_hydra.config.hydra_compat import raw_value
from art_hydra.config.problems import Kind, Problem, fix, override_value, placeholder
from art_hydra.config.schema import RunConfig
from art_hydra.config.trl_names import trl_suggestion

#: The top-level key that belongs to Hydra, not to the run.
HYDRA_KEY = "hydra"
_MISSING = "???"


def fit(user_cfg: Any, *, in_place: bool = False) -> tuple[DictConfig, list[Problem]]:
    """``user_cfg`` (a DictConfig, a dataclass or a mapping) as a resolved, typed config,
    with every problem found on the way.

    A config Hydra composed is already typed; anything else is first filled leaf by leaf
    into a fresh schema (every unknown key and wrong type reported, interpolations kept
    as written). Then one walk resolves every interpolation in place (a composed config
    is copied first unless ``in_place``: the CLI and the sweeper own theirs).
    """
    problems: list[Problem] = []
    if isinstance(user_cfg, DictConfig) and OmegaConf.get_type(user_cfg) is RunConfig:
        cfg = user_cfg if in_place else copy.deepcopy(user_cfg)
        _resolve_typed(cfg, RunConfig, "", problems, composed=True)
        return cfg, problems
    if dataclasses.is_dataclass(user_cfg) and not isinstance(user_cfg, type):
        source = _plain_dataclass(user_cfg)
    elif isinstance(user_cfg, DictConfig):
        source = OmegaConf.to_container(user_cfg, resolve=False)
    elif isinstance(user_cfg, Mapping):
        source = user_cfg
    else:
        raise TypeError(
            "a config must be a DictConfig, a RunConfig or a mapping, not "
            f"{type(user_cfg).__name__}"
        )
    cfg = OmegaConf.structured(RunConfig)
    _fill(cfg, source, RunConfig, "", problems)
    _resolve_typed(cfg, RunConfig, "", problems, composed=False)
    return cfg, problems


def _fill(
    typed: DictConfig, source: Mapping, cls: type, prefix: str, problems: list[Problem]
) -> None:
    """Set each leaf of a plain mapping into the typed schema, reporting what does not fit."""
    hints = type_hints(cls)
    for key, value in source.items():
        path = f"{prefix}{key}"
        if not prefix and key == HYDRA_KEY:
            continue
        if key not in hints:
            problems.append(unknown_key_problem(path, value, cls))
            continue
        kind = hints[key]
        if dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            _fill(typed[key], value, kind, f"{path}.", problems)
            continue
        try:
            with open_dict(typed):
                typed[key] = value
        except OmegaConfBaseException:
            problems.append(type_problem(path, value, kind, _type_name(kind)))


def _type_entries(node: ListConfig, cls: type, path: str, problems: list[Problem]) -> None:
    """Each entry of an open-mapping list (``task.rewards``) as a typed ``cls`` node: its
    fields' defaults and types, its other keys kept as written (a reward class's
    constructor arguments) and left open, so a config file may carry them too. A field of
    the wrong type is reported and keeps its default."""
    hints = type_hints(cls)
    first = dataclasses.fields(cls)[0].name
    for i in range(len(node)):
        item, where = node[i], f"{path}.{i}"
        if not isinstance(item, DictConfig):
            shape = "{" + ", ".join(f"{k}: ..." for k in hints) + "}"
            wanted = [
                OmegaConf.to_container(e) if isinstance(e, DictConfig) else {first: e} for e in node
            ]
            problems.append(
                Problem(
                    where,
                    override_value(item),
                    f"is {type(item).__name__}: each entry of {path} is a mapping {shape}.",
                    fix({path: wanted}),
                    Kind.type,
                )
            )
            # The rules read the entry as the fix writes it (the config only serves the
            # report now).
            item = OmegaConf.create({first: str(item)})
        typed = OmegaConf.structured(cls)
        OmegaConf.set_struct(typed, False)
        for key in item:
            try:
                typed[key] = item[key]
            except OmegaConfBaseException:
                kind = hints.get(str(key), Any)
                problems.append(type_problem(f"{where}.{key}", item[key], kind, _type_name(kind)))
        for key in typed:
            if OmegaConf.is_missing(typed, key):
                problems.append(_missing_problem(f"{where}.{key}"))
        node[i] = typed


def _deleted_problem(path: str) -> Problem:
    return Problem(
        path,
        "(deleted)",
        "is part of the schema and cannot be removed: the run reads it.",
        fix(note=f"drop the '~{path}' override", drops=(f"~{path}",)),
        Kind.deleted,
    )


def _resolve_typed(
    node: DictConfig, cls: type, prefix: str, problems: list[Problem], composed: bool
) -> None:
    """Resolve every interpolation of a typed section in place, recording what fails (and,
    in a composed config, schema fields that were deleted)."""
    hints = type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    keys = list(node.keys())
    for name in fields:
        if name not in keys and composed:
            problems.append(_deleted_problem(f"{prefix}{name}"))
    for key in keys:
        if not prefix and key == HYDRA_KEY:
            continue
        path = f"{prefix}{key}"
        if key not in fields:
            problems.append(unknown_key_problem(path, raw_value(node, key), cls))
            continue
        if not _resolve_item(node, key, path, problems):
            continue
        kind = hints[key]
        child = node[key]
        if dataclasses.is_dataclass(kind) and isinstance(child, DictConfig):
            _resolve_typed(child, kind, f"{path}.", problems, composed)
        elif isinstance(child, (DictConfig, ListConfig)):
            _resolve_container(child, path, problems)
            if isinstance(child, ListConfig) and (entry := entry_class(cls, key)) is not None:
                _type_entries(child, entry, path, problems)
        bound = fields[key].metadata.get("bound")
        if bound is not None and bound.aliases:
            node[key] = canonical(bound, node[key])


def _resolve_item(node: Any, key: Any, path: str, problems: list[Problem]) -> bool:
    """Replace an interpolation at ``key`` with its value; False if it has no usable value."""
    if OmegaConf.is_missing(node, key):
        problems.append(_missing_problem(path))
        return False
    if not OmegaConf.is_interpolation(node, key):
        return True
    raw = raw_value(node, key)
    try:
        value = node[key]
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        node[key] = value
    except OmegaConfBaseException as exc:
        problems.append(_interpolation_problem(path, raw, exc))
        return False
    return True


def _resolve_container(node: DictConfig | ListConfig, path: str, problems: list[Problem]) -> None:
    keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
    for key in keys:
        sub = f"{path}.{key}"
        if _resolve_item(node, key, sub, problems):
            child = node[key]
            if isinstance(child, (DictConfig, ListConfig)):
                _resolve_container(child, sub, problems)


def _plain_dataclass(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain_dataclass(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain_dataclass(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain_dataclass(v) for k, v in obj.items()}
    return obj


def _missing_problem(path: str) -> Problem:
    parent, _, name = path.rpartition(".")
    doc = _doc_of(parent, name)
    return Problem(
        path,
        _MISSING,
        "is mandatory and has no value." + (f" It is: {doc.rstrip('.')}." if doc else ""),
        fix({path: placeholder("value")}),
        Kind.missing,
    )


def _doc_of(parent: str, name: str) -> str:
    cls: Any = RunConfig
    for part in [p for p in parent.split(".") if p]:
        cls = type_hints(cls).get(part) if dataclasses.is_dataclass(cls) else None
    return help_of(cls, name) if cls is not None else ""


def _interpolation_problem(path: str, raw: Any, exc: BaseException) -> Problem:
    if "${hydra:" in str(raw):
        reason = (
            "reads Hydra's runtime config (${hydra:...}), which this run does not have: "
            f"{str(exc).splitlines()[0]}"
        )
    else:
        reason = f"the interpolation cannot be resolved: {str(exc).splitlines()[0]}"
    return Problem(
        path,
        raw,
        reason,
        fix({path: placeholder("value")}, "or point the interpolation at an existing key"),
        Kind.interpolation,
    )


def _type_name(kind: Any) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(kind.__members__)
    return str(getattr(kind, "__name__", kind)).replace("typing.", "")


def type_problem(path: str, value: Any, kind: Any, expected: str) -> Problem:
    """A value of the wrong type, with the schema default (or the closest choice) as fix."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        options = list(kind.__members__)
        folded = [o for o in options if o.lower() == str(value).lower()]
        close = folded or difflib.get_close_matches(str(value), options, n=1, cutoff=0.6)
        if not close:  # nothing like it: the default, a choice that works everywhere
            try:
                default = schema_default(RunConfig, path)
            except (KeyError, TypeError):
                default = None
            name = getattr(default, "name", None)
            close = [name if name in options else options[0]]
        return Problem(
            path,
            value,
            f"is not a valid choice: expected one of {', '.join(options)}.",
            fix({path: close[0]}),
            Kind.type,
        )
    try:
        default = schema_default(RunConfig, path)
    except (KeyError, TypeError):
        default = None
    if dataclasses.is_dataclass(default):  # a whole section: its keys are set one by one
        return Problem(
            path,
            value,
            f"has the wrong type: {path} is a section ({expected}), not a value.",
            fix(
                note=f"drop {path}={override_value(value)}; set its keys one by one "
                f"({path}.<key>=...)",
                drops=(f"~{path}",),  # no override appended undoes it: it is left out
            ),
            Kind.type,
        )
    suggestion = (
        fix({path: default}, expected)
        if default is not None
        else fix({path: placeholder(f"a value of type {expected}")})
    )
    if (
        isinstance(value, str)
        and isinstance(default, list)
        and default
        and all(isinstance(d, str) for d in default)
    ):
        # One name given to a list of names (logging.report_to=wandb, as TRL spells it).
        suggestion = fix({path: [value]}, "a list of one", alt=suggestion)
    return Problem(path, value, f"has the wrong type: expected {expected}.", suggestion, Kind.type)


def _fields(obj_type: Any) -> list[str] | None:
    if isinstance(obj_type, type) and dataclasses.is_dataclass(obj_type):
        return [f.name for f in dataclasses.fields(obj_type)]
    return None


def unknown_key_problem(path: str, value: Any, parent_type: Any) -> Problem:
    """A key that the schema section does not have, with the nearest real key."""
    parent, _, leaf = path.rpartition(".")
    names = _fields(parent_type)
    if names is None:  # an open mapping such as task.params
        return Problem(
            path,
            value,
            f"adds a new key to the mapping '{parent}', which Hydra closes once composed.",
            fix({f"+{path}": value}),
            Kind.unknown_key,
        )
    section = getattr(parent_type, "__name__", "the config")
    close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.6)
    trl = trl_suggestion(path, value)
    if trl is not None:  # TRL's name for a setting: its key here, not a spelling match
        hint, suggestion = trl
    elif close:
        target = f"{parent}.{close[0]}" if parent else close[0]
        doc = help_of(parent_type, close[0])
        hint = f" Did you mean {target}?" + (f" It is: {doc}" if doc else "")
        suggestion = fix({target: value}, drops=(path,))
    else:
        hint = f" Known keys: {', '.join(names)}."
        suggestion = fix(drops=(path,))  # renders as ~path
    return Problem(
        path,
        value,
        f"is not a key of {section} ({parent or 'the top level'}), so it would be ignored.{hint}",
        suggestion,
        Kind.unknown_key,
    )
