"""Composition with a complete report: every way a config comes into being goes here.

Hydra stops at the first bad override and never runs validators at composition. The
functions below compose exactly as Hydra does (same config loader, same search path)
and, when that fails, take the overrides apart to find every bad one: syntax errors,
unknown group options, wrong types, unknown keys. Then they check the structure
(unknown ``+`` keys, missing ``???`` values) and run every registered validator. The
CLI, the pre-flight sweeper, each job, :func:`compose` and ``train(cfg)`` all use them.

Nothing here imports torch, transformers, peft or unsloth.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from art_hydra.config.problems import NOTHING_STARTED, ConfigValidationError, Problem
from art_hydra.config.registry import run_validators
from art_hydra.config.schema import RunConfig
from art_hydra.config.store import register_configs
from art_hydra.config.structure import (
    coerce_to_schema,
    drop_shadowed,
    leaf_problem,
    structural_problems,
    unknown_key_problem,
    with_schema_defaults,
)
from art_hydra.config.validators import NOT_FINITE

#: Name of the primary config in ``conf/``.
CONFIG_NAME = "config"


def config_path() -> str:
    """Where the shipped configs live: the installed ``art_hydra.conf`` package, else
    the repository's ``conf/`` folder (running from a source checkout)."""
    if importlib.util.find_spec("art_hydra.conf") is not None:
        return "pkg://art_hydra.conf"
    return str(Path(__file__).resolve().parents[2] / "conf")


@functools.lru_cache(maxsize=8)
def make_loader(config_dir: str | None = None, primary: str | None = None) -> ConfigLoader:
    """A config loader with the search path Hydra's own entry point would build."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.utils import JobRuntime, setup_globals

    setup_globals()  # Hydra's resolvers (now:, hydra:), as inside a Hydra app
    register_configs()
    search_path = create_config_search_path(primary or config_path())
    if config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    runtime = JobRuntime.instance()
    if OmegaConf.is_missing(runtime.conf, "name"):
        runtime.set("name", "art_hydra")
    return ConfigLoaderImpl(config_search_path=search_path)


@dataclass
class Composition:
    """A composed config (best effort when there are problems) and every problem found."""

    #: The composed config, including its ``hydra`` node; None if nothing could compose.
    config: DictConfig | None
    #: Every problem, in the order found: overrides, structure, validators.
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def compose_and_check(
    loader: ConfigLoader,
    config_name: str | None,
    overrides: Sequence[str],
    run_mode: RunMode = RunMode.RUN,
    *,
    master: DictConfig | None = None,
    validate: bool = True,
) -> Composition:
    """Compose like Hydra, then report everything wrong with the result.

    ``master`` is the multirun master config: points are then composed with
    ``load_sweep_config``, exactly as Hydra's sweepers and launchers do. With
    ``validate=False`` only composition errors are reported (for the multirun master,
    which does not carry the swept values).
    """
    overrides = list(overrides)
    try:
        if master is not None:
            cfg = loader.load_sweep_config(master, overrides)
        else:
            cfg = loader.load_configuration(config_name, overrides, run_mode=run_mode)
        problems: list[Problem] = []
    except Exception:  # any failure, even an OmegaConf bug, gets the full diagnosis
        if master is not None:
            hydra_overrides = list(master.hydra.overrides.hydra)
            config_name, overrides = master.hydra.job.config_name, hydra_overrides + overrides
            run_mode = RunMode.RUN
        cfg, problems = _diagnose(loader, config_name, overrides, run_mode)
    if cfg is not None and validate:
        problems += check(cfg, failed_keys={p.key for p in problems})
    return Composition(cfg, problems)


def check(cfg: DictConfig, failed_keys: set[str] | None = None) -> list[Problem]:
    """Structural problems and every validator's findings.

    A config whose root is not the schema (a user's primary config that left
    ``art_hydra_schema`` out of its defaults) is fitted onto it first, and validators read
    a copy with deleted fields restored, so each problem is reported once, by name.
    """
    found: list[Problem] = []
    if OmegaConf.get_type(cfg) is not RunConfig:
        cfg, found = coerce_to_schema(cfg)
    structural = structural_problems(cfg)
    deleted = any(p.value == "(deleted)" for p in structural)
    found += structural + run_validators(with_schema_defaults(cfg) if deleted else cfg)
    # A NaN or infinite value trips every range check on its key: report it once.
    non_finite = {p.key for p in found if p.reason.startswith(NOT_FINITE)}
    found = [p for p in found if p.key not in non_finite or p.reason.startswith(NOT_FINITE)]
    return drop_shadowed(found, failed_keys or set())


def _diagnose(
    loader: ConfigLoader, config_name: str | None, overrides: Sequence[str], run_mode: RunMode
) -> tuple[DictConfig | None, list[Problem]]:
    """Find every bad override, not just the first, and compose without them."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    parser = OverridesParser.create()
    problems: list[Problem] = []
    parsed: list[Override] = []
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except HydraException as exc:
            detail = exc.message if isinstance(exc, OverrideParseException) else str(exc)
            problems.append(
                Problem(
                    key=text,
                    value=text,
                    reason=f"is not a valid override: {detail.splitlines()[0]}",
                    fix="write key=value (+key=value adds, ~key deletes); quote values with "
                    "spaces or special characters",
                )
            )
            continue
        if override.is_sweep_override() and run_mode == RunMode.RUN:
            key, _, value = text.partition("=")
            problems.append(
                Problem(
                    key=key,
                    value=value,
                    reason="lists several values, which is a sweep; a single run takes one value.",
                    fix=f"art-hydra -m {text}  (run one job per value)",
                )
            )
            continue
        parsed.append(override)

    repo = loader.repository  # type: ignore[attr-defined]
    groups = [o for o in parsed if _is_group_override(repo, o)]
    values = [o for o in parsed if o not in groups]

    good_groups: list[Override] = []
    for override in groups:
        problem = _group_choice_problem(loader, override)
        if problem is None:
            good_groups.append(override)
        else:
            problems.append(problem)

    def load(items: Sequence[Override]) -> DictConfig | None:
        try:
            return loader.load_configuration(
                config_name, [o.input_line for o in items], run_mode=run_mode
            )
        except Exception:
            return None

    cfg = load(good_groups)
    if cfg is None:
        accepted: list[Override] = []
        for override in good_groups:
            try:
                loader.load_configuration(
                    config_name, [o.input_line for o in [*accepted, override]], run_mode=run_mode
                )
                accepted.append(override)
            except Exception as exc:
                problems.append(
                    Problem(
                        key=override.get_key_element(),
                        value=override.get_value_element_as_str(),
                        reason=f"cannot be applied: {_message(exc)}",
                        fix=_group_fix(override),
                    )
                )
        cfg = load(accepted)
        if cfg is None:
            try:
                loader.load_configuration(config_name, [], run_mode=run_mode)
            except Exception as exc:
                problems.append(
                    Problem(
                        key=str(config_name),
                        value=str(config_name),
                        reason=f"the primary config does not compose: {_message(exc)}",
                        fix="repair the config files named above",
                    )
                )
            return None, problems

    for override in values:
        if override.is_sweep_override():
            continue  # the multirun master does not carry swept values; points are checked
        try:
            ConfigLoaderImpl._apply_overrides_to_config([override], cfg)
        except Exception as exc:
            problems.append(_value_override_problem(cfg, override, exc))
    return cfg, problems


def _is_group_override(repo: Any, override: Override) -> bool:
    return override.key_or_group == "hydra.searchpath" or repo.group_exists(override.key_or_group)


def _group_choice_problem(loader: ConfigLoader, override: Override) -> Problem | None:
    if override.is_delete() or override.is_sweep_override() or override.value() is None:
        return None
    group = override.key_or_group
    if group == "hydra.searchpath":
        return None
    value = override.value()
    choices = value if isinstance(value, list) else [value]
    options = loader.get_group_options(group)
    bad = [c for c in choices if str(c) not in options]
    if not bad:
        return None
    close = difflib.get_close_matches(str(bad[0]), options, n=1, cutoff=0.0)
    return Problem(
        key=group,
        value=override.get_value_element_as_str(),
        reason=f"group '{group}' has no option '{bad[0]}'. Available: {', '.join(options)}.",
        fix=f"{override.get_key_element()}={close[0] if close else '<option>'}",
    )


def _group_fix(override: Override) -> str:
    key = override.get_key_element()
    if override.is_add():
        return (
            f"{key[1:]}={override.get_value_element_as_str()}  (drop the '+': the group is "
            "already in the defaults list)"
        )
    return f"check '{key}' and the config file it selects (named in the reason)"


def _value_override_problem(cfg: DictConfig, override: Override, exc: BaseException) -> Problem:
    key = override.key_or_group
    value = override.value()
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else None
    if (
        isinstance(value, dict)
        and isinstance(cause, (ConfigKeyError, ConfigAttributeError))
        and isinstance(OmegaConf.select(cfg, key, throw_on_missing=False), DictConfig)
    ):
        return Problem(
            key=key,
            value=value,
            reason=f"adds new keys to the mapping '{key}', which Hydra closes in a "
            "structured config.",
            fix=f"+{override.input_line.lstrip('+')}",
        )
    if cause is not None:
        return leaf_problem(cfg, key, value, cause)
    if isinstance(exc, OmegaConfBaseException):
        return leaf_problem(cfg, key, value, exc)
    message = _message(exc)
    if override.is_delete():
        return Problem(
            key=key,
            value=value,
            reason=f"cannot be deleted: {message}",
            fix=f"drop the '{override.input_line}' override",
        )
    if "Could not override" in message:
        parent_path = key.rpartition(".")[0]
        parent = OmegaConf.select(cfg, parent_path) if parent_path else cfg
        return unknown_key_problem(key, value, OmegaConf.get_type(parent))
    return Problem(key=key, value=value, reason=message, fix=f"{key}=<value>")


def _message(exc: BaseException) -> str:
    parts = [str(exc).strip()]
    if exc.__cause__ is not None and str(exc.__cause__).strip():
        parts.append(str(exc.__cause__).strip().splitlines()[0])
    text = " ".join(p.replace("\n", " ") for p in parts if p)
    return " ".join(text.split())


def compose(
    overrides: Sequence[str] = (),
    config_name: str = CONFIG_NAME,
    *,
    config_dir: str | None = None,
    return_hydra_config: bool = False,
) -> DictConfig:
    """Compose a run config for notebooks and tests; only validated configs come back.

    Raises :class:`ConfigValidationError` listing every problem (bad overrides, unknown
    keys, missing values, validator findings). Uses no global Hydra state, so it works
    inside and outside a running Hydra app.
    """
    result = compose_and_check(make_loader(config_dir), config_name, overrides, RunMode.RUN)
    if result.problems:
        raise ConfigValidationError(result.problems)
    cfg = result.config
    assert cfg is not None
    if not return_hydra_config:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def validate(cfg: Any, *, footer: str | None = NOTHING_STARTED) -> DictConfig:
    """Validate a config from anywhere (composed, built by hand, a RunConfig) and return it
    typed. Raises :class:`ConfigValidationError` with every problem."""
    typed, problems = coerce_to_schema(cfg)
    problems += check(typed, failed_keys={p.key for p in problems})
    if problems:
        raise ConfigValidationError(problems, footer=footer)
    return typed
