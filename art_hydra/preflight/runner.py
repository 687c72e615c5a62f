"""The world pre-flight's runner: every registered world check run on one config, the
run folder's verdict beside them, and the findings joined to composition's report.

The callers (the CLI before Hydra creates the run folder, each sweep point's pre-flight,
every job and ``train(cfg)``) come here, so a check registered once runs in all of them;
art_hydra's own checks register at the end of this module, as a plugin's would, in the
order the report lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from art_hydra.config import secrets
from art_hydra.config.composition import Composition
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.trust import by_hand
from art_hydra.preflight.common import world_problem
from art_hydra.preflight.devices import backend_problems
from art_hydra.preflight.environments import environment_problems as agent_problems
from art_hydra.preflight.epochs import settle_steps, sizing_problems
from art_hydra.preflight.evaluation import evaluation_problems
from art_hydra.preflight.folders import for_sweep, run_folder_problems
from art_hydra.preflight.model import model_problems
from art_hydra.preflight.model_load import model_load_problems
from art_hydra.preflight.rank_memory import sharding_problems
from art_hydra.preflight.rollout_engine import rollout_engine_problems
from art_hydra.preflight.task import task_problems
from art_hydra.preflight.trackers import tracker_problems
from art_hydra.preflight.world_check_registry import (
    crashed,
    plugin_problems,
    registered_world_checks,
    world_check,
)
from art_hydra.runs import run_folder


def world_problems(
    cfg: DictConfig,
    run_dir: str | Path | None,
    *,
    devices_here: bool = True,
    sweep: bool | None = None,
    failed: frozenset[str] = frozenset(),
    reuse: dict | None = None,
) -> list[Problem]:
    """Everything the files and the environment say about ``cfg`` (a resolved config).

    ``failed``: keys that already have an error (composition reported them, and put
    them back to their defaults, which may be ``???``); a check that reads the section
    of one left without a readable value is skipped, so it never trips over it.

    ``devices_here=False`` leaves GPUs to the job, for a launcher that runs it on other
    machines (a SLURM sweep is often sent from a login node without one). ``sweep``:
    whether ``cfg`` is a sweep job's (its folder fixes then name ``hydra.sweep.dir``;
    None: as Hydra says in a job, else no). ``reuse``: the environment's verdicts on the
    configs checked before in one report (:func:`_environment_once`).
    """
    found = _environment_once(cfg, devices_here, failed, reuse)
    # The data is counted now: a run sized by trainer.num_train_epochs gets its steps
    # here, once, before the run folder's checks compare them with a resume's.
    found += sizing_problems(cfg, failed)
    settle_steps(cfg, failed)
    if run_dir is not None:
        found += _folder_verdict(cfg, run_dir, sweep)
    return strictly(cfg, found)


#: The sections :func:`environment_problems` reads: two configs that agree on these get
#: the same verdict (a sweep's pre-flight checks each distinct combination once). A
#: built-in check that reads another section must add it here, and to its entry in
#: :data:`_READS`; a registered check's ``reads`` join them (:func:`environment_sections`).
ENVIRONMENT_SECTIONS = (
    "task",
    "model",
    "backend",
    "distributed",
    "algorithm",
    "rl",
    "sft",
    "seed",
    "strict",
    "logging",
    "eval",
    "rollout",
    "timeouts",
)


def environment_sections() -> tuple[str, ...]:
    """:data:`ENVIRONMENT_SECTIONS` and those registered world checks read besides."""
    reads = (r for check in registered_world_checks().values() for r in check.reads)
    return tuple(dict.fromkeys((*ENVIRONMENT_SECTIONS, *reads)))


#: The sections each built-in environment check reads: it is skipped when one of them
#: holds a key composition refused and left without a readable value (put back to a
#: ``???`` default, or an interpolation that does not resolve). Each is registered with
#: these as its ``reads`` (:func:`world_check`, at the end of this module).
_READS: dict[str, tuple[str, ...]] = {
    "task": ("task", "model", "algorithm", "rl", "sft", "seed", "timeouts"),
    "model": ("model", "task", "algorithm", "rl", "sft"),
    "model_load": ("model", "backend"),
    "backend": ("backend", "distributed", "model"),
    "trackers": ("logging",),
    "eval": ("eval", "task", "model", "algorithm", "rl", "sft", "seed"),
    "rollout": ("rollout", "model", "backend", "algorithm", "rl", "eval"),
    "environments": ("task", "model", "algorithm", "rl", "sft", "seed", "timeouts"),
    "ranks": ("distributed", "model", "backend", "algorithm", "rl", "eval", "rollout"),
}


def _section(key: str) -> str:
    """The top-level section of a problem's key (``task.reward._target_`` -> ``task``;
    an override's text ``+model.name=x`` -> ``model``)."""
    return key.lstrip("+~").partition("=")[0].partition(".")[0].partition("[")[0]


def environment_problems(
    cfg: DictConfig, devices_here: bool = True, failed: frozenset[str] = frozenset()
) -> list[Problem]:
    """The task's code and data, the model's files and the backend's devices; a check
    that reads a section where one of the ``failed`` keys has no readable value is
    skipped, and a check that still trips over a value it cannot read names that key
    (never a traceback)."""
    flawed = {_section(k) for k in failed if _unreadable_value(cfg, k)}
    found: list[Problem] = plugin_problems()
    for check in registered_world_checks().values():
        if flawed & set(check.reads):
            continue
        try:
            args = (cfg, devices_here) if check.devices else (cfg,)
            found += check.fn(*args) or ()
        except OmegaConfBaseException as exc:  # a value no check could read (``???``)
            found.append(_unreadable(exc))
        except Exception as exc:  # a plugin's bug is reported, art_hydra's own raises
            if check.builtin:
                raise
            found.append(crashed(check, exc))
    return found


def _environment_once(
    cfg: DictConfig, devices_here: bool, failed: frozenset[str], reuse: dict | None
) -> list[Problem]:
    """:func:`environment_problems`, or its verdict on a config checked before into
    ``reuse`` that agrees with ``cfg`` on every section the checks read and on the
    sections skipped (:data:`ENVIRONMENT_SECTIONS`' contract): a refused run's fixes
    change a trainer value, and the data is not streamed again to check them. Kept for
    one report only: files may change between two commands."""
    if reuse is None:
        return environment_problems(cfg, devices_here, failed)
    try:
        raw: Any = OmegaConf.to_container(cfg, resolve=False)
        flawed = sorted({_section(k) for k in failed if _unreadable_value(cfg, k)})
        key = repr((devices_here, flawed, [raw.get(s) for s in environment_sections()]))
    except Exception:  # a config that cannot be keyed is simply checked
        return environment_problems(cfg, devices_here, failed)
    if key not in reuse:
        reuse[key] = environment_problems(cfg, devices_here, failed)
    return list(reuse[key])


def _unreadable_value(cfg: DictConfig, key: str) -> bool:
    """Whether ``key`` (a key composition refused) still holds no value a check could
    read: ``???`` (a mandatory value put back to its default) or an interpolation that
    does not resolve. A value refused for what it is stays readable; the problems found
    on it again are left out of the report."""
    key = key.lstrip("+~").partition("=")[0]
    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
    except OmegaConfBaseException:
        return True
    except Exception:  # not a key at all (an override's text, a group)
        return False
    return isinstance(value, str) and value == "???"


def _unreadable(exc: OmegaConfBaseException) -> Problem:
    key = str(getattr(exc, "full_key", "") or "config")
    return world_problem(
        key,
        key,
        f"cannot be read by the world pre-flight: {str(exc).splitlines()[0]}",
        fix({key: placeholder("value")}),
    )


def folder_problems(
    cfg: DictConfig,
    run_dir: str | Path,
    sweep: bool | None = None,
    failed: frozenset[str] = frozenset(),
) -> list[Problem]:
    """The run folder's verdict; a folder that cannot be looked into is named, no traceback.
    A sweep's job folders are chosen by ``hydra.sweep.dir`` (``hydra.run.dir`` is ignored).
    A run sized by ``trainer.num_train_epochs`` (its steps not written into ``cfg``, which a
    sweep's points share) is sized here too, for the resume checks and the report (not
    where a key sizing reads is among the ``failed`` ones)."""
    return sizing_problems(cfg, failed) + _folder_verdict(cfg, run_dir, sweep)


def _folder_verdict(
    cfg: DictConfig, run_dir: str | Path, sweep: bool | None = None
) -> list[Problem]:
    try:
        folder = run_folder_problems(cfg, Path(run_dir))
    except OmegaConfBaseException as exc:  # a value no check could read (``???``)
        folder = [_unreadable(exc)]
    except OSError as exc:
        reason = f"cannot be checked: {exc.strerror or exc} ({exc.filename or run_dir})."
        folder = [world_problem("hydra.run.dir", str(run_dir), reason, fix(note="another folder"))]
    sweep = run_folder.in_sweep() if sweep is None else sweep
    return [for_sweep(p) for p in folder] if sweep else folder


def strictly(cfg: DictConfig, found: list[Problem]) -> list[Problem]:
    """Under ``strict=true`` every finding is an error."""
    if cfg.strict:
        return [Problem(p.key, p.value, p.reason, p.fix, p.kind) for p in found]
    return found


def add_world_problems(
    result: Composition, *, devices_here: bool = True, reuse: dict | None = None
) -> None:
    """Append the world's findings on a composed config to its report (a key whose value
    already has an error is not checked again). ``reuse``: one dict for the configs of
    one report (a refused run and its fixes, :func:`_environment_once`)."""
    if result.resolved is None:
        return
    if result.composed is not None:  # what the run's records keep as expressions
        secrets.remember(result.composed)
    failed = {p.key for p in result.problems if p.is_error}
    sweep = result.hydra is not None and result.hydra.get("mode") == RunMode.MULTIRUN
    with by_hand(result.hand):
        world = world_problems(
            result.resolved,
            result.run_dir,
            devices_here=devices_here,
            sweep=sweep or None,
            failed=frozenset(failed),
            reuse=reuse,
        )
    result.problems += [p for p in world if p.key not in failed]


def _register_own_checks() -> None:
    """art_hydra's own world checks, registered as a plugin's are, in the order they report."""
    for name, check, devices in (
        ("task", task_problems, False),
        ("model", model_problems, False),
        ("model_load", model_load_problems, False),
        ("backend", backend_problems, True),
        ("trackers", tracker_problems, False),
        ("eval", evaluation_problems, False),
        ("environments", agent_problems, False),
        ("rollout", rollout_engine_problems, True),
        ("ranks", sharding_problems, True),
    ):
        world_check(check, name=name, reads=_READS[name], devices=devices)


_register_own_checks()
