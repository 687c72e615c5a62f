"""What a run says as it stops: the command that resumes it or starts it afresh, what
a stop kept, and the lines that must reach the job's log files too (after SIGHUP the
terminal is gone; a sweep's job folder must say why the job ended)."""

from __future__ import annotations

import contextlib
import logging
import shlex
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from art_hydra.config import run_files


def resume_command(run_dir: Path, ranks: int = 1) -> str:
    """The command that resumes this run: the job's own overrides (inside a Hydra job),
    with ``resume=true`` and the run folder; under torchrun, with as many ranks."""
    return _command(run_dir, ranks, resume=True)


def restart_command(run_dir: Path, ranks: int = 1) -> str:
    """The command that starts this run afresh in the same folder (a run stopped before
    its first checkpoint, whose records were removed)."""
    return _command(run_dir, ranks, resume=False)


def _command(run_dir: Path, ranks: int, resume: bool) -> str:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        flag = "resume=true" if resume else "resume=false"
        return f"train(cfg with {flag}, run_dir={str(run_dir)!r})"
    overrides = [
        o
        for o in HydraConfig.get().overrides.task
        if not o.lstrip("+~").startswith(("resume=", "hydra.run.dir="))
    ]
    launch = ["art-hydra"]
    if ranks > 1:  # the checkpoint holds each rank's sampler state: the same ranks resume
        launch = ["torchrun", f"--nproc_per_node={ranks}", "-m", "art_hydra"]
    parts = [*launch, *overrides, *(["resume=true"] if resume else [])]
    parts.append(f"hydra.run.dir={run_dir.resolve()}")
    return " ".join(shlex.quote(p) for p in parts)


def resume_hint(run_dir: Path, saved: int | None) -> str:
    if saved is None:
        return "No checkpoint was written yet; start again once the disk has room."
    return (
        f"Checkpoint {run_files.checkpoint_name(saved)} is intact; once the disk has room, "
        "resume with:\n"
        f"  {resume_command(run_dir)}"
    )


def stopped_message(
    cfg: DictConfig,
    run_dir: Path,
    signal_name: str,
    saved: int | None,
    ranks: int = 1,
    failure: Exception | None = None,
) -> str:
    """What a stop kept, and the command that carries on from it. ``failure``: the step
    in progress failed after the stop request (its cause is quoted; the step before it
    is what was kept)."""
    failed = ""
    if failure is not None:
        cause = str(failure).strip() or type(failure).__name__
        failed = (
            "; the step in progress then failed, so it is not part of what was kept "
            "(fix its cause before going on):\n  " + cause.replace("\n", "\n  ") + "\n"
        )
    if saved is None:
        return (
            f"art_hydra stopped by {signal_name} before its first checkpoint{failed or '; '}"
            "there is nothing to resume, so the records this run made were removed from "
            f"{run_dir} (nothing else there was touched) and the same command starts it "
            "afresh:\n"
            f"  {restart_command(run_dir, ranks)}" + _whole_sweep()
        )
    kept = (
        f"checkpoint {run_files.checkpoint_name(saved)} holds step {saved} and the metrics "
        f"are flushed. Resume with:\n  {resume_command(run_dir, ranks)}"
    )
    head = f"art_hydra stopped by {signal_name} after step {saved} of {cfg.trainer.max_steps}"
    message = f"{head}{failed}{kept[0].upper()}{kept[1:]}" if failed else f"{head}; {kept}"
    return message + _whole_sweep()


def _whole_sweep() -> str:
    """In a sweep's job, the line that continues the whole sweep (else nothing)."""
    from art_hydra.runs.interrupts import continue_sweep_command

    command = continue_sweep_command()
    return f"\nContinue the whole sweep with:\n  {command}" if command else ""


def in_log_files(message: str, level: int = logging.WARNING) -> str:
    """Also write a stop's (or a failure's) message to the job's log files (``<job>.log``
    in the run folder): after SIGHUP the terminal that would show it is gone, and a
    sweep's job folder must say why the job failed."""
    from art_hydra.config.secrets import scrub

    message = scrub(message)  # a failure's message may quote a secret's value
    record = logging.LogRecord("art_hydra", level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            with contextlib.suppress(Exception):
                handler.handle(record)
    return message


def try_commands(run_dir: Path, examples: Any) -> str:
    """The end-of-run lines naming both commands for this run: export it, and try it on
    one of its own prompts (the first of ``examples``, the task's examples)."""
    first = next(iter(examples or ()), None)
    prompt = shlex.quote(first.prompt if first is not None else "<prompt>")
    run = shlex.quote(str(run_dir))
    out = shlex.quote(str(Path(run_dir) / run_files.EXPORT))
    return (
        f"Export the trained model: art-hydra export {run} {out}\n"
        f"Try it on prompts:       art-hydra generate {run} -p {prompt}"
    )
