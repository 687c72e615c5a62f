"""The task interface and the builder that turns ``cfg.task`` into a :class:`Task`."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from art_hydra.config.schema import AlgorithmName, TaskSource
from art_hydra.config.targets import TargetError, resolve
from art_hydra.config.trust import current_hand
from art_hydra.tasks.examples import Example, TaskDataError
from art_hydra.tasks.jsonl import line_limit, read_jsonl
from art_hydra.tasks.reward_set import reward_specs
from art_hydra.tasks.rewards import needs_answer
from art_hydra.tasks.scoring import BoundReward, bind


@dataclass
class Task:
    """Examples to train on and the rewards that score a completion."""

    name: str
    examples: list[Example]
    #: The rewards, weighted (see :mod:`art_hydra.tasks.reward_set`).
    rewards: list[BoundReward]

    def charset(self) -> str:
        """Every character of every prompt and answer (the tiny model's vocabulary)."""
        chars = {ch for ex in self.examples for ch in ex.prompt + (ex.answer or "")}
        return "".join(sorted(chars))


@dataclass(frozen=True)
class DataRules:
    """What each line of a task's data must satisfy, derived from the run config."""

    #: Longest line accepted, in bytes, before it is parsed.
    max_line_bytes: int
    #: The budget that limit comes from, for messages.
    limit_reason: str
    #: Who needs every example to carry an answer (None: answers are optional).
    answer_needed_by: str | None


def answer_needed_by(cfg: Any, rewards: Any) -> str | None:
    """Who needs every example to carry an answer: SFT, or the first reward that scores
    against it (``rewards``: ``(path, function)`` pairs; a function may be None)."""
    if cfg.algorithm.name == AlgorithmName.sft:
        return "SFT"
    for path, fn in rewards:
        if fn is not None and needs_answer(fn):
            return f"the reward {path}"
    return None


def data_rules(cfg: Any, rewards: Any) -> DataRules:
    """The line rules for ``cfg``'s task: the length budget of the algorithm, and whether
    SFT or a reward needs answers (``rewards``: ``(path, function)`` pairs)."""
    if cfg.algorithm.name == AlgorithmName.sft:
        budget, reason = cfg.sft.max_length, f"sft.max_length={cfg.sft.max_length}"
    else:
        budget = cfg.rl.max_prompt_length
        reason = f"rl.max_prompt_length={budget}"
    return DataRules(line_limit(budget), reason, answer_needed_by(cfg, rewards))


def resolve_task_code(task_cfg: Any, key: str) -> Any:
    """The reward (``key="task.reward._target_"`` or ``"task.rewards.N._target_"``) or
    generator: a marked function, or one the user named by hand (the target, or its
    module in ``task.allowed_modules``; see :mod:`art_hydra.config.targets`). Outside a
    checked entry (``train(cfg)`` from Python) everything in ``cfg`` counts as the
    caller's own choice."""
    path = task_cfg.generator if key == "task.generator" else task_path(task_cfg, key)
    hand = current_hand()
    modules = task_cfg.allowed_modules if hand is None or hand.set("task.allowed_modules") else ()
    try:
        return resolve(path, key, by_hand=hand is None or hand.set(key), hand_modules=modules)
    except TargetError as exc:
        raise TaskDataError(f"{key}={path}: {exc}") from exc


def task_path(task_cfg: Any, key: str) -> Any:
    """The value of ``key`` (``task.…``) in the task section."""
    from omegaconf import OmegaConf

    return OmegaConf.select(task_cfg, key.removeprefix("task."), default=None)


def resolve_rewards(task_cfg: Any) -> list[BoundReward]:
    """Every reward of the task (``task.rewards``, or the one ``task.reward``), resolved
    through the trust rules and bound to how it is called."""
    return [bind(resolve_task_code(task_cfg, spec.key), spec) for spec in reward_specs(task_cfg)]


def generate_examples(task_cfg: Any, generator: Any, seed: int) -> list[Example]:
    """The generated task's examples, reproducible from ``seed``; the generator is called
    by parameter name, ``generator(rng=..., num_examples=..., **task.params)``."""
    params = dict(task_cfg.params)
    return list(generator(rng=random.Random(seed), num_examples=task_cfg.num_examples, **params))


def build_task(cfg: Any) -> Task:
    """Build the task of run config ``cfg`` (reads ``cfg.task``, and the length budget and
    algorithm that decide which data lines are usable)."""
    task_cfg = cfg.task
    rewards = resolve_rewards(task_cfg)
    if task_cfg.source == TaskSource.jsonl:
        rules = data_rules(cfg, [(r.spec.target, r.fn) for r in rewards])
        examples = read_jsonl(
            task_cfg.path,
            max_line_bytes=rules.max_line_bytes,
            limit_reason=rules.limit_reason,
            answer_needed_by=rules.answer_needed_by,
        )
    else:
        generator = resolve_task_code(task_cfg, "task.generator")
        examples = generate_examples(task_cfg, generator, cfg.seed)
    if not examples:
        raise TaskDataError(f"task {task_cfg.name!r} has no examples")
    return Task(task_cfg.name, examples, rewards)
