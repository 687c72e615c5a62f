"""A training run's way in: check, take the run folder, run the recipe there.

``train(cfg)`` is what every Hydra job runs and what Python callers use with a config
built by hand. It validates first, with the same validators as composition, so no
path reaches training unvalidated; :func:`run_validated` then takes the folder's lock,
keeps the job's record, and runs :mod:`art_hydra.engine.recipe` in it. Heavy libraries (torch,
transformers, peft) are imported inside the functions, never on the compose/validate
path.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.config import run_files, secrets
from art_hydra.config.composition import announce_warnings, check
from art_hydra.config.problems import (
    ConfigValidationError,
    Problem,
    errors,
    format_report,
    warnings_of,
)
from art_hydra.config.schema import RunConfig
from art_hydra.config.trust import outside_code_report
from art_hydra.config.typed import typed_config
from art_hydra.engine.result import (
    DONE,
    FAILED,
    RESULT,
    JobRecord,
    RunResult,
    objective_value,
    stop_reason,
)

# ResumeError stays importable from here, where it was defined before errors.py held it.
from art_hydra.errors import ResumeError as ResumeError
from art_hydra.errors import RunFolderBusy, RunStopped, user_traceback
from art_hydra.runs.progress import stdout_reader_may_go
from art_hydra.runs.run_messages import in_log_files

if TYPE_CHECKING:
    from art_hydra.engine.distributed import World

log = logging.getLogger("art_hydra")


#: How a report raised by ``train`` ends: nothing of the run was made.
_JOB_FOOTER = "The run stopped before loading a model; nothing was trained."


def resolved_yaml(cfg: Any) -> str:
    """The run config as YAML (a checked config: every interpolation already resolved),
    as a record shows it: a value read from the environment as its expression, a
    secret-looking key's as ``***``."""
    return OmegaConf.to_yaml(OmegaConf.create(secrets.redacted(cfg)))


def dry_run_report(cfg: Any, hydra: Any = None, *, before_hydra: bool = False) -> str:
    """What a dry run prints: the resolved config, the code outside art_hydra it names or
    ran, and that it stopped. The command's own check stops ``before_hydra`` made any
    folder, so nothing was written either; a job's check runs in the folder Hydra made."""
    from art_hydra.config.run_length import set_aside_note

    done = "nothing was trained or written" if before_hydra else "nothing was trained"
    note = set_aside_note(cfg)  # a config file's max_steps gave way to the typed epochs
    return "\n".join(
        [
            resolved_yaml(cfg),
            outside_code_report(cfg, hydra),
            *([note] if note else []),
            f"dry run: the configuration is valid; {done}.",
        ]
    )


def prepared_world(typed: RunConfig, world: World | None = None) -> World:
    """The process group this rank trains in, its backend prepared first (Unsloth must
    come before transformers and torch's imports): ``world`` where the rank joined one
    already, else joined here on the backend's device (a single process: a world of one)."""
    from art_hydra.engine import distributed
    from art_hydra.engine.backends import prepare

    prepare(typed.backend)
    if world is not None:
        return world
    from art_hydra.engine.backends.torch_backend import resolve_device

    return distributed.setup(typed.distributed, resolve_device(typed.backend.device))


def default_run_dir() -> Path:
    """Hydra's output directory inside a Hydra job, else a fresh ``outputs/<date>/<time>``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")


def train(cfg: Any, run_dir: str | Path | None = None) -> RunResult:
    """Check ``cfg`` and train; returns the run's objective as a float that carries the
    summary (``result["steps"]``, ``result.final``, ``result.run_dir``): a value every
    optimising sweeper (Optuna, Ax, Nevergrad) reads as the job's result.

    ``cfg`` may be a composed ``DictConfig``, a :class:`~art_hydra.config.schema.RunConfig`
    or a plain mapping. It is checked here, once: the config alone, then the world
    pre-flight (this is the check of a sweep's job and of a Python caller; the command
    checks a single run before Hydra starts it, and runs :func:`train_checked`). With
    ``dry_run=true`` it prints the resolved config and returns NaN with the summary
    ``{"dry_run": True}``.
    """
    from art_hydra.engine.distributed import from_environment
    from art_hydra.preflight import busy_folder_problems

    secrets.remember(cfg)  # as composed: what the run's records keep as expressions
    world = from_environment()
    folder = Path(run_dir) if run_dir is not None else default_run_dir()
    # First of all: a job refused for a busy folder must write nothing there (not a log line).
    busy = busy_folder_problems(folder) if world.is_main else []
    if busy:
        from art_hydra.runs.run_folder import detach_logs

        detach_logs(folder)
        raise ConfigValidationError(busy, footer=_JOB_FOOTER)
    try:
        cfg = _checked(cfg, folder if world.is_main else None)
    except ConfigValidationError as exc:
        if world.is_main:
            _record_refusal(folder, exc)
            _refusal_in_log(folder, exc)
        raise
    if cfg.dry_run:
        with stdout_reader_may_go():
            print(dry_run_report(cfg))
        return RunResult(float("nan"), {"dry_run": True})
    return train_checked(cfg, folder)


def _checked(cfg: Any, folder: Path | None) -> DictConfig:
    """``cfg`` typed and resolved, after every check of the config alone and the world
    pre-flight (of ``folder`` too, where this rank owns it): one report of every error,
    or the warnings told (:func:`_tell_warnings`)."""
    from art_hydra.preflight import world_problems

    cfg, problems = check(cfg)
    if errors(problems):
        raise ConfigValidationError(problems, footer=_JOB_FOOTER)
    problems += world_problems(cfg, folder)
    if errors(problems):
        raise ConfigValidationError(problems, footer=_JOB_FOOTER)
    _tell_warnings(problems)
    return cfg


def _tell_warnings(problems: list[Problem]) -> None:
    """A job's warnings: in a sweep's job, in its log files alone (the sweep's pre-flight
    showed every point's warnings on the console before the first job started); else on
    stderr."""
    from art_hydra.runs.run_folder import in_sweep

    found = warnings_of(problems)
    if not found:
        return
    if in_sweep():
        in_log_files(format_report(found))
    else:
        announce_warnings(found)


def train_checked(cfg: DictConfig, run_dir: Path, world: Any = None) -> RunResult:
    """Train ``cfg``, typed and resolved by a check that found no error (the command's,
    before Hydra started the job, or :func:`train`'s): nothing is checked again. A run
    that finished already is skipped (:func:`_finished_run`). ``world``: the process
    group this rank joined already (None: the run joins it). A stdout whose reader went
    away (``| head``) fails nothing: the run's outcome is its training's
    (:func:`~art_hydra.runs.progress.stdout_reader_may_go`)."""
    from art_hydra.preflight.epochs import require_steps

    require_steps(cfg)  # the world pre-flight's count (a path that skipped it counts here)
    with stdout_reader_may_go():
        finished = _finished_run(cfg, run_dir)
        if finished is not None:
            return finished
        return run_validated(cfg, run_dir, world)


def _finished_run(cfg: DictConfig, run_dir: Path) -> RunResult | None:
    """``resume=auto`` or ``resume=true`` in a folder whose run reached
    ``trainer.max_steps``: nothing to train (a sweep continued skips its finished
    points). One line says so, and how to train further; the summary is the run's last
    metrics. None when there is something to train. (Fewer steps than the checkpoint
    holds never gets here: the world pre-flight refuses it.)"""
    from art_hydra.engine.metrics import read_metrics
    from art_hydra.runs import run_folder

    mode = run_folder.resume_mode(cfg)
    if mode not in ("auto", "true"):
        return None
    verdict, step = run_folder.auto_verdict(run_dir, cfg.checkpoint.dir, cfg.trainer.max_steps)
    if verdict != run_folder.FINISHED:
        return None
    run_folder.discard_hydra_record()  # the folder keeps the record of the run that trained
    records = read_metrics(run_dir) if (run_dir / run_files.METRICS).is_file() else []
    steps = step if step is not None else cfg.trainer.max_steps
    print(
        f"art_hydra: {run_dir} already finished ({steps} steps); skipped (resume={mode}): "
        f"{_further(cfg, steps)}"
    )
    summary = {
        "run_dir": str(run_dir),
        "steps": steps,
        "final": records[-1] if records else {},
        "plot": None,
        "skipped": "finished",
    }
    from art_hydra.config.objective import resolve

    spec = resolve(cfg.objective, cfg.algorithm.name)
    return RunResult(objective_value(spec, records), summary)


def _further(cfg: DictConfig, steps: int) -> str:
    """Why a finished run has nothing left, and the key that trains it further: the
    epochs where they sized the run (a larger trainer.max_steps would not win over
    them without setting them aside), else trainer.max_steps."""
    from art_hydra.preflight.epochs import epochs_sized

    if epochs_sized(cfg):
        epochs = f"{cfg.trainer.num_train_epochs:g}"
        return (
            f"trainer.num_train_epochs={epochs} ({cfg.trainer.max_steps} steps) leaves "
            f"nothing to train. To train it further: resume=true "
            f"trainer.num_train_epochs=<more than {epochs}>"
        )
    return (
        f"trainer.max_steps={cfg.trainer.max_steps} leaves nothing to train. To train it "
        f"further: resume=true trainer.max_steps=<more than {steps}>"
    )


def _record_refusal(folder: Path, exc: ConfigValidationError) -> None:
    """A sweep's job refused by its own checks (a point its sweeper launched unchecked)
    leaves ``result.json`` with ``refused`` and the report, so the sweep's summary names
    it instead of counting a job that never finished. Only in the job folder Hydra made
    for it, and never when a problem is about the folder itself (it may not be a run
    folder at all)."""
    from art_hydra.engine.result import job_number, job_overrides, write_refused_result
    from art_hydra.runs.run_folder import in_sweep

    if not in_sweep():
        return
    if not folder.is_dir() or any(p.key.startswith("hydra.") for p in exc.problems):
        return
    try:
        write_refused_result(folder, job_overrides(), str(exc), job_number())
    except OSError as error:
        log.warning("could not write %s: %s", folder / RESULT, error)


def _refusal_in_log(folder: Path, exc: ConfigValidationError) -> None:
    """A job refused by its own checks says why in its ``art_hydra.log`` too (a sweep's
    job folder, a SLURM job's log), unless a problem is about the folder itself or the
    folder holds a run already (a refused resume changes no file of that run)."""
    if any(p.key.startswith("hydra.") for p in exc.problems):
        return
    if (folder / run_files.RUN_CONFIG).exists():
        return
    in_log_files(f"art_hydra: the run was refused:\n{exc}", logging.ERROR)


def run_validated(
    cfg: DictConfig, run_dir: str | Path | None = None, world: Any = None
) -> RunResult:
    """The run itself, for a config that :func:`train` has validated. ``world``: the
    process group this rank joined already (None: join it here, under torchrun or a
    multi-task SLURM job).

    Public only so tests can drive a configuration the validators would reject (the
    RL accumulation deadlock) and show that the channel still ends it.
    """
    from art_hydra.preflight.epochs import require_steps

    require_steps(cfg)  # trainer.max_steps an int from here on, whatever the path
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    from art_hydra.engine import distributed
    from art_hydra.engine.recipe import train_in_folder
    from art_hydra.runs.interrupts import stop_on_signals
    from art_hydra.runs.run_folder import adopt_hydra_record, discard_hydra_record

    typed = typed_config(cfg)  # the sections the engine's builders take, made once
    world = prepared_world(typed, world)
    world.run_dir = run_dir
    lock = _lock_folder(run_dir, world, cfg.checkpoint.dir)
    distributed.write_status(world, "running")
    # Rank 0 keeps the job's result.json: "running" while it holds the lock.
    record = JobRecord(run_dir, cfg) if world.is_main else None
    try:
        # Hydra's record of this job becomes the folder's .hydra only now, under the lock.
        adopt_hydra_record() if world.is_main else discard_hydra_record()
        if record is not None:
            record.start()
        with stop_on_signals() as stop:
            summary = train_in_folder(cfg, run_dir, stop, world, record, typed)
        value = _finish_record(record, DONE, None)
    except BaseException as exc:
        distributed.write_status(world, f"failed: {type(exc).__name__}: {exc}".splitlines()[0])
        status, reason = stop_reason(exc)
        if status == FAILED:  # the log file also keeps the user's own frames (a reward's)
            trace = user_traceback(exc)
            failed = f"art_hydra: the run failed: {reason}" + (f"\n{trace}" if trace else "")
            in_log_files(failed.rstrip(), logging.ERROR)
        _finish_record(record, status, reason)
        if world.enabled and not isinstance(exc, (RunStopped, KeyboardInterrupt)):
            raise distributed.failure(world, "training", exc, typed.distributed.timeout_s) from exc
        raise
    finally:
        _settle(run_dir, world)
        lock.release()
    distributed.write_status(world, "done")
    distributed.teardown(world)
    return RunResult(value, summary)


def _settle(run_dir: Path, world: Any) -> None:
    """Rank 0, still under the lock: the manifest keeps only what the run made."""
    from art_hydra.runs.run_folder import settle_records

    if world.is_main:
        try:
            settle_records(run_dir)
        except OSError as exc:  # a full disk: the listing keeps names never made, harmless
            log.warning("could not update %s: %s", run_dir / run_files.RUN_MANIFEST, exc)


def _lock_folder(run_dir: Path, world: Any, checkpoint_dir: str) -> Any:
    """The run folder's lock, taken by rank 0 (the other ranks hold the same object, not
    taken): a folder another live process holds is refused as :class:`RunFolderBusy`.
    Before the run writes anything there, rank 0 lists in the folder's manifest the
    records it may make (:func:`~art_hydra.runs.run_folder.begin_records`): the only entries
    a run ever deletes."""
    from art_hydra.runs.run_folder import (
        FolderInUse,
        RunLock,
        begin_records,
        detach_logs,
        folder_key,
    )

    lock = RunLock(run_dir)
    try:
        if world.is_main:
            lock.acquire()
    except FolderInUse as exc:
        detach_logs(run_dir)
        raise RunFolderBusy(
            f"the run folder {run_dir} is in use by {exc}; one run per folder. Wait for it, "
            f"or choose another folder ({folder_key()}=...)"
        ) from None
    try:
        if world.is_main:
            begin_records(run_dir, checkpoint_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def _finish_record(record: JobRecord | None, status: str, reason: str | None) -> float:
    """Write the job's end state into result.json (rank 0; others have no record) and
    return its objective. A record that cannot be written (a full disk) is logged: it
    must not hide the run's own outcome."""
    if record is None:
        return float("nan")
    try:
        value, written = record.finish(status, reason)
    except Exception as exc:
        log.warning("could not write %s: %s", record.run_dir / RESULT, exc)
        return float("nan")
    spec = record.spec
    shown = "none logged" if written["objective"]["value"] is None else f"{value:.6g}"
    log.info(
        "result.json: %s; objective %s = %s (%s over the last %d logged step(s), %s)",
        status,
        spec.metric,
        shown,
        spec.reduce,
        spec.window,
        spec.direction,
    )
    return value
