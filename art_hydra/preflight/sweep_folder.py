"""Whether a sweep's folder may take this sweep, checked once by the sweeper before it
writes ``multirun.yaml`` or launches a job: two sweeps in one folder would share job
folders and mislabel each other's results, so a folder holding another sweep (or
entries of no sweep) is refused, and the same sweep again continues only under
``resume=auto`` or ``resume=true``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.config import fields, run_files
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.preflight.common import world_problem
from art_hydra.preflight.folders import creation_refusal, shown
from art_hydra.runs import run_folder
from art_hydra.safe_paths import path_refusal

#: Overrides that do not make a sweep another sweep: the switches of one invocation,
#: the folders (a sweep continued names its folder by hand), and how the same points
#: are launched (keys starting with these).
_SWEEP_SWITCHES = (
    "resume",
    "dry_run",
    "strict",
    "hydra.sweep.dir",
    "hydra.run.dir",
    "hydra/launcher",
    "hydra.launcher.",
    "hydra.sweeper.max_batch_size",
    "hydra.sweeper.skip_invalid",
)
#: The largest multirun.yaml read (real ones are a few kilobytes).
_MULTIRUN_MAX_BYTES = 4 << 20


def _override_key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def _switch(key: str) -> bool:
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in _SWEEP_SWITCHES)


def sweep_signature(cfg: Any) -> dict[str, Any]:
    """What makes a sweep this sweep: its command-line overrides (task and hydra, in
    order: the order numbers the points) without the switches and folders, and the
    sweeper's own ``params``. ``cfg`` is a sweep's master config, or its saved
    ``multirun.yaml``."""
    overrides = OmegaConf.select(cfg, "hydra.overrides", default=None)
    given = OmegaConf.to_container(overrides, resolve=False) if overrides is not None else {}
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None)
    assert isinstance(given, dict)
    return {
        part: [
            str(o)
            for o in given.get(part) or []
            if not _switch(_override_key(str(o))) and not _may_change(str(o))
        ]
        for part in ("task", "hydra")
    } | {"params": OmegaConf.to_container(params, resolve=False) if params is not None else {}}


def _may_change(override: str) -> bool:
    """A fixed value of a key a resume may change (``trainer.max_steps=60`` raised to 80
    to extend every point): the same sweep, continued; each job's resume checks it."""
    key, _, value = override.partition("=")
    key = key.lstrip("+~")
    if "," in value or "(" in value:  # a swept key numbers the points
        return False
    return fields.may_change(key)


def _sweep_folder(value: str, reason: str, remedy: Any) -> Problem:
    return world_problem("hydra.sweep.dir", value, reason, remedy)


_NEW_SWEEP = fix({"hydra.sweep.dir": placeholder("a new folder")})


def sweep_folder_problems(
    sweep_dir: str | Path, master_cfg: Any, resume_mode: Any = None
) -> list[Problem]:
    """Whether ``sweep_dir`` may take this sweep: called once by the sweeper, before it
    writes ``multirun.yaml`` or launches a job. A folder that is absent or empty is
    fresh. One that holds another sweep (a ``multirun.yaml`` whose overrides differ, the
    switches and folders aside), or entries without any ``multirun.yaml``, is refused:
    the two sweeps' jobs would share folders and mislabel each other's results. The
    same sweep again is accepted with ``resume=auto`` (finished points skipped, stopped
    ones resumed, the rest started) or ``resume=true`` (every point must resume); with
    ``resume=false`` it is refused once its jobs have started, naming ``resume=auto``.
    ``resume_mode`` defaults to the master's ``resume``."""
    folder = Path(sweep_dir)
    value = str(sweep_dir)
    names, problems = _sweep_folder_entries(folder, value)
    if problems or not names:
        return problems
    problems = _another_sweep_problems(folder, value, names, master_cfg)
    if problems:
        return problems
    return _sweep_restart_problems(folder, value, names, master_cfg, resume_mode)


def _sweep_folder_entries(folder: Path, value: str) -> tuple[list[str], list[Problem]]:
    """The sweep folder's entries, sorted (none: absent or empty, a fresh sweep), or why
    no sweep can be written there (a path refused, not creatable, not a folder, the root
    or home directory, unreadable)."""
    refusal = path_refusal(folder)
    if refusal is not None:
        return [], [_sweep_folder(value, f"{refusal}.", fix(note="a shorter path"))]
    kind = run_folder.entry_kind(folder)
    if kind is None:
        uncreatable = creation_refusal(folder)
        return [], [] if uncreatable is None else [_sweep_folder(value, uncreatable, _NEW_SWEEP)]
    resolved = folder.resolve()
    if kind != "folder" or resolved in (Path(resolved.anchor), Path.home().resolve()):
        what = "is not a folder" if kind != "folder" else "is the root or home directory"
        reason = f"{what}: a sweep writes its jobs' folders there."
        return [], [_sweep_folder(value, reason, _NEW_SWEEP)]
    try:
        return sorted(os.listdir(folder)), []
    except OSError as exc:
        return [], [_sweep_folder(value, f"cannot be read: {exc.strerror or exc}.", _NEW_SWEEP)]


def _another_sweep_problems(
    folder: Path, value: str, names: list[str], master_cfg: Any
) -> list[Problem]:
    """A folder with entries that is not this sweep's: no ``multirun.yaml`` (not a
    sweep's folder), one that cannot be read, or one of a sweep with other overrides."""
    saved_name = run_files.SWEEP_FILES[0]  # multirun.yaml
    if saved_name not in names:
        return [
            _sweep_folder(
                value,
                f"holds entries ({shown(names)}) but no {saved_name}: it is not the folder of a "
                "sweep, and the sweep's jobs would mix their files with what is there.",
                _NEW_SWEEP,
            )
        ]
    saved = _saved_sweep(folder / saved_name)
    if isinstance(saved, str):
        return [_sweep_folder(value, saved, _NEW_SWEEP)]
    old, new = sweep_signature(saved), sweep_signature(master_cfg)
    if old != new:
        return [
            _sweep_folder(
                value,
                f"holds another sweep ({saved_name}: {_sweep_difference(old, new)}); the two "
                "sweeps' jobs would share folders and mislabel each other's results.",
                fix(
                    note="hydra.sweep.dir=<a new folder>, or the same overrides as that sweep "
                    "with resume=auto to continue it"
                ),
            )
        ]
    return []


def _sweep_restart_problems(
    folder: Path, value: str, names: list[str], master_cfg: Any, resume_mode: Any
) -> list[Problem]:
    """This same sweep again: refused under ``resume=false`` once any job folder exists
    (it would train over those runs), naming ``resume=auto``."""
    mode = run_folder.resume_mode(
        {"resume": master_cfg.get("resume", False) if resume_mode is None else resume_mode}
    )
    started = [n for n in names if (folder / n).is_dir() and not n.startswith(".")]
    if mode == "false" and started:
        return [
            _sweep_folder(
                value,
                f"holds this sweep already, with {len(started)} job folder(s): starting it "
                "again there would train over its runs.",
                fix(
                    {"resume": "auto"},
                    "continue it: finished points are skipped, stopped ones resumed, the "
                    "rest started",
                    alt=_NEW_SWEEP,
                ),
            )
        ]
    return []


def _saved_sweep(path: Path) -> DictConfig | str:
    """A sweep folder's ``multirun.yaml`` (bounded, never through a link), or why not."""
    from art_hydra.config.yaml_guard import YamlRefused, load_bounded

    if run_folder.entry_kind(path) != "file":
        return f"holds {path.name} that is not a regular file."
    try:  # bounded: size, nesting and YAML aliases (a few hundred bytes can expand forever)
        loaded = load_bounded(path, max_bytes=_MULTIRUN_MAX_BYTES)
    except YamlRefused as exc:
        return f"holds a {path.name} that cannot be read within bounds: {exc}."
    except Exception as exc:  # a torn or foreign file: named, never a traceback
        return f"holds a {path.name} that cannot be read ({type(exc).__name__}: {exc})."
    if not isinstance(loaded, DictConfig):
        return f"holds a {path.name} that is not a sweep's config."
    return loaded


def _sweep_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The first way the saved sweep differs from this one, in words."""
    for part in ("task", "hydra"):
        if old[part] != new[part]:
            return f"its {part} overrides were {old[part]}, now {new[part]}"
    return f"its hydra.sweeper.params were {old['params']}, now {new['params']}"
