"""Reward functions: ``reward(prompt=..., completion=..., answer=...) -> float``, or
batched as TRL calls them (see :mod:`art_hydra.tasks.reward_set`).

A reward is marked ``@reward`` (:mod:`art_hydra.tasks.markers`): a config file may name
only marked functions. A reward that scores against the example's reference answer
says so with ``@reward(needs_answer=True)``, so the data check can refuse a file whose
lines lack an answer when it is read, not when the line is first sampled mid-run.
Otherwise a reward needs an answer when its ``answer`` parameter is annotated as a plain
``str``; ``str | None``, a default value or no annotation means it is optional.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from art_hydra.tasks.markers import reward

RewardFn = Callable[[str, str, "str | None"], float]

__all__ = ["RewardFn", "char_overlap", "exact_match", "needs_answer", "reward"]


def needs_answer(fn: Any) -> bool:
    """Whether ``fn`` scores against the reference answer (see the module docstring; a
    batched reward needs it when it requires an ``answer`` parameter, TRL's column)."""
    marked = getattr(fn, "needs_answer", None)
    if isinstance(marked, bool):
        return marked
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    param = params.get("answer")
    if param is None or param.default is not inspect.Parameter.empty:
        return False
    if {"prompts", "completions", "completion_ids"} & set(params):
        return True  # batched: a required answer column
    annotation = param.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return text == "str"


@reward(needs_answer=True)
def exact_match(prompt: str, completion: str, answer: str | None) -> float:
    """1.0 when the completion (stripped) equals the reference answer, else 0.0."""
    if answer is None:
        raise ValueError("exact_match needs a reference answer; give each example an 'answer'")
    return 1.0 if completion.strip() == answer.strip() else 0.0


@reward(needs_answer=True)
def char_overlap(prompt: str, completion: str, answer: str | None) -> float:
    """Share of answer positions matched character by character: a denser signal."""
    if not answer:
        raise ValueError("char_overlap needs a non-empty reference answer")
    hits = sum(a == b for a, b in zip(completion, answer, strict=False))
    return hits / max(len(answer), len(completion))
