"""``rl.sft_warm_start_steps``: SFT on the task's demonstrations before RL begins.

A fresh model rarely samples a tool call in the template's format, so RL has nothing to
reinforce; a few SFT steps on demonstrations (examples with a
:attr:`~art_hydra.tasks.Example.conversation`) teach the format, and RL improves from
there. The warm start runs once, at the start of a new run, before its first RL step:

- its rows are the demonstrations laid out as rollouts lay them out
  (:func:`art_hydra.engine.conversation.example_sequence`), only assistant turns trained;
- it uses the run's trainer settings (learning rate, weight decay, clipping), with
  ``trainer.per_device_train_batch_size`` demonstrations per step (fewer when the task
  has fewer), one micro-batch per step and a constant learning rate;
- its optimizer is its own and is dropped afterwards: RL starts from the warm-started
  weights with a fresh optimizer state (Adam's moments of imitation are not RL's);
- it writes no checkpoint and counts no RL step. A run stopped during the warm start has
  no checkpoint, so starting it again redoes the warm start; a resumed run (from a
  checkpoint, which always comes after it) never repeats it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from typing import Any

from art_hydra.tasks.examples import Example, TaskDataError

log = logging.getLogger(__name__)


def demonstrations(task: Any) -> list[Example]:
    """The task's examples that carry a conversation to imitate."""
    return [ex for ex in task.examples if ex.conversation]


def task_tool_schemas(task: Any) -> list[dict[str, Any]] | None:
    """The tools' JSON schemas the task's conversations are rendered with: the task's
    ``tool_schemas`` where it has them, else those of its ``tools`` (``task.tools``,
    resolved functions or :class:`~art_hydra.engine.envs.tools.Tool` objects); None:
    no tools (a row's own ``tools`` column still applies)."""
    schemas = getattr(task, "tool_schemas", None)
    if schemas:
        return list(schemas)
    tools = getattr(task, "tools", None)
    if not tools:
        return None
    from art_hydra.engine.envs.tools import Tool, function_tools

    found = [t for t in tools if isinstance(t, Tool)]
    found += function_tools([t for t in tools if not isinstance(t, Tool)])
    return [t.schema for t in found]


def warm_start(loaded: Any, task: Any, run: Any, world: Any = None) -> dict[str, float]:
    """Train ``run.rl.sft_warm_start_steps`` SFT steps on ``task``'s demonstrations, in
    place on ``loaded``'s model; returns ``warm_start/loss_first`` and ``/loss_last``
    (empty when the setting is 0). A task without demonstrations is a
    :class:`TaskDataError` naming the setting."""
    steps = run.rl.sft_warm_start_steps
    if not steps:
        return {}
    from art_hydra.engine.trainer import Trainer, TrainingLoss

    rows = _rows(loaded, task, run)
    batch_size = min(run.trainer.per_device_train_batch_size, len(rows))
    settings = dataclasses.replace(
        run.trainer,
        max_steps=steps,
        gradient_accumulation_steps=1,
        per_device_train_batch_size=batch_size,
        lr_scheduler_type=type(run.trainer.lr_scheduler_type)("constant"),
        learning_rate=run.rl.sft_warm_start_learning_rate or run.trainer.learning_rate,
        warmup_steps=0,
    )
    trainer = Trainer(loaded, settings, TrainingLoss.for_sft(), world)
    losses = _train(trainer, loaded, rows, batch_size, run, steps)
    del trainer  # its optimizer state: RL starts with its own
    return {"warm_start/loss_first": losses[0], "warm_start/loss_last": losses[-1]}


def _rows(loaded: Any, task: Any, run: Any) -> list[Any]:
    """The demonstrations as SFT rows, each checked to fit the model's window."""
    from art_hydra.engine.conversation import example_sequence

    demos = demonstrations(task)
    if not demos:
        raise TaskDataError(
            f"rl.sft_warm_start_steps={run.rl.sft_warm_start_steps} trains on the task's "
            f"demonstrations (examples with a conversation), and task {task.name!r} has "
            "none; give the task demonstrations (a 'messages' column with the assistant's "
            "tool calls, or a generator yielding Example.from_conversation(...)), or set "
            "rl.sft_warm_start_steps=0"
        )
    tools = task_tool_schemas(task)
    rows = [example_sequence(loaded.tokenizer, ex, tools, train_prompt=False) for ex in demos]
    longest = max(len(row.tokens) for row in rows)
    if longest > run.model.max_seq_length:
        raise TaskDataError(
            f"a demonstration of the SFT warm start is {longest} tokens, longer than "
            f"model.max_seq_length={run.model.max_seq_length}; set "
            f"model.max_seq_length={longest} or shorten the demonstrations"
        )
    return rows


def _train(
    trainer: Any, loaded: Any, rows: list[Any], batch_size: int, run: Any, steps: int
) -> list[float]:
    """``steps`` optimizer steps over ``rows`` in a seeded shuffled order; the losses."""
    from art_hydra.engine.packing import one_step, pack
    from art_hydra.engine.queue import StepWork

    order: list[int] = []
    rng = random.Random(run.seed)
    losses: list[float] = []
    every = max(1, steps // 5)
    for step in range(1, steps + 1):
        if len(order) < batch_size:
            more = list(range(len(rows)))
            rng.shuffle(more)
            order += more
        chosen, order = order[:batch_size], order[batch_size:]
        batch = pack(
            [rows[i] for i in chosen],
            run.model.max_seq_length,
            loaded.tokenizer.pad_token_id,
            loaded.layout,
        )
        result = trainer.train_step(StepWork(one_step([batch])))
        losses.append(float(result.loss))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"the SFT warm start's loss is {losses[-1]} at step {step}")
        if step % every == 0 or step == steps:
            log.info("SFT warm start: step %d/%d, loss %.4f", step, steps, losses[-1])
    return losses
