"""The evaluation data of a run: a held-out share of the task's distinct prompts
(``eval.fraction``), or data of its own (``eval.path`` / ``eval.split``).

A held-out prompt is never trained on: the split is by distinct prompt (its text, its
messages and how it is encoded), so a prompt the data repeats goes wholly to one side.
Which prompts are held out depends on the seed and the data alone (a resumed run, or
a run on another number of ranks, holds out the same ones). Pure Python (no torch).
"""

from __future__ import annotations

import random
from copy import deepcopy
from typing import Any

from omegaconf import OmegaConf

from art_hydra.config.eval_rules import enabled, own_data
from art_hydra.config.schema import TaskSource
from art_hydra.tasks.examples import Example, TaskDataError

#: Mixed into evaluation's seeds, so that its draws are not training's: the held-out
#: split's is not the data order's (seed + epoch), and the evaluator's sampling is not
#: the producer's (:mod:`art_hydra.engine.evaluation`).
EVAL_SALT = 0x5EED_E7A1


def prompt_key(example: Example) -> tuple[str, tuple[tuple[str, str], ...], bool]:
    """What makes two examples the same prompt (not its answer or other columns), and
    so what its encoding depends on (the producer encodes each distinct prompt once)."""
    return example.prompt, example.messages, example.plain


def first_of_each_prompt(examples: list[Example]) -> dict[Any, Example]:
    """Each distinct prompt's first example, by :func:`prompt_key`, in the data's order."""
    first: dict[Any, Example] = {}
    for example in examples:
        first.setdefault(prompt_key(example), example)
    return first


def held_out_count(distinct: int, fraction: float) -> int:
    """How many of ``distinct`` prompts ``fraction`` holds out (rounded)."""
    return round(fraction * distinct)


def split_examples(
    examples: list[Example], fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """``(train, held_out)``: ``fraction`` of the distinct prompts, drawn with ``seed``,
    go to ``held_out`` (one example per prompt, in the order drawn: its first occurrence);
    every example of the other prompts stays in ``train``, in the data's order.

    Raises :class:`TaskDataError` when the share holds out no prompt or all of them."""
    first = first_of_each_prompt(examples)
    keys = list(first)
    count = held_out_count(len(keys), fraction)
    if count < 1 or count >= len(keys):
        what = "no prompt" if count < 1 else "every prompt"
        # The smallest fraction that holds out one prompt, and keeps one to train on.
        suggested = round(min(0.5, 1.0 / max(len(keys), 1) + 1e-9), 4)
        raise TaskDataError(
            f"eval.fraction={fraction} holds out {what} of the task's {len(keys)} distinct "
            f"prompt(s); set eval.fraction={suggested}"
            + (" or use more data (task.num_examples, a larger file)" if count < 1 else "")
            + ", or evaluate on data of its own (eval.path=...)"
        )
    order = list(range(len(keys)))
    random.Random(seed ^ EVAL_SALT).shuffle(order)
    chosen = {keys[i] for i in order[:count]}
    held = [first[keys[i]] for i in order[:count]]
    train = [ex for ex in examples if prompt_key(ex) not in chosen]
    return train, held


def own_eval_config(cfg: Any) -> Any:
    """A copy of ``cfg`` whose task reads the evaluation data (``eval.path`` and
    ``eval.split``), as the task reads its own: a dataset task reads a dataset, any
    other a JSONL file."""
    copy = deepcopy(cfg)
    OmegaConf.set_readonly(copy, False)
    task = copy.task
    if cfg.task.source == TaskSource.dataset:
        task.path = cfg.eval.path if cfg.eval.path is not None else cfg.task.path
        task.split = cfg.eval.split if cfg.eval.split is not None else cfg.task.split
    else:
        task.source = TaskSource.jsonl
        task.path = cfg.eval.path
    return copy


def eval_examples(cfg: Any, examples: list[Example]) -> tuple[list[Example], list[Example]]:
    """``(train, eval)`` for the run config ``cfg`` and the task's ``examples``: the
    task's examples unchanged and no evaluation data when evaluation is off; a held-out
    split of them with ``eval.fraction``; with ``eval.path``/``eval.split``, the
    examples unchanged and the evaluation data read from there (one per distinct
    prompt). ``eval.max_examples`` keeps the first ones."""
    if not enabled(cfg):
        return examples, []
    if own_data(cfg):
        from art_hydra.tasks.base import build_task

        found = build_task(own_eval_config(cfg)).examples
        train, held = examples, list(first_of_each_prompt(found).values())
    else:
        train, held = split_examples(examples, cfg.eval.fraction, cfg.seed)
    if cfg.eval.max_examples is not None:
        held = held[: cfg.eval.max_examples]
    return train, held
