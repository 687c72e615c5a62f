"""Whether a path may be a run's folder: a path the run can create, not held by another
live run's lock, and not something else (the root, the home directory, a project, a
folder of other things, another program's records), since a run writes, replaces and
prunes its records there. What it then expects of the folder is :mod:`.resume`'s.

A sweep job's folder is chosen by ``hydra.sweep.dir``, which a sweep job's fixes name
instead of ``hydra.run.dir`` (:func:`for_sweep`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from art_hydra.config import run_files
from art_hydra.config.problems import Placeholder, Problem, fix, placeholder
from art_hydra.preflight.common import world_problem
from art_hydra.preflight.resume import (
    auto_problems,
    fresh_problems,
    new_folder_fix,
    resume_problems,
)
from art_hydra.runs import run_folder
from art_hydra.safe_paths import path_refusal


def for_sweep(problem: Problem) -> Problem:
    """The problem as a sweep job's: its folder is ``hydra.sweep.dir`` (plus the job's
    ``hydra.sweep.subdir``), and a fix naming ``hydra.run.dir``, which a sweep ignores,
    names ``hydra.sweep.dir`` instead; continuing names ``resume=auto``, which carries
    on the whole sweep."""
    key = "hydra.sweep.dir" if problem.key == "hydra.run.dir" else problem.key
    return Problem(
        key,
        problem.value,
        problem.reason,
        _sweep_fix(problem.fix),
        problem.kind,
        problem.severity,
    )


_SWEEP_WORDS = (
    ("hydra.run.dir=<the folder of the run to resume>", "hydra.sweep.dir=<the sweep's folder>"),
    ("hydra.run.dir=", "hydra.sweep.dir="),
    ("hydra.run.dir", "hydra.sweep.dir"),
)


def _sweep_value(key: str, value: Any) -> Any:
    if isinstance(value, Placeholder) and value == "the folder of the run to resume":
        return placeholder("the sweep's folder")
    return "auto" if key == "resume" and value else value


def _sweep_fix(remedy: Any) -> Any:
    if isinstance(remedy, str):
        for old, new in _SWEEP_WORDS:
            remedy = remedy.replace(old, new)
        return remedy
    if remedy is None:
        return None
    sets = tuple(
        ("hydra.sweep.dir" if k == "hydra.run.dir" else k, _sweep_value(k, v))
        for k, v in remedy.sets
    )
    return type(remedy)(sets, _sweep_fix(remedy.note), _sweep_fix(remedy.alt), remedy.drops)


def busy_folder_problems(run_dir: Path) -> list[Problem]:
    """Another live run holds the folder's lock (checked first thing in every job, before
    the job logs or writes anything there)."""
    if path_refusal(run_dir) is not None:
        return []  # run_folder_problems names the path itself
    holder = run_folder.lock_holder(run_dir) if run_dir.is_dir() else None
    if holder is None:
        return []
    found = [
        world_problem(
            "hydra.run.dir",
            str(run_dir),
            f"is in use by {run_folder.describe_holder(holder)}, whose run holds its lock "
            f"({run_folder.LOCK}): two runs in one folder would overwrite each other's "
            "checkpoints and mix their records.",
            fix(note="wait for that run to end, or hydra.run.dir=<a new folder>"),
        )
    ]
    return [for_sweep(p) for p in found] if run_folder.in_sweep() else found


def shown(names: list[str]) -> str:
    """Names as a report lists them: the first five, then how many more."""
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _not_a_run_folder(cfg: DictConfig, run_dir: Path) -> str | None:
    """Why ``run_dir`` cannot be a run folder (None: it can): ``/``, the home directory,
    something that is not a folder, a project (a repository, a package) or a folder of
    many other things, a link where a record goes, or another program's file under the
    name of a record the run writes (its ``metrics.jsonl``): the run would write into or
    delete it. Any other file (a shell redirect's log, ``slurm-<id>.out``, a README) is
    no reason: the run deletes only what its manifest lists, and names them in a notice
    (:func:`_foreign_notice`)."""
    kind = run_folder.entry_kind(run_dir)
    if kind is None:
        return None
    resolved = run_dir.resolve()
    if resolved == Path(resolved.anchor):
        return "is the file system's root"
    if resolved == Path.home().resolve():
        return "is the home directory"
    if not run_dir.is_dir():
        return "exists and is not a folder"
    links = run_folder.linked_entries(run_dir, cfg.checkpoint.dir)
    if links:
        return (
            f"holds {', '.join(links)} as a symbolic link or an entry of the wrong kind: the "
            "run would write or read through it, outside its folder"
        )
    clashes = run_folder.foreign_records(run_dir, cfg.checkpoint.dir)
    if clashes:
        return (
            f"holds {shown(clashes)}, which no run of art_hydra made there (its "
            f"{run_folder.RUN_MANIFEST} does not list them): the run writes records under "
            "these names, and would append to, replace or delete another program's files"
        )
    return _other_things(cfg, run_dir)


def _other_things(cfg: DictConfig, run_dir: Path) -> str | None:
    """A folder that is clearly something else: a project, a folder of many other
    things, another Hydra program's output folder."""
    marks = run_folder.project_marks(run_dir)
    if marks:
        return f"looks like a project, not a run folder (it holds {shown(marks)})"
    strays = run_folder.unlisted_entries(run_dir, cfg.checkpoint.dir)
    if len(strays) > run_folder.MAX_FOREIGN:
        return (
            f"holds {len(strays)} entries no run writes there ({shown(strays)}): it is a "
            "folder of other things, not a run folder"
        )
    if _foreign_hydra_record(run_dir):
        return (
            f"holds another program's Hydra record ({run_folder.HYDRA_RECORD}/) and no run of "
            "art_hydra: the run would replace that record"
        )
    return None


def _foreign_notice(cfg: DictConfig, run_dir: Path) -> list[Problem]:
    """A notice (a warning) naming what the run folder holds that no run writes there (a
    shell redirect's log, ``slurm-<id>.out``, ``nohup.out``, a README): the run leaves
    it alone."""
    if run_folder.entry_kind(run_dir) != "folder":
        return []
    strays = run_folder.unlisted_entries(run_dir, cfg.checkpoint.dir)
    if not strays:
        return []
    return [
        world_problem(
            "hydra.run.dir",
            str(run_dir),
            f"holds {shown(strays)}, which no run writes there: the run leaves "
            f"{'it' if len(strays) == 1 else 'them'} alone (it writes, and deletes, only its "
            f"own records, listed in {run_folder.RUN_MANIFEST}).",
            fix(note="nothing to do; a folder of its own keeps a run's records apart"),
            warning=True,
        )
    ]


def _foreign_hydra_record(run_dir: Path) -> bool:
    """A ``.hydra/`` with none of a run's own records beside it: another Hydra app's
    output folder (unless this very job was told to write its record there by hand)."""
    if not (run_dir / run_folder.HYDRA_RECORD).is_dir():
        return False
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized() and HydraConfig.get().output_subdir == run_folder.HYDRA_RECORD:
        return False
    marks = (
        run_folder.LOCK,
        run_folder.RUN_CONFIG,
        run_folder.METRICS,
        run_files.IDENTITY,
        run_folder.RUN_MANIFEST,
    )
    return not any(run_folder.entry_kind(run_dir / name) is not None for name in marks)


def run_folder_problems(cfg: DictConfig, run_dir: Path) -> list[Problem]:
    """Whether ``run_dir`` is in the state ``cfg.resume`` expects: free, a run folder
    (or nothing yet), and then fresh (``false``), resumable with the same config
    (``true``), or either (``auto``, which also passes a finished run, skipped)."""
    own, inner = path_refusal(run_dir), path_refusal(run_dir / cfg.checkpoint.dir)
    if own or inner:  # before any os call, which would raise OSError
        reason = own or f"with checkpoint.dir={cfg.checkpoint.dir} appended, {inner}"
        return [
            world_problem("hydra.run.dir", str(run_dir), f"{reason}.", fix(note="a shorter path"))
        ]
    uncreatable = creation_refusal(run_dir)
    if uncreatable is not None:
        return [world_problem("hydra.run.dir", str(run_dir), uncreatable, new_folder_fix())]
    busy = busy_folder_problems(run_dir)
    if busy:
        return busy
    unfit = _not_a_run_folder(cfg, run_dir)
    if unfit is not None:
        return [
            world_problem(
                "hydra.run.dir",
                str(run_dir),
                f"{unfit}. A run writes, replaces and prunes its records in its folder, and "
                "must never touch what it did not create.",
                new_folder_fix(),
            )
        ]
    mode = run_folder.resume_mode(cfg)
    notice = _foreign_notice(cfg, run_dir)
    if mode == "auto":
        return notice + auto_problems(cfg, run_dir)
    if mode == "false":
        return notice + fresh_problems(cfg, run_dir)
    if not run_dir.is_dir():
        return [
            world_problem(
                "resume",
                True,
                f"there is no run folder {run_dir} to resume.",
                fix(
                    {"hydra.run.dir": placeholder("the folder of the run to resume")},
                    alt=fix({"resume": "auto"}, "start the run where there is none"),
                ),
            )
        ]
    return notice + resume_problems(cfg, run_dir, True)


def creation_refusal(folder: Path) -> str | None:
    """Why ``folder`` (absent) could not be created, or None: the nearest folder above it
    that exists must be a folder where a new folder can be made. Tried for real, with a
    probe folder made and removed at once (``/proc``, ``/sys``, a read-only mount or a
    folder without write permission refuse it even to root, where ``os.access`` says yes)."""
    if os.path.lexists(folder):
        return None
    above = folder.absolute().parent
    while not os.path.lexists(above) and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"cannot be created: {above} is not a folder."
    probed = _PROBED.get()
    if probed is None:
        return _probe(above)
    if above not in probed:
        probed[above] = _probe(above)
    return probed[above]


#: The verdict of each folder probed while :func:`remembered_probes` is active.
_PROBED: ContextVar[dict[Path, str | None] | None] = ContextVar(
    "art_hydra_probed_folders", default=None
)


@contextmanager
def remembered_probes(probed: dict[Path, str | None]) -> Iterator[None]:
    """Probe each folder once while inside, its verdict kept in ``probed``: a sweep's job
    folders share the folder above them, which the pre-flight does not change."""
    token = _PROBED.set(probed)
    try:
        yield
    finally:
        _PROBED.reset(token)


def _probe(above: Path) -> str | None:
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".art_hydra-probe-", dir=above))
    except OSError as exc:
        return (
            f"cannot be created: no folder can be made in {above} "
            f"({exc.strerror or exc}); the run writes its checkpoints and records there."
        )
    return None
