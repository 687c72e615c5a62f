"""Checks of a composed config's shape that Hydra itself does not make.

Hydra accepts ``+trainer.lerning_rate=1e-5`` into a structured config without a word,
does not check ``???`` values at composition, and leaves broken interpolations to
blow up when first read. This module finds all three in one walk over the config, and
coerces hand-built configs onto the schema, listing every key that does not fit.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from art_hydra.config.docs import field_doc
from art_hydra.config.problems import Problem
from art_hydra.config.schema import RunConfig

#: Top-level keys that belong to Hydra, not to the run.
_HYDRA_KEY = "hydra"


def _fields(obj_type: Any) -> list[str] | None:
    if isinstance(obj_type, type) and dataclasses.is_dataclass(obj_type):
        return [f.name for f in dataclasses.fields(obj_type)]
    return None


def suggest_key(parent_type: Any, key: str) -> str | None:
    """The field of ``parent_type`` closest to the misspelt ``key``, if any is close."""
    names = _fields(parent_type) or []
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_key_problem(path: str, value: Any, parent_type: Any) -> Problem:
    """A key that the schema section does not have, with the nearest real key."""
    parent, _, leaf = path.rpartition(".")
    if _fields(parent_type) is None:  # an open mapping such as task.params
        return Problem(
            key=path,
            value=value,
            reason=f"adds a new key to the mapping '{parent}', which Hydra closes once composed.",
            fix=f"+{path}={_override_value(value)}",
        )
    section = getattr(parent_type, "__name__", "the config")
    best = suggest_key(parent_type, leaf)
    if best is not None:
        target = f"{parent}.{best}" if parent else best
        doc = field_doc(parent_type, best)
        hint = f" Did you mean {target}" + (f" ({doc.rstrip('.')})?" if doc else "?")
        fix = f"{target}={_override_value(value)}"
    else:
        known = ", ".join(_fields(parent_type) or [])
        hint = f" Known keys: {known}." if known else ""
        fix = f"remove '{path}'"
    return Problem(
        key=path,
        value=value,
        reason=f"is not a key of {section} ({parent or 'the top level'}), so it would be "
        f"ignored.{hint}",
        fix=fix,
    )


def _override_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return str(value)


def structural_problems(cfg: DictConfig) -> list[Problem]:
    """Unknown keys, missing mandatory values and broken interpolations, all of them."""
    return list(_walk(cfg, ""))


def _join(prefix: str, key: Any, in_list: bool) -> str:
    if in_list:
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else str(key)


def _walk(node: DictConfig | ListConfig, prefix: str) -> Iterator[Problem]:
    in_list = isinstance(node, ListConfig)
    obj_type = list if in_list else OmegaConf.get_type(node)
    known = _fields(obj_type)
    keys = list(range(len(node))) if in_list else list(node.keys())
    for name in known or ():
        if name not in keys:
            path = _join(prefix, name, False)
            yield Problem(
                key=path,
                value="(deleted)",
                reason="is part of the schema and cannot be removed: the run reads it.",
                fix=f"drop the '~{path}' override",
            )
    for key in keys:
        if not prefix and key == _HYDRA_KEY:
            continue
        path = _join(prefix, key, in_list)
        if known is not None and key not in known:
            yield unknown_key_problem(path, _raw(node, key), obj_type)
            continue
        if OmegaConf.is_missing(node, key):
            doc = field_doc(obj_type, str(key))
            yield Problem(
                key=path,
                value="???",
                reason="is mandatory and has no value."
                + (f" It is: {doc.rstrip('.')}." if doc else ""),
                fix=f"{path}=<value>",
            )
            continue
        if OmegaConf.is_interpolation(node, key):
            raw = _raw(node, key)
            if "${hydra:" in str(raw):
                continue  # Hydra's runtime values exist only inside a job
            try:
                node[key]
            except OmegaConfBaseException as exc:
                yield Problem(
                    key=path,
                    value=raw,
                    reason=f"the interpolation cannot be resolved: {str(exc).splitlines()[0]}",
                    fix=f"{path}=<value>, or point the interpolation at an existing key",
                )
            continue
        child = node[key]
        if isinstance(child, (DictConfig, ListConfig)):
            yield from _walk(child, path)


def with_schema_defaults(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` with deleted schema fields restored, for validators to read."""
    body = {k: v for k, v in cfg.items() if k != _HYDRA_KEY}
    return OmegaConf.merge(OmegaConf.structured(RunConfig), body)


def _raw(node: DictConfig, key: Any) -> Any:
    """The value as written (interpolations unresolved), for the report."""
    child = node._get_node(key)
    return child._value() if child is not None else None  # type: ignore[union-attr]


def coerce_to_schema(user_cfg: Any) -> tuple[DictConfig, list[Problem]]:
    """Fit a hand-built config (dataclass, dict or DictConfig) onto :class:`RunConfig`.

    Configs composed by Hydra are already typed and pass through untouched. Others are
    merged one leaf at a time so that every wrong type or unknown key is reported, not
    just the first.
    """
    if isinstance(user_cfg, RunConfig):
        return OmegaConf.structured(user_cfg), []
    if isinstance(user_cfg, DictConfig) and OmegaConf.get_type(user_cfg) is RunConfig:
        return user_cfg, []
    if dataclasses.is_dataclass(user_cfg) and not isinstance(user_cfg, type):
        user_cfg = OmegaConf.structured(user_cfg)
    elif not isinstance(user_cfg, DictConfig):
        if not isinstance(user_cfg, Mapping):
            raise TypeError(
                f"a config must be a DictConfig, a RunConfig or a mapping, not "
                f"{type(user_cfg).__name__}"
            )
        user_cfg = OmegaConf.create(dict(user_cfg))
    schema = OmegaConf.structured(RunConfig)
    OmegaConf.set_struct(schema, True)
    problems: list[Problem] = []
    for path, value in _leaves(user_cfg, "", schema):
        if path == _HYDRA_KEY:
            continue
        try:
            if _untyped_dict_at(schema, path):
                with open_dict(schema):
                    OmegaConf.update(schema, path, value, merge=False)
            else:
                OmegaConf.update(schema, path, value, merge=True)
        except OmegaConfBaseException as exc:
            problems.append(leaf_problem(schema, path, value, exc))
    return schema, problems


def _untyped_dict_at(schema: DictConfig, path: str) -> bool:
    node = OmegaConf.select(schema, path, throw_on_missing=False)
    return isinstance(node, DictConfig) and _fields(OmegaConf.get_type(node)) is None


def _leaves(cfg: DictConfig, prefix: str, schema: DictConfig) -> Iterator[tuple[str, Any]]:
    for key in cfg:
        path = f"{prefix}{key}"
        raw = cfg._get_node(key)
        target = OmegaConf.select(schema, path, throw_on_missing=False)
        if (
            isinstance(raw, DictConfig)
            and not raw._is_missing()
            and not raw._is_none()
            and isinstance(target, DictConfig)
            and _fields(OmegaConf.get_type(target)) is not None
        ):
            yield from _leaves(raw, f"{path}.", schema)
        elif isinstance(raw, (DictConfig, ListConfig)):
            yield path, OmegaConf.to_container(raw, resolve=False)
        else:
            yield path, raw._value()  # type: ignore[union-attr]


def leaf_problem(cfg: DictConfig, path: str, value: Any, exc: BaseException) -> Problem:
    """Turn an OmegaConf error about setting ``path`` into an actionable problem."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    parent_path, _, _ = path.rpartition(".")
    parent = OmegaConf.select(cfg, parent_path, throw_on_missing=False) if parent_path else cfg
    parent_type = OmegaConf.get_type(parent) if isinstance(parent, DictConfig) else None
    if isinstance(exc, (ConfigKeyError, ConfigAttributeError)) and parent_type is not None:
        return unknown_key_problem(path, value, parent_type)
    message = str(exc).splitlines()[0]
    current = OmegaConf.select(cfg, path, throw_on_missing=False)
    expected = _expected_type(parent_type, path.rpartition(".")[2])
    if "expected one of" in message:
        choices = message.split("expected one of", 1)[1].strip(" []")
        options = [c.strip() for c in choices.split(",")]
        folded = [o for o in options if o.lower() == str(value).lower()]
        close = folded or difflib.get_close_matches(str(value), options, n=1, cutoff=0.0)
        fix = f"{path}={close[0]}" if close else f"{path}=<one of the values listed>"
    elif current is not None and not isinstance(current, (DictConfig, ListConfig)):
        fix = f"{path}={_override_value(getattr(current, 'name', current))}"
        if expected:
            fix += f" ({'an' if expected[0] in 'aeiou' else 'a'} {expected})"
    else:
        fix = f"{path}=<{expected or 'value'}>"
    return Problem(key=path, value=value, reason=f"{message}.", fix=fix)


def _expected_type(parent_type: Any, name: str) -> str | None:
    if not (isinstance(parent_type, type) and dataclasses.is_dataclass(parent_type)):
        return None
    hints = {f.name: f.type for f in dataclasses.fields(parent_type)}
    hint = hints.get(name)
    return str(hint).replace("typing.", "") if hint is not None else None


def drop_shadowed(problems: Sequence[Problem], reported_keys: set[str]) -> list[Problem]:
    """Drop validator findings on keys whose override already failed (they see a default)."""
    return [p for p in problems if p.key not in reported_keys]
