"""Pre-flight of many sweep points: the verdict of full composition, at a fraction of its cost.

Composing a point from scratch costs Hydra about 90 ms (the defaults tree, merges, a
dozen YAML reads), so a 1,000-point grid waited most of two minutes. Points of a sweep
differ in a few values. :class:`PointChecker` composes once per distinct group selection
(the *base*), keeps the base both as Hydra composed it and resolved onto the schema,
and checks a point by setting its values on them, re-resolving what is interpolated,
running the bounds and every validator, and putting the base back. What does not vary
is shared: the trust check's group contents and verdict, the job-independent
interpolations' values, the probe of the sweep folder, and each validator's and world
check's verdict by the values it read (:mod:`art_hydra.sweeps.remembered_checks`), so a
point that changes a value re-runs only the checks that read it.

The fast way is taken only where it is sure to agree with full composition: plain
``key=value`` overrides of scalar run-config values on a base without problems of its
own. Anything else (``+``/``~`` overrides, ``hydra.*`` keys, interpolated override values,
lists, a value outside its bound, a value a config file may not choose) goes through
:func:`~art_hydra.config.composition.compose_and_check`, which also writes the report's
wording, so a point's problems are the same whichever way it went (tested on random grids).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf

from art_hydra.config import hydra_compat, inert
from art_hydra.config.bounds import canonical
from art_hydra.config.composition import (
    Composition,
    _group_content,
    compose_and_check,
    origins_of_composed,
    settle,
)
from art_hydra.config.fields import info_of
from art_hydra.config.problems import Kind, Problem, fix
from art_hydra.config.structure import HYDRA_KEY, fit
from art_hydra.config.trust import Hand, by_hand, trust_problems
from art_hydra.preflight.folders import remembered_probes
from art_hydra.preflight.runner import add_world_problems, folder_problems, strictly
from art_hydra.sweeps import remembered_checks
from art_hydra.sweeps.read_trace import Memo, Tree

_SCALARS = (bool, int, float, str, Enum, type(None))
#: The run-config keys the trust check reads (under these sections).
_TRUST = ("model.", "task.")
#: Interpolations in the ``hydra`` node that cannot read a run-config value.
#: A sweep folder whose only interpolations are timestamps (fixed for the whole sweep).
_HYDRA_ONLY_NOW = re.compile(r"(?:[^$]|\$\{now:[^}]*\}|\$\{art_hydra\.unique:\})*")
#: An innermost interpolation that reads the same in every job: another run-config key
#: (``${trainer.max_steps}``), or a resolver of its arguments alone (conf/model/tiny.yaml).
_PLAIN_REF = re.compile(
    r"\$\{(?:(?!hydra\b)[A-Za-z_]\w*(?:\.\w+)*|art_hydra\.(?:room|by_finetune):[^${}]*)\}"
)
_INNERMOST = re.compile(r"\$\{[^${}]*\}")
_REF_NAME = re.compile(r"\$\{([A-Za-z_]\w*(?:\.\w+)*)\}")
_HYDRA_ONLY = re.compile(
    r"\$\{(hydra[.:]|now:|art_hydra\.job_record:|art_hydra\.keys:|art_hydra\.unique:)"
)


@dataclass
class _Base:
    """One group selection of the sweep: composed (kept as Hydra made it) and resolved."""

    composed: DictConfig
    typed: DictConfig
    #: Run-config leaves whose value is an interpolation (re-resolved for each point).
    interpolated: list[str]
    chosen: Callable[[str], Any]
    #: Whether an interpolation in the ``hydra`` node reads a run-config value.
    hydra_reads_run: bool = True
    #: Who set what (:func:`art_hydra.config.inert.origins_of`), as the full way traces it
    #: for the checks of settings the run never reads.
    origins: inert.Origins | None = None
    trust: dict[tuple, bool] = field(default_factory=dict)
    #: Each validator's and world check's verdicts, by the values it read.
    memo: Memo = field(init=False)

    def __post_init__(self) -> None:
        self.memo = Memo(Tree(self.typed))

    #: Whether every interpolated leaf is a plain reference to a run-config key (read the
    #: same with or without the job's view of the ``hydra`` node).
    plain_refs: bool = False
    #: Of each plain interpolated leaf, the keys it names (None: one is interpolated too).
    refs: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    #: Each plain interpolated leaf's value, by the values of the keys it names.
    resolutions: dict[tuple, Any] = field(default_factory=dict)
    #: The sweep folder, where it is the same for every job of the base (else None).
    sweep_dir: str | None = None


class PointChecker:
    """Checks the points of one sweep, as each job will see them."""

    def __init__(
        self,
        loader: ConfigLoader,
        master: DictConfig,
        hand: Hand | None,
        *,
        devices_here: bool = True,
        fast_way: bool = True,
    ) -> None:
        search_path = getattr(loader, "config_search_path", None)
        if not hasattr(loader, "parse") and search_path is not None:
            loader = hydra_compat.caching_loader(search_path)
        self.loader = loader
        self.master = master
        self.hand = hand
        self.devices_here = devices_here
        self.fast_way = fast_way
        self.fixed = hydra_compat.raw_list(master.hydra.overrides.hydra)
        #: What the sweep varies: a value it makes inert at some points is deliberate.
        params = OmegaConf.select(master, "hydra.sweeper.params", default=None)
        self.swept = inert.swept_keys(hydra_compat.raw_list(master.hydra.overrides.task)) | {
            str(k) for k in (params or {})
        }
        self._bases: dict[tuple[str, ...], _Base | None] = {}
        #: How many points took the fast way (the rest: full composition).
        self.fast = 0
        #: Job number -> the folder it runs in, for every point checked.
        self.run_dirs: dict[int, str] = {}
        self._owners: dict[str, int] = {}
        #: Folders probed for a new job folder, each once per sweep.
        self._probed: dict[Any, str | None] = {}

    # ---- the two ways ------------------------------------------------------------

    def problems(self, point: list[str], job_num: int) -> list[Problem]:
        """Every problem of ``point`` as job ``job_num``: composition, config, world, and
        a folder another point of the sweep already runs in."""
        with inert.sweeping(self.swept), remembered_probes(self._probed):
            found = self._fast(point, job_num) if self.fast_way else None
            if found is None:
                result = self.full(point, job_num)
                if result.run_dir is not None:
                    self.run_dirs[job_num] = result.run_dir
                found = result.problems
            else:
                self.fast += 1
        return found + self._shared_folder(job_num)

    def _shared_folder(self, job_num: int) -> list[Problem]:
        """Two jobs of one sweep in one folder would mix one run's files with another's."""
        folder = self.run_dirs.get(job_num)
        if folder is None:
            return []
        owner = self._owners.setdefault(folder, job_num)
        if owner == job_num:
            return []
        subdir = hydra_compat.raw_value(self.master.hydra.sweep, "subdir")
        return [
            Problem(
                "hydra.sweep.subdir",
                subdir,
                f"gives points #{owner} and #{job_num} the same folder ({folder}): "
                "two jobs would write one run folder.",
                fix({"hydra.sweep.subdir": "${hydra.job.num}"}, "a folder per job"),
                Kind.world,
            )
        ]

    def full(self, point: list[str], job_num: int) -> Composition:
        """Full composition of one point, as the job will compose it."""
        result = compose_and_check(
            self.loader, None, point, master=self.master, job_num=job_num, hand=self.hand
        )
        add_world_problems(result, devices_here=self.devices_here)
        return result

    # ---- the fast way -------------------------------------------------------------

    def _fast(self, point: list[str], job_num: int) -> list[Problem] | None:
        """The point's problems the fast way, or None where only full composition can
        tell (any surprise on the way, too: an override Hydra refuses, a value that does
        not resolve; the full way then reports it; the bases are put back either way)."""
        try:
            return self._fast_way(point, job_num)
        except Exception:
            return None

    def _fast_way(self, point: list[str], job_num: int) -> list[Problem] | None:
        parse = getattr(self.loader, "parse", None)
        if parse is None:
            return None
        parsed = parse([*self.fixed, *point])
        groups, values = self.loader.split(self.master.hydra.job.config_name, parsed)  # type: ignore[attr-defined]
        own = parsed[len(self.fixed) :]
        if any(o.is_sweep_override() or o.is_hydra_override() for o in own):
            return None
        groups = [o for o in groups if not o.is_hydra_override()]
        values = [o for o in values if not o.is_hydra_override()]
        if not all(map(_plain, values)):
            return None
        base = self._base(tuple(o.input_line for o in groups), job_num)
        if base is None:
            return None
        composed, typed = base.composed, base.typed
        keys = [o.key_or_group for o in values]
        with _restoring(composed, keys):
            for o in values:
                hydra_compat.apply_override(composed, o)
            run_dir, changed = self._job_view(base, parsed, job_num, keys)
            if self._refused_by_trust(base, composed, values, changed):
                return None
            self.run_dirs[job_num] = run_dir
        if not all(isinstance(v, _SCALARS) for v in changed.values()):
            return None
        # settle may set trainer.max_steps (which key sizes the run): put back with the rest
        with _restoring(typed, [*changed, *({"trainer.max_steps"} - set(changed))]):
            for key, value in changed.items():
                parent, leaf = _parent(typed, key)
                parent[leaf] = _canonical(key, value)
            with inert.tracing(base.origins):
                if settle(typed, list(changed), self.hand):
                    return None  # a bound problem resets values: the full way reports it
            return self._checks(base, typed, run_dir)

    def _checks(self, base: _Base, typed: DictConfig, run_dir: str) -> list[Problem]:
        """The validators' and the world's verdict on the point set into ``typed``: each
        validator and world check runs again only where a value it read has changed."""
        memo = base.memo
        memo.begin()
        try:
            with inert.tracing(base.origins):  # who set what, as the full way says
                found = remembered_checks.rule_problems(typed, memo)
            failed = frozenset(p.key for p in found if p.is_error)
            with by_hand(self.hand):
                sweep = base.composed.hydra.get("mode") == RunMode.MULTIRUN
                world = [
                    *remembered_checks.world_problems(typed, memo, self.devices_here, failed),
                    *folder_problems(typed, run_dir, sweep or None, failed),
                ]
                world = strictly(typed, world)
        finally:
            memo.end()
        return found + [p for p in world if p.key not in failed]

    def _job_view(
        self, base: _Base, parsed: list[Override], job_num: int, keys: list[str]
    ) -> tuple[str, dict[str, Any]]:
        """The job's folder and the values of ``keys`` and of the interpolated leaves, as
        job ``job_num`` will see them. With nothing interpolated and a sweep folder that
        does not depend on the job, the folder is ``<sweep.dir>/<job number>``, known
        without building the job's view of the ``hydra`` node."""
        composed = base.composed
        if base.plain_refs and base.sweep_dir is not None:
            out = os.path.abspath(os.path.join(base.sweep_dir, str(job_num)))
            view = {k: OmegaConf.select(composed, k) for k in keys}
            return out, view | {k: _resolved(base, k) for k in base.interpolated}
        with hydra_compat.point_view(composed, parsed), hydra_compat.as_job(composed, job_num):
            run_dir = str(composed.hydra.runtime.output_dir)
            return run_dir, {k: OmegaConf.select(composed, k) for k in [*keys, *base.interpolated]}

    def _refused_by_trust(
        self, base: _Base, composed: DictConfig, values: list[Override], view: dict[str, Any]
    ) -> bool:
        """Whether the trust check refuses the point (then the full way reports it). The
        check reads a few run-config keys and the ``hydra`` node, which a point of the fast
        way does not change: its verdict is shared by every point that sets those keys
        alike and whose interpolated keys among them resolve alike (``view``: the job's
        values), unless the ``hydra`` node reads run-config values."""
        if base.hydra_reads_run:
            return bool(trust_problems(composed, self.hand, base.chosen))
        key = tuple(
            (o.key_or_group, repr(o.value())) for o in values if o.key_or_group.startswith(_TRUST)
        ) + tuple((k, repr(view[k])) for k in base.interpolated if k.startswith(_TRUST))
        if key not in base.trust:
            base.trust[key] = bool(trust_problems(composed, self.hand, base.chosen))
        return base.trust[key]

    def _base(self, groups: tuple[str, ...], job_num: int) -> _Base | None:
        if groups in self._bases:
            return self._bases[groups]
        base = None
        try:
            composed = self.loader.load_sweep_config(self.master, list(groups))
            chosen = _group_content(self.loader, composed)
            if not trust_problems(composed, self.hand, chosen):
                base = self._resolved_base(composed, chosen, job_num)
        except Exception:
            base = None
        self._bases[groups] = base
        return base

    def _resolved_base(
        self, composed: DictConfig, chosen: Callable[[str], Any], job_num: int
    ) -> _Base | None:
        import copy

        interpolated = list(_interpolated_leaves(composed))
        hydra = composed.hydra
        recorded = [
            *hydra_compat.raw_list(hydra.overrides.hydra),
            *hydra_compat.raw_list(hydra.overrides.task),
        ]
        parsed = self.loader.parse(recorded)  # type: ignore[attr-defined]
        with hydra_compat.point_view(composed, parsed), hydra_compat.as_job(composed, job_num):
            typed, problems = fit(copy.deepcopy(composed), in_place=True)
        with hydra_compat.read_write_open(typed):
            typed.pop(HYDRA_KEY, None)
        # As the full way (:meth:`full`) traces a sweep point: the master's primary config.
        primary = self.master.hydra.job.config_name
        origins = origins_of_composed(self.loader, primary, chosen, self.hand)
        with inert.tracing(origins):
            if problems or settle(typed, hand=self.hand):
                return None  # values reset to defaults: only the full way reports it right
        reads = _reads_run_config(composed.hydra)
        base = _Base(composed, typed, interpolated, chosen, hydra_reads_run=reads, origins=origins)
        raws = {k: str(hydra_compat.raw_value(*_parent(composed, k))) for k in interpolated}
        base.plain_refs = all(_job_independent(raw) for raw in raws.values())
        if base.plain_refs:
            base.refs = {k: _refs(raw, interpolated) for k, raw in raws.items()}
        sweep = composed.hydra.sweep
        fixed_dir = _HYDRA_ONLY_NOW.fullmatch(str(hydra_compat.raw_value(sweep, "dir")))
        if fixed_dir and hydra_compat.raw_value(sweep, "subdir") == "${hydra.job.num}":
            base.sweep_dir = str(sweep.dir)
        return base


def _resolved(base: _Base, key: str) -> Any:
    """The value of the interpolated leaf ``key``: a plain interpolation (see
    :func:`_job_independent`) is a function of the keys it names, so it is resolved once
    per distinct set of their values (OmegaConf parses the expression at every read)."""
    composed = base.composed
    refs = base.refs.get(key)
    if refs is None:
        return OmegaConf.select(composed, key)
    values = tuple(OmegaConf.select(composed, r) for r in refs)
    if not all(isinstance(v, _SCALARS) for v in values):
        return OmegaConf.select(composed, key)
    known = (key, tuple((type(v), v) for v in values))
    if known not in base.resolutions:
        base.resolutions[known] = OmegaConf.select(composed, key)
    return base.resolutions[known]


def _refs(raw: str, interpolated: list[str]) -> tuple[str, ...] | None:
    """The keys a plain interpolation names, or None where one of them is interpolated
    itself (then it is resolved at every point)."""
    names = tuple(_REF_NAME.findall(raw))
    return None if any(n in interpolated for n in names) else names


def _job_independent(raw: str) -> bool:
    """Whether the value ``raw`` resolves to is the same with or without the job's view of
    the ``hydra`` node: each interpolation in it, innermost first, is a plain one."""
    while "${" in raw:
        inner = _INNERMOST.findall(raw)
        if not inner or not all(_PLAIN_REF.fullmatch(i) for i in inner):
            return False
        raw = _INNERMOST.sub("0", raw)
    return True


def _plain(override: Override) -> bool:
    """A ``key=value`` of one run-config scalar, with no interpolation in the value."""
    if override.is_add() or override.is_delete() or override.is_force_add():
        return False
    if override.is_hydra_override() or override.package is not None:
        return False
    value = override.value()
    if isinstance(value, (dict, list)) or not isinstance(value, _SCALARS):
        return False
    return not (isinstance(value, str) and "${" in value)


def _canonical(key: str, value: Any) -> Any:
    info = info_of(key)
    bound = info.bound if info is not None else None
    return canonical(bound, value) if bound is not None and bound.aliases else value


def _interpolated_leaves(cfg: DictConfig, prefix: str = "") -> Iterator[str]:
    for key in cfg:
        if not prefix and key == HYDRA_KEY:
            continue
        path = f"{prefix}{key}"
        if OmegaConf.is_interpolation(cfg, key):
            yield path
            continue
        node = hydra_compat.child_node(cfg, key)
        if isinstance(node, DictConfig):
            yield from _interpolated_leaves(node, f"{path}.")
        elif isinstance(node, ListConfig) and _holds_interpolation(node):
            yield path  # a list is taken whole


def _holds_interpolation(node: Any) -> bool:
    if isinstance(node, (DictConfig, ListConfig)):
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        return any(
            OmegaConf.is_interpolation(node, k)
            or _holds_interpolation(hydra_compat.child_node(node, k))
            for k in keys
        )
    return False


@contextlib.contextmanager
def _restoring(cfg: DictConfig, keys: list[str]) -> Iterator[None]:
    """Put each of ``keys`` back as it was (its raw value, interpolations kept)."""
    saved = []
    for key in keys:
        parent, leaf = _parent(cfg, key)
        saved.append((parent, leaf, hydra_compat.raw_value(parent, leaf)))
    try:
        yield
    finally:
        for parent, leaf, value in reversed(saved):
            parent[leaf] = value


def _parent(cfg: DictConfig, key: str) -> tuple[DictConfig, str]:
    parent_key, _, leaf = key.rpartition(".")
    return (OmegaConf.select(cfg, parent_key) if parent_key else cfg), leaf


def _reads_run_config(node: Any) -> bool:
    """Whether any interpolation under ``node`` may read outside the ``hydra`` node."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        child = hydra_compat.child_node(node, key)
        if isinstance(child, (DictConfig, ListConfig)):
            if _reads_run_config(child):
                return True
            continue
        raw = hydra_compat.raw_value(node, key)
        if isinstance(raw, str) and raw.count("${") != len(_HYDRA_ONLY.findall(raw)):
            return True
    return False
