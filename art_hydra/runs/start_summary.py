"""What a run says when it starts, in plain words: what trains, where, on what, how.

A run read from its log file afterwards (piped, under SLURM, a sweep's job) must say
what it was without the config at hand: the model and its family, how many parameters
train, the device and the precision, the data, the batch and the steps, and how the
training rows are laid out and why. A few lines, logged (the console and
``art_hydra.log``) once by rank 0 after the model loaded.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from art_hydra.config.run_length import (
    consumption,
    epochs_of,
    steps_for_epochs,
)
from art_hydra.config.secrets import scrub

if TYPE_CHECKING:
    from art_hydra.config.schema import RunConfig

log = logging.getLogger("art_hydra")


def _name(value: Any) -> str:
    return value.name if hasattr(value, "name") else str(value)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def model_line(parameters: str, model: Any) -> str:
    """The model, its family, and what of it trains (``parameters``: the run's
    :func:`art_hydra.engine.recipe.parameter_line`)."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None) or "unknown"
    return f"{parameters}; family {family}"


def device_line(cfg: RunConfig, loaded: Any, threads: int | None) -> str:
    """Where it computes and in which precision (the weights' dtype, and the autocast
    dtype when the forward computes in a half dtype over them)."""
    weights = next((p.dtype for p in loaded.model.parameters()), None)
    stored = _dtype_name(weights) if weights is not None else "unknown"
    if loaded.autocast is not None:
        how = f"{stored} weights, computing in {_dtype_name(loaded.autocast)} (autocast)"
    else:
        how = f"{stored} weights, computing in {stored}"
    device = str(loaded.device)
    cpu = f", {threads} torch thread(s)" if threads is not None and device == "cpu" else ""
    return f"device {device}{cpu}: {how} (model.dtype={_name(cfg.model.dtype)})"


def data_line(task: Any) -> str:
    """The task's size: examples and distinct prompts (a prompt repeated with other
    answers counts once)."""
    examples = list(getattr(task, "examples", []) or [])
    prompts = len({ex.prompt for ex in examples})
    return f"data: task {task.name}, {len(examples):,} examples, {prompts:,} distinct prompts"


def steps_text(cfg: RunConfig, examples: int | None) -> str:
    """The run's steps; with ``trainer.num_train_epochs`` set, also the passes over the
    ``examples`` training examples they make (``300 steps = 2 epochs of 2,400 prompts``)."""
    steps = int(cfg.trainer.max_steps or 0)  # settled before the run starts
    if cfg.trainer.num_train_epochs is None or not examples:
        return f"{steps} steps"
    unit = consumption(cfg).unit
    shown = f"{steps} steps = {epochs_of(cfg, steps, examples):.4g} epochs of {examples:,} {unit}"
    asked = steps_for_epochs(cfg, examples)
    if asked is not None and asked != steps:  # a set trainer.max_steps won over the epochs
        epochs = f"{cfg.trainer.num_train_epochs:g}"
        shown += f" (trainer.max_steps won; trainer.num_train_epochs={epochs} is {asked} steps)"
    return shown


def batch_line(cfg: RunConfig, ranks: int, examples: int | None = None) -> str:
    """What one optimizer step takes, and how many steps the run has (``examples``: the
    training examples, for the epochs they make when the run counts in epochs)."""
    per_device = int(cfg.trainer.per_device_train_batch_size)
    steps = steps_text(cfg, examples)
    where = f" on each of {ranks} ranks" if ranks > 1 else ""
    if _name(cfg.algorithm.name) == "sft":
        accumulation = int(cfg.trainer.gradient_accumulation_steps)
        return (
            f"batch: SFT, {per_device} rows per micro-batch x {accumulation} accumulation "
            f"step(s) = {per_device * accumulation} rows per optimizer step{where}; "
            f"{steps}"
        )
    n = int(cfg.rl.num_generations)
    groups = per_device // n
    more = ""
    if int(cfg.rl.steps_per_generation) > 1 or int(cfg.rl.num_iterations) > 1:
        more = (
            f", each generation batch split into {cfg.rl.steps_per_generation} step(s) and "
            f"trained {cfg.rl.num_iterations} time(s)"
        )
    return (
        f"batch: RL, {per_device} completions per optimizer step ({groups} prompt group(s) "
        f"x {n} completions){where}{more}; {steps}"
    )


def layout_line(loaded: Any) -> str:
    """How training rows are laid out, and why (the layout's own reason, a sentence)."""
    reason = getattr(loaded.layout, "reason", "") or "unknown"
    return f"row layout: {reason}"


def summary_lines(
    cfg: RunConfig,
    loaded: Any,
    task: Any,
    parameters: str,
    ranks: int = 1,
    threads: int | None = None,
) -> list[str]:
    """The start summary's lines for a run of ``cfg`` with its model loaded
    (``parameters``: the line that counts what trains)."""
    return [
        model_line(parameters, loaded.model),
        device_line(cfg, loaded, threads),
        data_line(task),
        batch_line(cfg, ranks, len(getattr(task, "examples", []) or [])),
        layout_line(loaded),
    ]


def log_start_summary(
    cfg: RunConfig,
    loaded: Any,
    task: Any,
    parameters: str,
    ranks: int = 1,
    threads: int | None = None,
) -> list[str]:
    """Log the start summary (the console and ``art_hydra.log``); returns its lines."""
    # A task named by a secret (an experiment's ${oc.env:...}) is shown as ***.
    lines = [scrub(line) for line in summary_lines(cfg, loaded, task, parameters, ranks, threads)]
    for line in lines:
        log.info("%s", line)
    return lines
