"""Reward functions: ``reward(prompt, completion, answer) -> float``."""

from __future__ import annotations


def exact_match(prompt: str, completion: str, answer: str | None) -> float:
    """1.0 when the completion (stripped) equals the reference answer, else 0.0."""
    if answer is None:
        raise ValueError("exact_match needs a reference answer; give each example an 'answer'")
    return 1.0 if completion.strip() == answer.strip() else 0.0


def char_overlap(prompt: str, completion: str, answer: str | None) -> float:
    """Share of answer positions matched character by character: a denser signal."""
    if not answer:
        raise ValueError("char_overlap needs a non-empty reference answer")
    hits = sum(a == b for a, b in zip(completion, answer, strict=False))
    return hits / max(len(answer), len(completion))
