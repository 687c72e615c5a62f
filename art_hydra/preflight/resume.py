"""The run folder against ``resume``: a fresh run needs a folder without a run, a resume
needs an intact checkpoint and the same config as the run it continues, and ``auto``
takes whichever the folder holds. Each refusal names the way on (the saved value, a new
folder, ``resume=auto``), since a resume refused is a run the user wants to finish.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.config import fields, secrets
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.run_files import HYDRA_RECORD
from art_hydra.config.run_length import steps_named
from art_hydra.config.yaml_guard import YamlRefused, load_bounded
from art_hydra.preflight.common import world_problem
from art_hydra.preflight.epochs import run_steps
from art_hydra.runs import run_folder, run_identity


def _resume_fix(key: str, old: Any, saved: dict[str, Any] | None = None) -> Any:
    if key == "distributed.world_size" and isinstance(old, int):
        # The ranks come from the launch: each resumes its own sampler state.
        launch = f"torchrun --nproc_per_node={old} -m art_hydra ..." if old > 1 else "no torchrun"
        return fix(note=f"resume with {old} rank(s), as the run was launched: {launch}")
    if old is None and saved is not None and _saved_value(saved, key) is _ABSENT:
        return fix(drops=(key,))  # the run had no such key (an open mapping's): ~key
    return fix({key: old})


#: How a run folder is chosen, for a fix that names a fresh one (a sweep job's fixes
#: are rewritten to name hydra.sweep.dir: see :func:`.folders.for_sweep`).
NEW_FOLDER = "hydra.run.dir=<a new folder>"


def new_folder_fix() -> Any:
    return fix({"hydra.run.dir": placeholder("a new folder")})


def fresh_problems(cfg: DictConfig, run_dir: Path) -> list[Problem]:
    """``resume=false``: the folder must not hold a run already."""
    holds = run_folder.holds_run(run_dir, cfg.checkpoint.dir)
    if holds and run_folder.latest_intact(run_dir / cfg.checkpoint.dir)[0] is None:
        # A run that ended (kill -9, a crash) before its first checkpoint: nothing there
        # can be resumed, so resume=true would be refused too.
        return [
            world_problem(
                "resume",
                False,
                f"the run folder {run_dir} holds the records of a run that ended before "
                "its first checkpoint (nothing there can be resumed); training there "
                "would mix two runs in one record.",
                fix(
                    {"resume": "auto"},
                    f"start the run afresh there: it removes only that run's own records, "
                    f"those its {run_folder.RUN_MANIFEST} lists",
                    alt=fix(note=f"{NEW_FOLDER} to start afresh elsewhere"),
                ),
            )
        ]
    if holds:
        return [
            world_problem(
                "resume",
                False,
                f"the run folder {run_dir} already holds a run; training again there would "
                "mix two runs in one record and overwrite its checkpoints.",
                fix(
                    {"resume": True},
                    "continue that run",
                    alt=fix(note="hydra.run.dir=<a new folder> to start a fresh run"),
                ),
            )
        ]
    return []


def auto_problems(cfg: DictConfig, run_dir: Path) -> list[Problem]:
    """``resume=auto``: a run with a checkpoint is checked as a resume (finished or
    not: a finished run is skipped only if it is the same run); an empty folder, or
    the records of a run that ended before its first checkpoint, start afresh."""
    steps = run_steps(cfg)
    if steps is None:  # sized by data that cannot be counted: the sizing check says so
        return []
    verdict, _ = run_folder.auto_verdict(run_dir, cfg.checkpoint.dir, steps)
    if verdict in (run_folder.RESUME, run_folder.FINISHED):
        # A run that finished without checkpoints (checkpoint.every_steps=0, as sweeps
        # often set) is skipped if it is the same run; nothing needs loading.
        bare = run_folder.latest_intact(run_dir / cfg.checkpoint.dir)[0] is None
        finished_bare = verdict == run_folder.FINISHED and bare
        return resume_problems(cfg, run_dir, "auto", need_checkpoint=not finished_bare)
    if verdict == run_folder.BROKEN:
        _, skipped = run_folder.latest_intact(run_dir / cfg.checkpoint.dir)
        return [
            world_problem(
                "resume",
                "auto",
                f"{run_dir / cfg.checkpoint.dir} holds checkpoints, none of them intact "
                f"({'; '.join(skipped)}): the run can neither continue nor be replaced "
                "without losing them.",
                fix(note="move that folder aside, or hydra.run.dir=<a new folder>"),
            )
        ]
    return []


def resume_problems(
    cfg: DictConfig, run_dir: Path, value: Any, need_checkpoint: bool = True
) -> list[Problem]:
    """A resume's checks: an intact checkpoint, the same data, reward and model, and the
    saved config with only the keys that may change changed."""
    intact, skipped = run_folder.latest_intact(run_dir / cfg.checkpoint.dir)
    notes = [
        world_problem(
            "resume",
            value,
            f"a checkpoint will be skipped: {reason}; the newest intact one is used.",
            fix(note="nothing to do (delete the broken folder to silence this)"),
            warning=True,
        )
        for reason in skipped
    ]
    if intact is None and need_checkpoint:
        broken = f" ({'; '.join(skipped)})" if skipped else ""
        return [
            world_problem(
                "resume",
                value,
                f"{run_dir / cfg.checkpoint.dir} holds no complete checkpoint to resume "
                f"from{broken}.",
                fix(
                    {"resume": False},
                    "and hydra.run.dir=<a new folder> to start over",
                    alt=fix({"resume": "auto"}, "start the run afresh in this folder"),
                ),
            )
        ]
    notes += _fewer_steps_problems(cfg, run_dir, intact)
    notes += run_identity.resume_problems(cfg, run_dir)  # the data, reward, model it began on
    try:
        saved = run_folder.saved_config(run_dir)
    except run_folder.YamlRefused as exc:
        unreadable = f"the run's saved config cannot be read: {exc}; a resume is checked on it."
        return [*notes, world_problem("resume", value, unreadable, new_folder_fix())]
    if saved is None:
        return notes
    differ = [
        (key, old, new)
        for key, old, new in run_folder.differences(saved, secrets.for_comparison(cfg))
        if not run_folder.may_change(key)
    ]
    by_group, differ = _group_differences(differ, _chosen_groups(run_dir), saved)
    may = ", ".join(fields.may_change_keys())
    per_key = [
        world_problem(
            key,
            new,
            f"differs from the run's saved config ({run_folder.RUN_CONFIG}: {old!r}); a resume "
            "continues the same run, and the checkpoint was written under the saved value. "
            f"Only {may} may change.",
            _resume_fix(key, old, saved),
        )
        for key, old, new in differ
    ]
    return notes + by_group + per_key


#: A group option's name as a recorded override may give it (``task=dataset``); any other
#: text in the run's record is not offered as a fix.
_OPTION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
#: The most overrides read from a run's record (its own command line).
_MAX_RECORDED = 500


def _chosen_groups(run_dir: Path) -> dict[str, tuple[str, list[str]]]:
    """``group -> (the option the run chose by hand, the keys under the group its command
    line set)``, read from Hydra's record of the run (``.hydra/overrides.yaml``) as data:
    bounded, only plain option names, nothing if it cannot be read."""
    path = run_dir / HYDRA_RECORD / "overrides.yaml"
    if not path.is_file():
        return {}
    try:
        recorded = OmegaConf.to_container(load_bounded(path), resolve=False)
    except (YamlRefused, ValueError):
        return {}
    if not isinstance(recorded, list):
        return {}
    texts = [t for t in recorded[:_MAX_RECORDED] if isinstance(t, str) and "=" in t]
    keys = [text.partition("=")[0].lstrip("+~") for text in texts]
    chosen = {
        key: text.partition("=")[2]
        for key, text in zip(keys, texts, strict=True)
        if "." not in key and "/" not in key and _OPTION.match(text.partition("=")[2])
    }
    return {
        group: (option, [k for k in keys if k.startswith(f"{group}.")])
        for group, option in chosen.items()
    }


def _saved_value(saved: dict[str, Any], key: str) -> Any:
    node: Any = saved
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return _ABSENT if isinstance(node, (dict, list)) and not node else node


_ABSENT = object()


def _group_differences(
    differ: list[tuple[str, Any, Any]],
    chosen: dict[str, tuple[str, list[str]]],
    saved: dict[str, Any],
) -> tuple[list[Problem], list[tuple[str, Any, Any]]]:
    """The differences under a group the run chose by hand (``task=dataset``), each
    group's as one problem whose fix is the run's own choice and the values its command
    line set under it (``task=dataset task.path=...``): a resume that forgot the group
    differs in every key the option sets, and ``remove task.generator`` cannot be pasted.
    Returns those problems and the differences left (per key)."""
    problems: list[Problem] = []
    left = list(differ)
    for group, (option, set_keys) in chosen.items():
        mine = [d for d in left if d[0].startswith(f"{group}.")]
        if not mine:
            continue
        sets: dict[str, Any] = {group: option}
        for key in set_keys:
            value = _saved_value(saved, key)
            if value is not _ABSENT and not isinstance(value, (dict, list)):
                sets[key] = value
        names = ", ".join(key for key, _, _ in mine[:6]) + (", ..." if len(mine) > 6 else "")
        problems.append(
            world_problem(
                group,
                group,
                f"the run was started with {group}={option} (its {HYDRA_RECORD}/overrides.yaml), "
                f"and this config's {group} differs from the run's saved config "
                f"({run_folder.RUN_CONFIG}) in {len(mine)} key(s): {names}. A resume continues "
                "the same run, under the settings its checkpoint was written with.",
                fix(sets),
            )
        )
        left = [d for d in left if d not in mine]
    return problems, left


def _fewer_steps_problems(cfg: DictConfig, run_dir: Path, intact: Path | None) -> list[Problem]:
    """A resume whose ``trainer.max_steps`` is below the steps the run already took: it
    cannot train backwards, and going on would rewrite the run's saved config with a step
    count its own checkpoints contradict (a finished run of that many steps is skipped
    only when it is that run, as ``resume=auto`` does)."""
    saved = run_folder.checkpoint_step(intact) if intact is not None else None
    if saved is None:
        status, steps = run_folder.result_status(run_dir)
        saved = steps if status == "done" else None
    wanted = run_steps(cfg)
    if saved is None or wanted is None or saved <= wanted:
        return []
    return [
        world_problem(
            "trainer.max_steps",
            wanted,
            f"the run in {run_dir} has already trained {saved} steps, more than "
            f"{steps_named(cfg, wanted)}: a resume continues a run and cannot undo steps.",
            fix(
                {"trainer.max_steps": saved},
                "keep the run as it is; a larger count trains it further",
                alt=fix(note=f"{NEW_FOLDER} for a shorter run from the start"),
            ),
        )
    ]
