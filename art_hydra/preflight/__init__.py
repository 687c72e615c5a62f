"""The world pre-flight: what only files and the environment can decide, before any model.

It runs after composition (in the CLI before Hydra creates the run folder, in each sweep
point's pre-flight, in every job and in ``train(cfg)``), imports no torch, and reports
in the same format as composition: the reward and generator resolve through the
allowlist, are functions and accept their arguments; the data streams cleanly, every
line with what the algorithm and reward need; the tiny model's character tokenizer
says whether prompts and answers fit their budgets; a local model folder holds a model
with safetensors weights; Unsloth is installed when chosen; a GPU asked for is there;
and the run folder is in the state the run expects (fresh, or resumable with the same
config; under ``resume=auto`` either, or finished). A sweep's folder is checked once
before its first job (:func:`sweep_folder_problems`), and a sweep job's fixes name
``hydra.sweep.dir``, the key that chooses its folder.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from art_hydra import run_folder, run_identity
from art_hydra.config import fields, run_files, secrets
from art_hydra.config.backends import get_backend
from art_hydra.config.composition import Composition
from art_hydra.config.problems import Placeholder, Problem, fix, placeholder
from art_hydra.config.schema import Device, DistBackend
from art_hydra.config.trust import by_hand
from art_hydra.preflight.common import world_problem
from art_hydra.preflight.evaluation import evaluation_problems
from art_hydra.preflight.model import model_problems
from art_hydra.preflight.registry import (
    WorldCheck,
    crashed,
    plugin_problems,
    registered_world_checks,
    world_check,
)
from art_hydra.preflight.task import task_problems
from art_hydra.preflight.trackers import tracker_problems
from art_hydra.safe_paths import path_refusal


def world_problems(
    cfg: DictConfig,
    run_dir: str | Path | None,
    *,
    devices_here: bool = True,
    sweep: bool | None = None,
    failed: frozenset[str] = frozenset(),
) -> list[Problem]:
    """Everything the files and the environment say about ``cfg`` (a resolved config).

    ``failed``: keys that already have an error (composition reported them, and put
    them back to their defaults, which may be ``???``); a check that reads the section
    of one left without a readable value is skipped, so it never trips over it.

    ``devices_here=False`` leaves GPUs to the job, for a launcher that runs it on other
    machines (a SLURM sweep is often sent from a login node without one). ``sweep``:
    whether ``cfg`` is a sweep job's (its folder fixes then name ``hydra.sweep.dir``;
    None: as Hydra says in a job, else no).
    """
    found = environment_problems(cfg, devices_here, failed)
    if run_dir is not None:
        found += folder_problems(cfg, run_dir, sweep)
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
    "task": ("task", "model", "algorithm", "rl", "sft", "seed"),
    "model": ("model", "task", "algorithm", "rl", "sft"),
    "backend": ("backend", "distributed", "model"),
    "trackers": ("logging",),
    "eval": ("eval", "task", "algorithm", "rl", "sft", "seed"),
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
    cfg: DictConfig, run_dir: str | Path, sweep: bool | None = None
) -> list[Problem]:
    """The run folder's verdict; a folder that cannot be looked into is named, no traceback.
    A sweep's job folders are chosen by ``hydra.sweep.dir`` (``hydra.run.dir`` is ignored)."""
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


def add_world_problems(result: Composition, *, devices_here: bool = True) -> None:
    """Append the world's findings on a composed config to its report (a key whose value
    already has an error is not checked again)."""
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
        )
    result.problems += [p for p in world if p.key not in failed]


# ---- the backend and devices ------------------------------------------------------


def cuda_present() -> bool:
    """Whether torch would see a CUDA GPU, decided without importing torch: a CUDA build
    of torch, visible devices, and an NVIDIA driver with a device node."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    version = Path(spec.origin).with_name("version.py")
    try:
        match = re.search(r"^cuda\b[^=]*=\s*(\S+)", version.read_text(), re.MULTILINE)
    except OSError:
        return False
    if match is None or match.group(1) == "None":
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


def declared_backend_problems(cfg: DictConfig, devices_here: bool = True) -> list[Problem]:
    """What the selected backend's declaration asks of this environment: the modules it
    requires are installed, a backend made for CUDA alone finds a GPU, and its own world
    checks (``register_backend(..., checks=...)``)."""
    backend = get_backend(cfg.backend.name)
    if backend is None:  # composition refused the name
        return []
    torch_backend = get_backend(fields.default("backend.name")) or backend
    instead = backend.override_to(torch_backend)
    problems: list[Problem] = []
    if not backend.installed:
        missing = [m for m in backend.requires if importlib.util.find_spec(m) is None]
        problems.append(
            world_problem(
                next(iter(backend.choose())),
                backend.name,
                f"{backend.words} is not installed in this environment"
                + (f" (no module {', '.join(missing)})." if not backend.title else "."),
                fix(instead, alt=fix(note=backend.install) if backend.install else None),
            )
        )
    elif (
        devices_here
        and "cpu" not in backend.devices
        and cfg.backend.device != Device.cuda
        and not cuda_present()
    ):
        problems.append(
            world_problem(
                "backend.device",
                cfg.backend.device.name,
                "no CUDA GPU is visible: "
                + (backend.cpu_note or f"{backend.words} is made for CUDA GPUs, not the CPU."),
                fix(instead, f"the same run without {backend.words}"),
                warning=True,
            )
        )
    for check in backend.checks:
        try:
            problems += check(cfg, devices_here) or ()
        except OmegaConfBaseException:
            raise  # a value no check could read: reported by the caller
        except Exception as exc:  # a plugin backend's bug is reported, art_hydra's own raises
            if backend.builtin:
                raise
            name = f"{backend.name}: {getattr(check, '__name__', check)}"
            problems.append(crashed(WorldCheck(name, check, ()), exc))
    return problems


def backend_problems(cfg: DictConfig, devices_here: bool = True) -> list[Problem]:
    backend = cfg.backend
    problems: list[Problem] = declared_backend_problems(cfg, devices_here)
    if devices_here and backend.device == Device.cuda and not cuda_present():
        problems.append(
            world_problem(
                "backend.device",
                "cuda",
                "no CUDA GPU is visible here (no CUDA build of torch, no NVIDIA device, or "
                "CUDA_VISIBLE_DEVICES hides them).",
                fix(
                    {"backend.device": fields.default("backend.device")},
                    "the GPU when there is one, else the CPU",
                ),
            )
        )
    problems += _collective_problems(cfg, devices_here)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if devices_here and backend.cpu_threads is not None and cores and backend.cpu_threads > cores:
        problems.append(
            world_problem(
                "backend.cpu_threads",
                backend.cpu_threads,
                f"this process may use {cores} core(s): more threads than cores take turns "
                "on them, and every parallel op waits for the one left out.",
                fix(
                    {"backend.cpu_threads": cores},
                    alt=fix({"backend.cpu_threads": fields.default("backend.cpu_threads")}),
                ),
                warning=True,
            )
        )
    return problems


#: What torch's env:// rendezvous reads besides WORLD_SIZE (torchrun and the SLURM
#: launcher's tasks set them all).
_RENDEZVOUS = ("RANK", "MASTER_ADDR", "MASTER_PORT")


def _collective_problems(cfg: DictConfig, devices_here: bool) -> list[Problem]:
    """The ranks the environment announces can meet: a WORLD_SIZE above 1 comes with the
    rest of torchrun's variables, and NCCL has CUDA devices to run on."""
    from art_hydra.config.validators import torchrun_world_size, world_size

    problems: list[Problem] = []
    ranks = torchrun_world_size() or 1
    absent = [name for name in _RENDEZVOUS if not os.environ.get(name)]
    if ranks > 1 and absent:
        problems.append(
            world_problem(
                "distributed.world_size",
                f"WORLD_SIZE={ranks} (environment)",
                f"the environment says {ranks} ranks, but {', '.join(absent)} "
                f"{'is' if len(absent) == 1 else 'are'} not set: this process was not started "
                "by torchrun (or a SLURM task), so it cannot find the other ranks.",
                fix(
                    note=f"run without WORLD_SIZE (env -u WORLD_SIZE art-hydra ...), or start "
                    f"the ranks with torchrun --nproc_per_node={ranks} -m art_hydra ..."
                ),
            )
        )
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if ranks > 1 and value and not (value.isdigit() and int(value) < ranks):
            problems.append(
                world_problem(
                    "distributed.world_size",
                    f"{name}={value} (environment)",
                    f"is not a rank of WORLD_SIZE={ranks} (0 to {ranks - 1}): the launch "
                    "that set it did not describe this process's place among the ranks.",
                    fix(note=f"start the ranks with torchrun --nproc_per_node={ranks} ..."),
                )
            )
    nccl = cfg.distributed.backend == DistBackend.nccl
    if devices_here and nccl and cfg.backend.device == Device.auto and not cuda_present():
        # One process runs no collective: there the setting is only a trap for later.
        alone = world_size(cfg) == 1
        problems.append(
            world_problem(
                "distributed.backend",
                "nccl",
                "NCCL runs collectives between CUDA devices, and no CUDA GPU is visible here: "
                "backend.device=auto trains on the CPU"
                + (" (this run has one process, so nothing uses it yet)." if alone else "."),
                fix({"distributed.backend": "auto"}, "gloo on the CPU, nccl on GPUs"),
                warning=alone,
            )
        )
    return problems


# ---- the run folder ----------------------------------------------------------------


def _resume_fix(key: str, old: Any) -> Any:
    if key == "distributed.world_size" and isinstance(old, int):
        # The ranks come from the launch: each resumes its own sampler state.
        launch = f"torchrun --nproc_per_node={old} -m art_hydra ..." if old > 1 else "no torchrun"
        return fix(note=f"resume with {old} rank(s), as the run was launched: {launch}")
    return fix({key: old}) if old is not None else fix(note=f"remove {key}")


#: How a run folder is chosen, for a fix that names a fresh one (a sweep job's fixes
#: are rewritten to name hydra.sweep.dir: see :func:`for_sweep`).
_NEW_FOLDER = "hydra.run.dir=<a new folder>"


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


def _shown(names: list[str]) -> str:
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
            f"holds {_shown(clashes)}, which no run of art_hydra made there (its "
            f"{run_folder.RUN_MANIFEST} does not list them): the run writes records under "
            "these names, and would append to, replace or delete another program's files"
        )
    return _other_things(cfg, run_dir)


def _other_things(cfg: DictConfig, run_dir: Path) -> str | None:
    """A folder that is clearly something else: a project, a folder of many other
    things, another Hydra program's output folder."""
    marks = run_folder.project_marks(run_dir)
    if marks:
        return f"looks like a project, not a run folder (it holds {_shown(marks)})"
    strays = run_folder.unlisted_entries(run_dir, cfg.checkpoint.dir)
    if len(strays) > run_folder.MAX_FOREIGN:
        return (
            f"holds {len(strays)} entries no run writes there ({_shown(strays)}): it is a "
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
            f"holds {_shown(strays)}, which no run writes there: the run leaves "
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
        return [world_problem("hydra.run.dir", str(run_dir), uncreatable, _new_folder_fix())]
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
                _new_folder_fix(),
            )
        ]
    mode = run_folder.resume_mode(cfg)
    notice = _foreign_notice(cfg, run_dir)
    if mode == "auto":
        return notice + _auto_problems(cfg, run_dir)
    if mode == "false":
        return notice + _fresh_problems(cfg, run_dir)
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
    return notice + _resume_problems(cfg, run_dir, True)


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
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".art_hydra-probe-", dir=above))
    except OSError as exc:
        return (
            f"cannot be created: no folder can be made in {above} "
            f"({exc.strerror or exc}); the run writes its checkpoints and records there."
        )
    return None


def _new_folder_fix() -> Any:
    return fix({"hydra.run.dir": placeholder("a new folder")})


def _fresh_problems(cfg: DictConfig, run_dir: Path) -> list[Problem]:
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
                    alt=fix(note=f"{_NEW_FOLDER} to start afresh elsewhere"),
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


def _auto_problems(cfg: DictConfig, run_dir: Path) -> list[Problem]:
    """``resume=auto``: a run with a checkpoint is checked as a resume (finished or
    not: a finished run is skipped only if it is the same run); an empty folder, or
    the records of a run that ended before its first checkpoint, start afresh."""
    verdict, _ = run_folder.auto_verdict(run_dir, cfg.checkpoint.dir, cfg.trainer.max_steps)
    if verdict in (run_folder.RESUME, run_folder.FINISHED):
        # A run that finished without checkpoints (checkpoint.every_steps=0, as sweeps
        # often set) is skipped if it is the same run; nothing needs loading.
        bare = run_folder.latest_intact(run_dir / cfg.checkpoint.dir)[0] is None
        finished_bare = verdict == run_folder.FINISHED and bare
        return _resume_problems(cfg, run_dir, "auto", need_checkpoint=not finished_bare)
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


def _resume_problems(
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
        return [*notes, world_problem("resume", value, unreadable, _new_folder_fix())]
    if saved is None:
        return notes
    return notes + [
        world_problem(
            key,
            new,
            f"differs from the run's saved config ({run_folder.RUN_CONFIG}: {old!r}); a resume "
            "continues the same run, and the checkpoint was written under the saved value. Only "
            f"{', '.join(fields.may_change_keys())} may change.",
            _resume_fix(key, old),
        )
        for key, old, new in run_folder.differences(saved, secrets.for_comparison(cfg))
        if not run_folder.may_change(key)
    ]


def _fewer_steps_problems(cfg: DictConfig, run_dir: Path, intact: Path | None) -> list[Problem]:
    """A resume whose ``trainer.max_steps`` is below the steps the run already took: it
    cannot train backwards, and going on would rewrite the run's saved config with a step
    count its own checkpoints contradict (a finished run of that many steps is skipped
    only when it is that run, as ``resume=auto`` does)."""
    saved = run_folder.checkpoint_step(intact) if intact is not None else None
    if saved is None:
        status, steps = run_folder.result_status(run_dir)
        saved = steps if status == "done" else None
    wanted = cfg.trainer.max_steps
    if saved is None or saved <= wanted:
        return []
    return [
        world_problem(
            "trainer.max_steps",
            wanted,
            f"the run in {run_dir} has already trained {saved} steps, more than "
            f"trainer.max_steps={wanted}: a resume continues a run and cannot undo steps.",
            fix(
                {"trainer.max_steps": saved},
                "keep the run as it is; a larger count trains it further",
                alt=fix(note=f"{_NEW_FOLDER} for a shorter run from the start"),
            ),
        )
    ]


# ---- the sweep folder ----------------------------------------------------------------

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
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return [
            _sweep_folder(
                value,
                f"holds entries ({shown}) but no {saved_name}: it is not the folder of a "
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


def _register_own_checks() -> None:
    """art_hydra's own world checks, registered as a plugin's are, in the order they report."""
    for name, check, devices in (
        ("task", task_problems, False),
        ("model", model_problems, False),
        ("backend", backend_problems, True),
        ("trackers", tracker_problems, False),
        ("eval", evaluation_problems, False),
    ):
        world_check(check, name=name, reads=_READS[name], devices=devices)


_register_own_checks()
