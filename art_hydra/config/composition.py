"""Composition with a complete report: every way a config comes into being goes here.

Hydra stops at the first bad override and never runs validators at composition. The
functions below compose exactly as Hydra does (same config loader, same search path)
and, when that fails, take the overrides apart to find every bad one: syntax errors,
unknown group options, wrong types, unknown keys. Then they fit the result onto the
schema with every interpolation resolved as the job will see it, check each field's
bound and run every registered validator. The CLI, the pre-flight sweeper, each job,
:func:`compose` and ``train(cfg)`` all use them.

Nothing here imports torch, transformers, peft or unsloth.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import os
import re
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    InterpolationToMissingValueError,
    OmegaConfBaseException,
)

from art_hydra.config import hydra_compat, inert  # inert: also registers its rules
from art_hydra.config import validators as _built_in_rules  # noqa: F401  (registers them)
from art_hydra.config.bounds import (
    bound_problems,
    bound_problems_of,
    condition_keys,
    schema_default,
)
from art_hydra.config.fix_chain import follow, schema_type, settled
from art_hydra.config.launch_plan import launched_world_size
from art_hydra.config.problems import (
    NOTHING_STARTED,
    ConfigValidationError,
    Kind,
    Problem,
    Severity,
    errors,
    fix,
    format_report,
    placeholder,
    warnings_of,
)
from art_hydra.config.run_length import decide_length
from art_hydra.config.schema import RunConfig
from art_hydra.config.store import register_configs
from art_hydra.config.structure import HYDRA_KEY, fit, type_problem, unknown_key_problem
from art_hydra.config.trust import Hand, current_hand, hand_of, trust_problems
from art_hydra.config.validator_registry import RunOne, run_validators

#: Name of the primary config in ``conf/``.
CONFIG_NAME = "config"


def config_path() -> str:
    """Where the shipped configs live: the installed ``art_hydra.conf`` package, else
    the repository's ``conf/`` folder (running from a source checkout)."""
    if importlib.util.find_spec("art_hydra.conf") is not None:
        return "pkg://art_hydra.conf"
    return str(Path(__file__).resolve().parents[2] / "conf")


def make_loader(config_dir: str | None = None, primary: str | None = None) -> ConfigLoader:
    """A config loader with Hydra's own search path; a relative ``config_dir`` is taken
    from the current directory at each call."""
    register_configs()
    absolute = os.path.abspath(config_dir) if config_dir is not None else None
    return hydra_compat.make_loader(primary or config_path(), absolute)


@dataclass
class Composition:
    """A composed config (best effort when there are problems) and every problem found."""

    #: The run config, typed, every interpolation resolved as the job will see it (values
    #: with an error are back at their defaults); None if nothing could compose.
    resolved: DictConfig | None
    #: Every problem, in the order found: overrides, structure, bounds, validators.
    problems: list[Problem] = field(default_factory=list)
    #: The composed ``hydra`` node (the job's view: number and output folder set).
    hydra: DictConfig | None = None
    #: The folder the job will run in (from the composed ``hydra`` node).
    run_dir: str | None = None
    #: What the user set by hand (the command line's overrides); None: a Python caller.
    hand: Hand | None = None
    #: The config exactly as Hydra composed it, ``hydra`` node included, before any check
    #: resolved it: what Hydra's job runner takes (and saves to ``.hydra/``). Kept only
    #: when asked (``keep_composed``): the command runs its single run from it.
    composed: DictConfig | None = None

    @property
    def ok(self) -> bool:
        return not errors(self.problems)


def compose_and_check(
    loader: ConfigLoader,
    config_name: str | None,
    overrides: Sequence[str],
    run_mode: RunMode = RunMode.RUN,
    *,
    master: DictConfig | None = None,
    job_num: int | None = None,
    validate: bool = True,
    hand: Hand | None = None,
    keep_composed: bool = False,
) -> Composition:
    """Compose like Hydra, then report everything wrong with the result.

    ``master`` is the multirun master config: a sweep point is then composed with
    ``load_sweep_config``, exactly as Hydra's launchers do, and checked as job number
    ``job_num`` will see it. With ``validate=False`` only composition errors are
    reported (for the multirun master, which does not carry the swept values).

    ``hand`` is what the user set by hand (by default: every override given here); what
    a config file set beyond it may not choose code (:mod:`art_hydra.config.trust`).
    ``keep_composed`` keeps a copy of the config as composed (:attr:`Composition.composed`).
    """
    overrides = list(overrides)
    if master is not None:
        # A sweep point is composed from the master's primary config (the user's own,
        # under --config-dir/--config-name): what it sets is theirs at every point.
        config_name = master.hydra.job.config_name
    if hand is None:
        hand = hand_of(overrides, lambda name: hydra_compat.is_group(loader, name))
    with hydra_compat.refused_reads() as refused:
        cfg, problems = _compose(loader, config_name, overrides, run_mode, master)
    if refused:  # a config file past the bounds: it alone is the report, nothing composed
        cfg, problems = None, [_refused_file_problem(r) for r in refused]
    result = Composition(None, problems, hand=hand)
    if cfg is not None and keep_composed:
        result.composed = copy.deepcopy(cfg)  # the checks below resolve cfg in place
    if cfg is not None:
        _check_composed(result, loader, config_name, cfg, overrides, job_num, validate)
    return result


def _compose(
    loader: ConfigLoader,
    config_name: str | None,
    overrides: list[str],
    run_mode: RunMode,
    master: DictConfig | None,
) -> tuple[DictConfig | None, list[Problem]]:
    """The config as Hydra composes it, or the diagnosis of why it does not compose."""
    try:
        if master is not None:
            cfg = loader.load_sweep_config(master, overrides)
        else:
            cfg = loader.load_configuration(config_name, overrides, run_mode=run_mode)
        if master is None and run_mode == RunMode.RUN:
            hydra_compat.as_single_run(cfg)
        return cfg, []
    except Exception:  # any failure, even an OmegaConf bug, gets the full diagnosis
        if master is not None:  # config_name is the master's (compose_and_check)
            overrides = [*master.hydra.overrides.hydra, *overrides]
            run_mode = RunMode.RUN
        cfg, problems = _diagnose(loader, config_name, overrides, run_mode)
        return cfg, _searchpath_problem(loader, config_name) + problems


def _searchpath_problem(loader: ConfigLoader, config_name: str | None) -> list[Problem]:
    """The primary config file's own ``hydra.searchpath``, which the loader did not
    follow (a file may not widen where configs come from): named where composing
    failed without it."""
    ignored = getattr(loader, "ignored_searchpath", None)
    if ignored is None or ignored[0] != config_name:
        return []
    key = "hydra.searchpath"
    return [
        Problem(
            key,
            ignored[1],
            f"is set by the primary config file {config_name}: it adds places Hydra reads "
            "configs from (a pkg:// entry imports that package), and a config file may not "
            "widen where configs come from.",
            fix(note=f"{key}=[...] or --config-dir on the command line, if you trust them"),
            Kind.override,
        )
    ]


def _refused_file_problem(refused: Any) -> Problem:
    """A config file Hydra was about to read that is past the bounds of a config file
    (:mod:`art_hydra.config.yaml_guard`), named with the bound."""
    return Problem(
        refused.path,
        os.path.basename(refused.path),
        f"this config file {refused.reason}; nothing was composed.",
        fix(note=f"repair or remove {refused.path}, or stop naming it"),
        Kind.group,
    )


def _check_composed(
    result: Composition,
    loader: ConfigLoader,
    config_name: str | None,
    cfg: DictConfig,
    overrides: Sequence[str],
    job_num: int | None,
    validate: bool,
) -> None:
    """Every check of a composed ``cfg`` (resolved in place), into ``result``."""
    assert result.hand is not None
    # Before Hydra starts: its callbacks and logging config run before any job.
    flagged = {p.key for p in result.problems}
    chosen = _group_content(loader, cfg)
    result.problems += [p for p in trust_problems(cfg, result.hand, chosen) if p.key not in flagged]
    if not validate:  # a sweep's master: its hydra values alone
        result.problems += _master_hydra_problems(cfg, overrides)
        return
    _check_job(
        result,
        cfg,
        overrides,
        job_num,
        origins_of_composed(loader, config_name, chosen, result.hand),
    )


#: An interpolation that reads Hydra's own node (``${hydra:runtime.output_dir}``,
#: ``${hydra.run.dir}``), nested ones included.
_READS_HYDRA = re.compile(r"\$\{[^}]*\bhydra[.:]")


def in_run_folder(
    result: Composition,
    folder: str,
    loader: ConfigLoader,
    config_name: str | None,
    overrides: Sequence[str],
) -> Composition:
    """A checked single run (composed with ``keep_composed``) in ``folder`` instead of its
    own: the run folder the ranks of a multi-rank run agreed on (rank 0's). Hydra learns
    it through its own config (``hydra.run.dir`` of :attr:`Composition.composed`). The run
    config is resolved and checked again only where one of its values reads Hydra's node
    (``checkpoint.dir=${hydra:runtime.output_dir}/ckpt`` read this rank's own folder);
    otherwise nothing in it depends on the folder and ``result`` is the run, as checked."""
    assert result.composed is not None
    composed = result.composed
    with read_write(composed.hydra):
        composed.hydra.run.dir = folder
    if result.run_dir == os.path.abspath(folder) or not _reads_hydra(composed):
        result.run_dir = os.path.abspath(folder)
        return result
    # rank 0's folder is the launch's own choice, made from this rank's hand: no file's
    hand = result.hand
    if hand is not None:
        hand = dataclasses.replace(hand, keys=hand.keys | {"hydra.run.dir"})
    moved = Composition(None, hand=hand, composed=composed)
    _check_composed(moved, loader, config_name, copy.deepcopy(composed), overrides, None, True)
    return moved


def _reads_hydra(composed: DictConfig) -> bool:
    """Whether a run-config value (outside the ``hydra`` node) reads Hydra's node."""
    raw: Any = OmegaConf.to_container(composed, resolve=False)
    raw.pop(HYDRA_KEY, None)
    return bool(_READS_HYDRA.search(str(raw)))


def _master_hydra_problems(cfg: DictConfig, overrides: Sequence[str]) -> list[Problem]:
    """A sweep's master is checked for its ``hydra.*`` values alone: its jobs carry the
    swept values, and are checked one by one."""
    try:
        with hydra_compat.as_job(cfg, None):
            return _hydra_value_problems(cfg, overrides)
    except OmegaConfBaseException:  # hydra.run.dir, which no job of a sweep reads
        return _hydra_value_problems(cfg, overrides)


def _check_job(
    result: Composition,
    cfg: DictConfig,
    overrides: Sequence[str],
    job_num: int | None,
    origins: Any,
) -> None:
    """Resolve ``cfg`` as job ``job_num`` sees it and run every check on it, filling
    ``result`` (run folder, ``hydra`` node, resolved config) and adding the problems on
    keys not flagged yet. ``origins`` is who set what, for the checks of settings the run
    never reads (config/inert.py)."""
    failed = {p.key for p in result.problems}
    try:
        with hydra_compat.as_job(cfg, job_num), inert.tracing(origins):
            result.run_dir = str(cfg.hydra.runtime.output_dir)
            found = _hydra_value_problems(cfg, overrides)
            resolved, checked = check(cfg, in_place=True, hand=result.hand)
    except OmegaConfBaseException as exc:  # the job's folder itself cannot be known
        result.run_dir = None
        found = [_hydra_problem(cfg, str(getattr(exc, "full_key", "") or "hydra"), exc)]
        with inert.tracing(origins):
            resolved, checked = check(cfg, in_place=True, hand=result.hand)
    found += checked
    with open_dict(resolved):
        result.hydra = resolved.pop(HYDRA_KEY)
    result.resolved = resolved
    result.problems += [p for p in found if p.key not in failed]


def _hydra_value_problems(cfg: DictConfig, overrides: Sequence[str]) -> list[Problem]:
    """The ``hydra.*`` values set on the command line that Hydra could not read when it
    runs the job (``???``, an interpolation that does not resolve): reported here, since
    Hydra itself would stop with a traceback."""
    found = []
    for text in overrides:
        key = text.lstrip("+~").partition("=")[0]
        if not key.startswith(f"{HYDRA_KEY}.") or text.startswith("~"):
            continue
        try:
            OmegaConf.select(cfg, key, throw_on_missing=True)
        except InterpolationToMissingValueError:
            continue  # it reads a value Hydra sets for each job (${hydra.job.num})
        except OmegaConfBaseException as exc:
            found.append(_hydra_problem(cfg, key, exc))
    return found


def _hydra_problem(cfg: DictConfig, key: str, exc: BaseException) -> Problem:
    """A ``hydra.*`` value that cannot be read, as composition reports any other."""
    try:
        raw = _raw(cfg, key)
    except Exception:
        raw = key
    missing = "Missing mandatory value" in str(exc)
    return Problem(
        key,
        raw,
        "is mandatory and has no value."
        if missing
        else f"cannot be resolved: {str(exc).strip().splitlines()[0]}",
        fix({key: placeholder("value")}, "" if missing else "or drop the interpolation"),
        Kind.missing if missing else Kind.interpolation,
    )


def _group_content(loader: ConfigLoader, cfg: DictConfig) -> Any:
    """``group -> the content of the option cfg chose for it, from its file alone``; its
    ``installed(group)`` says whether that option comes with an installed package (a
    plugin's own config) rather than from a folder of config files."""
    return _GroupFiles(
        loader,
        dict(OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}),
        hydra_compat.files_of(cfg),
    )


def origins_of_composed(
    loader: ConfigLoader, config_name: str | None, chosen: _GroupFiles, hand: Hand | None
) -> inert.Origins:
    """Who set what in a config composed from ``config_name`` with the group files
    ``chosen`` (:func:`_group_content`), for the checks of settings the run never reads
    (:mod:`art_hydra.config.inert`). One function, so that a sweep's fast way judges a
    point as its full composition does (:mod:`art_hydra.sweeps.preflight`)."""
    return inert.origins_of(hand, chosen.choices, chosen.loaded, _primary(loader, config_name))


def _primary(loader: ConfigLoader, config_name: str | None) -> Any:
    """The primary config's file (None: none, or unreadable)."""
    if config_name is None:
        return None
    try:
        return loader.repository.load_config(config_name)  # type: ignore[attr-defined]
    except Exception:
        return None


class _GroupFiles:
    def __init__(self, loader: ConfigLoader, choices: dict[str, Any], files: Any = None) -> None:
        self.loader, self.choices = loader, choices
        #: The files that composed the config (:func:`hydra_compat.files_of`; None: unknown).
        self.files = files
        self._loaded: dict[str, Any] = {}

    def shadowed(self, config_path: str) -> str | None:
        """Who ships an option of this name in a trusted source (Hydra, art_hydra, an
        installed plugin), where a folder of config files holds one too (None: nobody)."""
        from art_hydra.config.hydra_section import _trusted_source

        for source in self.loader.repository.get_sources():  # type: ignore[attr-defined]
            probe = hydra_compat.ConfigFile(
                "", f"{source.scheme()}://{source.path}", source.provider, {}
            )
            try:
                if _trusted_source(probe) and source.is_config(config_path):
                    return str(source.provider)
            except Exception:
                continue
        return None

    def loaded(self, group: str) -> Any:
        """The Hydra ``LoadedConfig`` of the group's chosen option (None: unreadable)."""
        return self._load(group)

    def _load(self, group: str) -> Any:
        """The option's file, read once (the trust check asks for it more than once)."""
        if group not in self._loaded:
            try:
                found = self.loader.repository.load_config(f"{group}/{self.choices[group]}")  # type: ignore[attr-defined]
            except Exception:
                found = None
            self._loaded[group] = found
        return self._loaded[group]

    def __call__(self, group: str) -> Any:
        found = self._load(group)
        try:
            return OmegaConf.to_container(found.config, resolve=False) if found else None
        except Exception:
            return None

    def installed(self, group: str) -> bool:
        found = self._load(group)
        return found is not None and str(found.path).startswith(("structured://", "pkg://"))


def check(
    cfg: Any, *, in_place: bool = False, hand: Hand | None = None
) -> tuple[DictConfig, list[Problem]]:
    """Fit ``cfg`` onto the schema, resolved, and run every check of the config alone.

    Returns the typed, resolved config and every problem: structural ones, bounds, then
    the validators' findings. A value with an error is put back to its schema default
    before the next checks read it, so one mistake is reported once, by name, and no
    rule trips over it (the config then only serves the report). With ``strict=true``
    warnings count as errors. ``in_place`` resolves a composed config without copying it.
    ``hand``: what the user typed (None: the hand of the run being checked, if any).
    """
    typed, problems = fit(cfg, in_place=in_place)
    _reset(typed, {p.key for p in problems})
    bounds = settle(typed, hand=hand)
    _reset(typed, {p.key for p in bounds})
    problems += bounds
    return typed, rule_problems(typed, problems)


def settle(
    typed: DictConfig, changed: Sequence[str] | None = None, hand: Hand | None = None
) -> list[Problem]:
    """Decide what the schema leaves to the launch (a null world size: as many ranks as
    were started) and which key sizes the run (:func:`~art_hydra.config.run_length.
    decide_length`, from what ``hand`` typed; None: the current run's hand), and report
    each field outside its bound: every field, or only the ``changed`` ones of a config
    whose other fields passed (unless one of them decides where a bound applies). Every
    path settles here: the command, ``compose``, a job's or a caller's ``train`` and a
    sweep pre-flight's fast way."""
    if typed.distributed.world_size is None:  # null means: as many as the launcher started
        typed.distributed.world_size = launched_world_size() or 1
    decide_length(typed, _typed_by_user(hand if hand is not None else current_hand()))
    if changed is None or condition_keys(RunConfig) & set(changed):
        return list(bound_problems(typed, RunConfig))
    return bound_problems_of(typed, RunConfig, [*changed, "distributed.world_size"])


def _typed_by_user(hand: Hand | None) -> Callable[[str], bool] | None:
    """Whether the user typed a key: set by ``hand``, or varied by the sweep being checked
    (each job's command line sets it). None for a caller's config (no hand: all typed)."""
    if hand is None:
        return None
    swept = inert.swept_now()
    return lambda key: hand.set(key) or key in swept


def rule_problems(
    typed: DictConfig, problems: list[Problem], run_one: RunOne | None = None
) -> list[Problem]:
    """``problems`` plus every validator's findings on keys without one yet, all errors
    under ``strict=true`` (``run_one``: how each validator runs, see :data:`RunOne`)."""
    flawed = {p.key for p in problems}
    problems = problems + [p for p in run_validators(typed, run_one) if p.key not in flawed]
    if typed.strict:
        problems = [
            Problem(p.key, p.value, p.reason, p.fix, p.kind, Severity.error) for p in problems
        ]
    return problems


def _reset(typed: DictConfig, keys: set[str]) -> None:
    """Put each of ``keys`` that is a schema field back to its default, in place."""
    for key in keys:
        key = key.partition("[")[0]
        try:
            default = schema_default(RunConfig, key)
        except (KeyError, TypeError, AttributeError):
            continue  # not a schema field (an unknown key, a group, an override)
        with open_dict(typed):
            OmegaConf.update(typed, key, default, merge=False)


def _diagnose(
    loader: ConfigLoader, config_name: str | None, overrides: Sequence[str], run_mode: RunMode
) -> tuple[DictConfig | None, list[Problem]]:
    """Find every bad override, not just the first, and compose without them."""
    parsed, problems = _parsed_overrides(overrides, run_mode)
    groups = [o for o in parsed if hydra_compat.is_group(loader, o.key_or_group)]
    values = [o for o in parsed if o not in groups]
    good_groups: list[Override] = []
    for override in groups:
        problem = _group_choice_problem(loader, override)
        if problem is None:
            good_groups.append(override)
        else:
            problems.append(problem)
    cfg = _compose_good_groups(loader, config_name, good_groups, run_mode, problems)
    if cfg is None:
        return None, problems
    for override in values:
        if override.is_sweep_override():
            continue  # the multirun master does not carry swept values; points are checked
        try:
            hydra_compat.apply_override(cfg, override)
        except Exception as exc:
            problems.append(_value_override_problem(cfg, override, exc))
    return cfg, problems


def _parsed_overrides(
    overrides: Sequence[str], run_mode: RunMode
) -> tuple[list[Override], list[Problem]]:
    """Each override parsed on its own, so every one that does not parse is reported
    (Hydra's parser stops at the first), and so is a sweep's list of values given to a
    single run; the rest parsed, in order."""
    parser = OverridesParser.create()
    problems: list[Problem] = []
    parsed: list[Override] = []
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except HydraException as exc:
            problems.append(_unparsable_problem(text, exc))
            continue
        if override.is_sweep_override() and run_mode == RunMode.RUN:
            problems.append(_sweep_in_run_problem(text))
            continue
        parsed.append(override)
    return parsed, problems


def _unparsable_problem(text: str, exc: HydraException) -> Problem:
    """An override Hydra's grammar rejects, with the first line of its reason."""
    detail = exc.message if isinstance(exc, OverrideParseException) else str(exc)
    return Problem(
        text,
        text,
        f"is not a valid override: {detail.splitlines()[0]}",
        fix(
            note="write key=value (+key=value adds, ~key deletes); quote values "
            "with spaces or special characters"
        ),
        Kind.override,
    )


def _sweep_in_run_problem(text: str) -> Problem:
    """A list of values (a sweep) given to a single run, which takes one."""
    key, _, value = text.partition("=")
    return Problem(
        key,
        value,
        "lists several values, which is a sweep; a single run takes one value.",
        fix(note=f"art-hydra -m {text}  (one job per value)"),
        Kind.override,
    )


def _compose_good_groups(
    loader: ConfigLoader,
    config_name: str | None,
    groups: list[Override],
    run_mode: RunMode,
    problems: list[Problem],
) -> DictConfig | None:
    """The config composed with the group choices ``groups``. Where that fails, each
    choice is tried after those that composed before it, and each that breaks the
    composition is added to ``problems``; None (and a problem) where not even the
    primary config composes."""
    cfg = _load_or_none(loader, config_name, groups, run_mode)
    if cfg is not None:
        return cfg
    accepted: list[Override] = []
    for override in groups:
        if _load_or_none(loader, config_name, [*accepted, override], run_mode) is not None:
            accepted.append(override)
            continue
        error = _first_error(loader, config_name, [*accepted, override], run_mode)
        problems.append(_group_override_problem(override, error))
    cfg = _load_or_none(loader, config_name, accepted, run_mode)
    if cfg is None:
        problems.append(
            Problem(
                str(config_name),
                str(config_name),
                "the primary config does not compose: "
                + _first_error(loader, config_name, [], run_mode),
                fix(note="repair the config files named above"),
                Kind.group,
            )
        )
    return cfg


def _load_or_none(
    loader: ConfigLoader, config_name: str | None, items: Sequence[Override], run_mode: RunMode
) -> DictConfig | None:
    """The config composed with ``items``, or None where Hydra cannot compose it (the
    reason is read again, by :func:`_first_error`, only for the report)."""
    try:
        return loader.load_configuration(
            config_name, [o.input_line for o in items], run_mode=run_mode
        )
    except Exception:
        return None


def _group_override_problem(override: Override, error: str) -> Problem:
    """A group choice that breaks the composition (``error``): the fix drops a '+' that
    adds a group already in the defaults list, or points at the file it selects."""
    key = override.get_key_element()
    return Problem(
        key,
        override.get_value_element_as_str(),
        f"cannot be applied: {error}",
        fix(
            {key[1:]: override.get_value_element_as_str()},
            "drop the '+': the group is already in the defaults list",
            drops=(key[1:],),
        )
        if override.is_add()
        else fix(note=f"check '{key}' and the config file it selects"),
        Kind.group,
    )


def _first_error(
    loader: ConfigLoader, config_name: str | None, items: Sequence[Override], run_mode: RunMode
) -> str:
    try:
        loader.load_configuration(config_name, [o.input_line for o in items], run_mode=run_mode)
    except Exception as exc:
        return _message(exc)
    return "unknown error"


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
        group,
        override.get_value_element_as_str(),
        f"group '{group}' has no option '{bad[0]}'. Available: {', '.join(options)}.",
        fix({override.get_key_element(): close[0]}) if close else fix(note=f"{group}=<option>"),
        Kind.group,
    )


def _value_override_problem(cfg: DictConfig, override: Override, exc: BaseException) -> Problem:
    key = override.key_or_group
    value = override.value()
    entries = _entry_list(key)
    if entries is not None and not override.is_delete():
        return _entry_list_problem(cfg, key, value, entries)
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else exc
    target = OmegaConf.select(cfg, key, throw_on_missing=False)
    if override.is_delete():
        return Problem(
            key,
            value,
            f"cannot be deleted: {_message(exc)}",
            fix(note=f"drop the '{override.input_line}' override", drops=(f"~{key}",)),
            Kind.override,
        )
    if override.is_add() and not override.is_force_add() and _holds(cfg, key):
        # Hydra refuses to add a key that is already there (the defaults or a config file
        # set it): '+' only adds, a plain override sets.
        return Problem(
            key,
            value,
            f"is already set (to {_raw(cfg, key)!s} by the defaults or a config file), and "
            "'+' only adds a key that is not there yet.",
            fix({key: override.get_value_element_as_str()}, "drop the '+'", drops=(key,)),
            Kind.override,
        )
    if isinstance(value, dict) and target is None and _holds(cfg, key):
        return _mapping_into_null_problem(key, value)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or target is None:
        if isinstance(value, dict) and isinstance(target, DictConfig):
            return Problem(
                key,
                value,
                f"adds new keys to the mapping '{key}', which Hydra closes in a structured config.",
                fix(note=f"+{override.input_line.lstrip('+')}"),
                Kind.unknown_key,
            )
        parent_path = key.rpartition(".")[0]
        parent = OmegaConf.select(cfg, parent_path) if parent_path else cfg
        return unknown_key_problem(key, value, OmegaConf.get_type(parent))
    kind = schema_type(key)[0]
    return type_problem(key, value, kind, getattr(kind, "__name__", str(kind)))


#: Where a sweeper reads its search space from a config file; on the command line each
#: dimension is an override of its own (``rl.temperature=interval(0.7,1.2)``).
SWEEPER_PARAMS = "hydra.sweeper.params"


def _mapping_into_null_problem(key: str, value: dict) -> Problem:
    """A mapping given to a key that holds null (``hydra.sweeper.params`` until a config
    file sets it): Hydra cannot merge into null, whatever the key's type says."""
    if key == SWEEPER_PARAMS:
        return Problem(
            key,
            value,
            "holds null until a config file sets it, and Hydra cannot merge a mapping given "
            "on the command line into null. On the command line each dimension of the search "
            "space is an override of its own, as the sweeper's documentation writes them.",
            fix({str(k): v for k, v in value.items()}, drops=(key,)),
            Kind.override,
        )
    return Problem(
        key,
        value,
        "holds null, and Hydra cannot merge a mapping given on the command line into null: "
        "each of its keys is added as an override of its own.",
        fix({f"++{key}.{k}": v for k, v in value.items()}, drops=(key,)),
        Kind.override,
    )


def _entry_list(key: str) -> tuple[str, type] | None:
    """(the list's key, its entry class) when ``key`` is a list of structured entries
    (``task.rewards``) or lies inside one (``task.rewards.0.weight``)."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        kind = schema_type(".".join(parts[:end]))[0]
        args = typing.get_args(kind)
        if typing.get_origin(kind) is list and args and dataclasses.is_dataclass(args[0]):
            return ".".join(parts[:end]), args[0]
    return None


def _entry_list_problem(
    cfg: DictConfig, key: str, value: Any, entries: tuple[str, type]
) -> Problem:
    """A list of entries set or edited wrongly: what an entry is, and the whole list
    written out right (a fix that works however the list stood)."""
    list_key, entry_cls = entries
    names = [f.name for f in dataclasses.fields(entry_cls)]
    shape = "{" + ", ".join(f"{n}: ..." for n in names) + "}"
    current = OmegaConf.select(cfg, list_key, default=None)
    have = OmegaConf.to_container(current) if current is not None else []
    if key == list_key and isinstance(value, list):
        wanted, why = _entries_meant(value, names)
    else:  # an edit inside the list: task.rewards.<i>.<field>
        index, _, leaf = key[len(list_key) + 1 :].partition(".")
        wanted = [dict(e) for e in have] if isinstance(have, list) else []
        if not index.isdigit():
            why = f"'{index}' is not an index of the list {list_key} (0, 1, ...)"
        elif int(index) >= len(wanted):
            shorthand = OmegaConf.select(cfg, "task.reward._target_", default=None)
            first = {"_target_": shorthand} if list_key == "task.rewards" and shorthand else {}
            count = f"{len(wanted)} entr{'y' if len(wanted) == 1 else 'ies'}"
            why = f"{list_key} has {count}, so no entry {index}"
            while len(wanted) <= int(index):
                wanted.append(dict(first) if not wanted and first else {})
        else:
            why = ""
        # A key besides the entry's own (``scale``) is a reward class's constructor
        # argument: only the pre-flight, which imports the target, can tell.
        if index.isdigit() and leaf:
            wanted[int(index)][leaf] = value
    missing = [i for i, e in enumerate(wanted) if "_target_" in names and not e.get("_target_")]
    for i in missing:
        wanted[i]["_target_"] = placeholder("module.function")
    reason = (
        f"cannot be applied: each entry of {list_key} is a mapping {shape}"
        + (f"; {why}" if why else "")
        + "."
    )
    return Problem(key, value, reason, fix({list_key: wanted}, drops=(key,)), Kind.override)


def _entries_meant(value: list, names: list[str]) -> tuple[list[dict], str]:
    """What a list of entries written wrongly most likely meant: a bare string is an
    entry's first field (``_target_``). Other keys are kept: they are a reward class's
    constructor arguments, or a misspelt key the pre-flight names once it knows the
    target is a function."""
    wanted, why = [], []
    for i, item in enumerate(value):
        if isinstance(item, str):
            wanted.append({names[0]: item})
            why.append(f"entry {i} is a string, not a mapping")
        elif isinstance(item, dict):
            wanted.append(dict(item))
        else:
            wanted.append({})
            why.append(f"entry {i} is {type(item).__name__}, not a mapping")
    return wanted, "; ".join(why)


def _holds(cfg: DictConfig, key: str) -> bool:
    """Whether the composed ``cfg`` has ``key`` (with any value, even ``???``)."""
    parent_path, _, leaf = key.rpartition(".")
    try:
        parent = OmegaConf.select(cfg, parent_path, throw_on_missing=False) if parent_path else cfg
    except OmegaConfBaseException:
        return False
    return isinstance(parent, DictConfig) and leaf in parent


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value at ``key`` as written (an interpolation unresolved), for a report."""
    parent_path, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_path, throw_on_missing=False) if parent_path else cfg
    return hydra_compat.raw_value(parent, leaf)


def open_mapping_adds(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with ``+key=value`` under an open mapping of the schema (such as
    ``task.params``, a ``dict[str, Any]`` of the generator's arguments) written as
    ``++key=value``: adding an argument is what the user means, whether or not the chosen
    option already sets it (Hydra's ``+`` refuses a key that is there). A key of an entry
    of ``task.rewards`` is set the same way, with or without '+'."""
    out = []
    for text in overrides:
        key = text[1:].partition("=")[0]
        parent = key.rpartition(".")[0]
        adds = text.startswith("+") and not text.startswith("++") and "=" in text
        if adds and parent and typing.get_origin(schema_type(parent)[0]) is dict:
            text = "+" + text
        elif _entry_mapping_key(text):
            # task.environment._target_=mod.Env (and its constructor's keys) is an entry,
            # as a reward's is: set whether or not a file wrote the key.
            text = "++" + text.lstrip("+")
        elif _entry_key(text):
            # task.rewards.0.weight=2 sets the entry's key whether or not its file wrote
            # it (an entry is an open mapping; the fit gives it its defaults afterwards).
            text = "++" + text.lstrip("+")
        out.append(text)
    return out


#: Mappings that are one entry (``_target_`` and its constructor's keys): a key of
#: theirs is set by a plain override, as a reward entry's key is.
ENTRY_MAPPINGS = ("task.environment",)


def _entry_mapping_key(text: str) -> bool:
    """Whether the override ``text`` sets an :data:`ENTRY_MAPPINGS` mapping or one of its
    keys (``task.environment._target_=mod.Env``, ``task.environment={...}``)."""
    if text.startswith(("~", "++")) or "=" not in text:
        return False
    key = text.lstrip("+").partition("=")[0]
    return any(key == m or key.startswith(m + ".") for m in ENTRY_MAPPINGS)


def _entry_key(text: str) -> bool:
    """Whether the override ``text`` sets one key of an existing-index entry of a list of
    entries (``task.rewards.0.weight=2``, not the list itself)."""
    if text.startswith("~") or "=" not in text:
        return False
    key = text.lstrip("+").partition("=")[0]
    entries = _entry_list(key)
    if entries is None or key == entries[0]:
        return False
    index, _, leaf = key[len(entries[0]) + 1 :].partition(".")
    return index.isdigit() and bool(leaf) and "." not in leaf


def _message(exc: BaseException) -> str:
    parts = [str(exc).strip()]
    if exc.__cause__ is not None and str(exc.__cause__).strip():
        parts.append(str(exc.__cause__).strip().splitlines()[0])
    text = " ".join(p.replace("\n", " ") for p in parts if p)
    return " ".join(text.split())


def announce_warnings(problems: Sequence[Problem]) -> None:
    """Print the warnings among ``problems`` on stderr, in one report."""
    found = warnings_of(problems)
    if found:
        sys.stderr.write(format_report(found) + "\n")


def compose(
    overrides: Sequence[str] = (),
    config_name: str = CONFIG_NAME,
    *,
    config_dir: str | None = None,
    return_hydra_config: bool = False,
) -> DictConfig:
    """Compose a run config for notebooks and tests; only validated configs come back.

    Returns the typed run config with every interpolation resolved (or, with
    ``return_hydra_config``, the composed config with its ``hydra`` node). Raises
    :class:`ConfigValidationError` listing every problem; prints warnings. A relative
    ``config_dir`` is taken from the current directory at each call.
    """
    from art_hydra.config.yaml_guard import config_file_problems

    unsafe = config_file_problems(config_dir)
    if unsafe:
        raise ConfigValidationError(unsafe)
    overrides = settled(open_mapping_adds(overrides))
    loader = make_loader(config_dir)
    result = compose_and_check(loader, config_name, overrides, RunMode.RUN)
    if not result.ok:
        raise ConfigValidationError(
            result.problems, revealed=revealed_by_fixes(result, loader, config_name, overrides)
        )
    announce_warnings(result.problems)
    assert result.resolved is not None
    if return_hydra_config:
        with open_dict(result.resolved):
            result.resolved[HYDRA_KEY] = result.hydra
    return result.resolved


def revealed_by_fixes(
    result: Composition,
    loader: ConfigLoader,
    config_name: str | None,
    overrides: Sequence[str],
    world: Callable[[Composition], None] | None = None,
) -> list[tuple[int, Problem]]:
    """The errors a refused ``result``'s fixes reveal (:mod:`art_hydra.config.fix_chain`),
    each checked as ``result`` was: composed like it, under the same hand (a fix grants
    no trust), then ``world`` (the CLI's world pre-flight, which adds its problems to a
    :class:`Composition`) where given. Never raises: a report is not lost to what only
    adds to it."""

    def check(fixed: list[str]) -> tuple[list[Problem], DictConfig | None]:
        again = compose_and_check(
            loader, config_name, settled(fixed), RunMode.RUN, hand=result.hand
        )
        if world is not None:
            world(again)
        return again.problems, again.resolved

    try:
        return follow(result.problems, result.resolved, overrides, check).revealed
    except Exception:
        return []


def validate(cfg: Any, *, footer: str | None = NOTHING_STARTED) -> DictConfig:
    """Validate a config from anywhere (composed, built by hand, a RunConfig) and return it
    typed and resolved. Raises :class:`ConfigValidationError` with every problem."""
    typed, problems = check(cfg)
    if errors(problems):
        raise ConfigValidationError(problems, footer=footer)
    announce_warnings(problems)
    return typed
