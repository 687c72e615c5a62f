"""A training run, read top to bottom: validate, set up, loop, clean up.

``train(cfg)`` is what every Hydra job runs and what Python callers use with a config
built by hand. It validates first, with the same validators as composition, so no
path reaches training unvalidated. Heavy libraries (torch, transformers, peft) are
imported here, inside the function, never on the compose/validate path.
"""

from __future__ import annotations

import logging
import shlex
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from art_hydra.config.composition import validate
from art_hydra.config.problems import ConfigValidationError, errors
from art_hydra.config.schema import AlgorithmName
from art_hydra.errors import Interrupted, WriteError

log = logging.getLogger("art_hydra")


class ResumeError(CompactHydraException, FileNotFoundError):
    """``resume=true`` found nothing to resume from (a user's mistake: no traceback)."""


#: How a report raised by ``train`` ends: nothing of the run was made.
_JOB_FOOTER = "The run stopped before loading a model; nothing was trained."


def resolved_yaml(cfg: Any) -> str:
    """The run config as YAML (a checked config: every interpolation already resolved)."""
    return OmegaConf.to_yaml(cfg)


def default_run_dir() -> Path:
    """Hydra's output directory inside a Hydra job, else a fresh ``outputs/<date>/<time>``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")


def train(cfg: Any, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Validate ``cfg`` and train; returns a summary (steps, final metrics, paths).

    ``cfg`` may be a composed ``DictConfig``, a :class:`~art_hydra.config.schema.RunConfig`
    or a plain mapping. With ``dry_run=true`` it prints the resolved config and returns.
    """
    from art_hydra.preflight import world_problems

    cfg = validate(cfg, footer=_JOB_FOOTER)
    folder = Path(run_dir) if run_dir is not None else default_run_dir()
    problems = world_problems(cfg, folder, trust_earlier_pass=True)
    if errors(problems):
        raise ConfigValidationError(problems, footer=_JOB_FOOTER)
    if cfg.dry_run:
        print(resolved_yaml(cfg))
        print("dry run: the configuration is valid; nothing was trained.")
        return {"dry_run": True}
    return run_validated(cfg, folder)


def build_trainer_and_producer(cfg: DictConfig) -> tuple[Any, Any]:
    """Task, model, trainer and producer for a validated config (also used by bench/)."""
    from art_hydra.backends import load_model
    from art_hydra.producer import RLProducer, SFTProducer
    from art_hydra.rl.sampling import SamplingSettings, suppressed_ids
    from art_hydra.tasks import build_task
    from art_hydra.trainer import Objective, Trainer

    task = build_task(cfg)
    loaded = load_model(cfg.model, cfg.backend, cfg.seed, charset=task.charset())
    batch, capacity = cfg.trainer.per_device_train_batch_size, cfg.model.max_seq_length
    if cfg.algorithm.name == AlgorithmName.sft:
        trainer = Trainer(loaded, cfg.trainer, Objective.for_sft())
        accumulation = cfg.trainer.gradient_accumulation_steps
        producer = SFTProducer(
            loaded, task, cfg.sft, cfg.producer, batch, accumulation, capacity, cfg.seed
        )
        return trainer, producer
    # One settings object for rollouts and training logprobs: they must never differ.
    sampling = SamplingSettings.from_config(cfg.rl, suppressed_ids(loaded.tokenizer))
    trainer = Trainer(loaded, cfg.trainer, Objective.for_rl(cfg.rl, sampling))
    producer = RLProducer(
        loaded, task, cfg.rl, cfg.producer, cfg.timeouts, sampling, batch, capacity, cfg.seed
    )
    return trainer, producer


def run_validated(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """The run itself, for a config that :func:`train` has validated.

    Public only so tests can drive a configuration the validators would reject (the
    RL accumulation deadlock) and show that the channel still ends it.
    """
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    from art_hydra.interrupts import stop_on_signals
    from art_hydra.run_folder import FolderInUse, RunLock

    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except FolderInUse as exc:
        raise ResumeError(
            f"the run folder {run_dir} is in use by {exc}; one run per folder. Wait for it, "
            "or choose another folder (hydra.run.dir=...)"
        ) from None
    try:
        with stop_on_signals() as stop:
            return _train_locked(cfg, run_dir, stop)
    finally:
        lock.release()


def _train_locked(cfg: DictConfig, run_dir: Path, stop: Any) -> dict[str, Any]:
    # ---- setup -----------------------------------------------------------------------
    import random

    from art_hydra.backends import prepare

    prepare(cfg.backend)
    import torch
    from transformers.utils import logging as hf_logging

    from art_hydra import run_folder
    from art_hydra.checkpoint import Checkpointer
    from art_hydra.metrics import MetricsLog, plot_curve
    from art_hydra.queue import StepChannel

    hf_logging.disable_progress_bar()  # our own bar, and quiet logs
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    is_rl = cfg.algorithm.name == AlgorithmName.rl
    trainer, producer = build_trainer_and_producer(cfg)
    components = {"trainer": trainer, "producer": producer}
    checkpoints = Checkpointer(run_dir, cfg.checkpoint, cfg.timeouts.checkpoint_s)
    start_step = 0
    if cfg.resume:
        latest, skipped = checkpoints.latest()
        for reason in skipped:
            log.warning("skipped a checkpoint that does not verify: %s", reason)
        if latest is None:
            raise ResumeError(
                f"resume=true but {checkpoints.root} holds no intact checkpoint; point "
                "hydra.run.dir at the run to resume, or drop resume=true"
            )
        start_step = checkpoints.load(latest, components, trainer.loaded)
        log.info("resumed from %s (step %d)", latest, start_step)
        saved = run_folder.saved_config(run_dir)
        changed = run_folder.differences(saved, cfg) if saved is not None else []
        run_folder.record_resume(run_dir, start_step, changed)
    run_folder.write_run_config(run_dir, cfg)
    metrics = MetricsLog(
        run_dir, cfg.logging, cfg.trainer.max_steps, resume_step=start_step if cfg.resume else None
    )
    channel = StepChannel(cfg.queue, trainer.train_micro, cfg.timeouts.step_s)
    last: dict[str, Any] = {}
    saved_step = start_step if cfg.resume else None

    def save(step: int) -> None:
        with channel.producer_phase(f"writing checkpoint step {step}"):
            checkpoints.save(step, components, trainer.loaded)

    # ---- loop ------------------------------------------------------------------------
    try:
        if cfg.trainer.warmup_pass and start_step == 0:
            with channel.producer_phase("making the warmup input"):
                first = producer.make_inputs()[0]
            first.warmup = True
            channel.put(first)
            channel.result(step=0)
        for step in range(start_step + 1, cfg.trainer.max_steps + 1):
            if stop.requested:
                break
            started = time.perf_counter()
            with channel.producer_phase(f"making the inputs of step {step}"):
                inputs = producer.make_inputs()
            for item in inputs:
                channel.put(item)
            result = channel.result(step)
            elapsed = time.perf_counter() - started
            last = {
                "step": result.step,
                "reward_mean": result.info.get("reward_mean"),
                "reward_std": result.info.get("reward_std"),
                "loss": result.loss,
                "grad_norm": result.grad_norm,
                "learning_rate": result.learning_rate,
                "kl": result.kl,
                "entropy": result.entropy,
                "clip_fraction": result.clip_fraction,
                "zero_std_groups": result.info.get("zero_std_groups"),
                "completion_length": result.info.get("completion_length"),
                "real_token_share": result.real_token_share,
                "tokens_per_s": result.trained_tokens / elapsed,
                "step_time_s": elapsed,
            }
            try:
                metrics.log(last)
                metrics.log_samples(step, inputs[0].samples)
            except OSError as exc:
                raise WriteError(
                    f"writing the run's record failed at step {step}: {exc}. "
                    + _resume_hint(run_dir, saved_step)
                ) from exc
            if checkpoints.due(step, cfg.trainer.max_steps) or stop.requested:
                save(step)
                saved_step = step
        if stop.requested and trainer.step > 0 and saved_step != trainer.step:
            save(trainer.step)  # the signal came between the step's check and the next
            saved_step = trainer.step
    # ---- cleanup ---------------------------------------------------------------------
    finally:
        channel.close()
        metrics.close()
    if stop.requested:
        raise Interrupted(_stopped_message(cfg, run_dir, stop.name, saved_step), stop.exit_code)
    plot = (
        plot_curve(
            run_dir, "reward_mean" if is_rl else "loss", "reward.png" if is_rl else "loss.png"
        )
        if cfg.logging.plot
        else None
    )
    summary = {
        "run_dir": str(run_dir),
        "steps": trainer.step,
        "final": last,
        "plot": str(plot) if plot else None,
    }
    if last:
        shown = f"reward {last['reward_mean']:.3f}" if is_rl else f"loss {last['loss']:.4f}"
        print(f"art_hydra: {trainer.step} steps, final {shown}; outputs in {run_dir}")
    return summary


def resume_command(run_dir: Path) -> str:
    """The command that resumes this run: the job's own overrides (inside a Hydra job),
    with ``resume=true`` and the run folder."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return f"train(cfg with resume=true, run_dir={str(run_dir)!r})"
    overrides = [
        o
        for o in HydraConfig.get().overrides.task
        if not o.lstrip("+~").startswith(("resume=", "hydra.run.dir="))
    ]
    parts = ["art-hydra", *overrides, "resume=true", f"hydra.run.dir={run_dir.resolve()}"]
    return " ".join(shlex.quote(p) for p in parts)


def _resume_hint(run_dir: Path, saved: int | None) -> str:
    if saved is None:
        return "No checkpoint was written yet; start again once the disk has room."
    return (
        f"Checkpoint step-{saved:06d} is intact; once the disk has room, resume with:\n"
        f"  {resume_command(run_dir)}"
    )


def _stopped_message(cfg: DictConfig, run_dir: Path, signal_name: str, saved: int | None) -> str:
    if saved is None:
        return (
            f"art_hydra stopped by {signal_name} before its first optimizer step finished; "
            f"there is nothing to resume. Start again to train (outputs in {run_dir})."
        )
    return (
        f"art_hydra stopped by {signal_name} after step {saved} of {cfg.trainer.max_steps}; "
        f"checkpoint step-{saved:06d} holds it and the metrics are flushed. Resume with:\n"
        f"  {resume_command(run_dir)}"
    )
