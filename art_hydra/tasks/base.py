"""The task interface and the builder that turns ``cfg.task`` into a :class:`Task`."""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hydra.errors import CompactHydraException

from art_hydra.config.schema import TaskSource

#: reward(prompt, completion, answer) -> float
RewardFn = Callable[[str, str, "str | None"], float]


@dataclass(frozen=True)
class Example:
    """One training example: a prompt and, optionally, its reference answer."""

    prompt: str
    answer: str | None = None


@dataclass
class Task:
    """Examples to train on and the function that scores a completion."""

    name: str
    examples: list[Example]
    reward: RewardFn

    def charset(self) -> str:
        """Every character of every prompt and answer (the tiny model's vocabulary)."""
        chars = {ch for ex in self.examples for ch in ex.prompt + (ex.answer or "")}
        return "".join(sorted(chars))


class TaskDataError(CompactHydraException, ValueError):
    """Task data that cannot be used; the message names the file and line.

    A user's mistake, not a bug: Hydra prints the message alone, without a traceback.
    """


def import_object(path: str, what: str) -> Any:
    """Import ``module.attr`` with an error that says which config value was wrong."""
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise TaskDataError(f"{what}={path!r} cannot be imported: {exc}") from exc


def build_task(task_cfg: Any, seed: int) -> Task:
    """Build the task described by ``cfg.task``; examples are reproducible from ``seed``."""
    from art_hydra.tasks.jsonl import read_jsonl

    if task_cfg.source == TaskSource.jsonl:
        examples = read_jsonl(task_cfg.path)
    else:
        generator = import_object(task_cfg.generator, "task.generator")
        params = dict(task_cfg.params)
        examples = list(generator(random.Random(seed), task_cfg.num_examples, **params))
    if not examples:
        raise TaskDataError(f"task {task_cfg.name!r} has no examples")
    reward = import_object(task_cfg.reward._target_, "task.reward._target_")
    return Task(name=task_cfg.name, examples=examples, reward=reward)
