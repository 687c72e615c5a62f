"""What every pre-flight check shares: the world problem and the top-p rule (which needs
the vocabulary, known from the tiny tokenizer or a model folder's config)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from art_hydra.config import fields
from art_hydra.config.problems import Kind, Problem, Severity, fix


def world_problem(key: str, value: Any, reason: str, remedy: Any, warning: bool = False) -> Problem:
    return Problem(
        key, value, reason, remedy, Kind.world, Severity.warning if warning else Severity.error
    )


def top_p_problems(cfg: DictConfig, vocab: int) -> list[Problem]:
    """The most likely of ``vocab`` tokens has at least 1/vocab of the mass, so top-p at or
    below that keeps one token: greedy decoding, every group without spread."""
    if cfg.rl.top_p > 1 / vocab:
        return []
    return [
        Problem(
            "rl.top_p",
            cfg.rl.top_p,
            f"keeps only the most likely token over a vocabulary of {vocab} (which always has at "
            f"least 1/{vocab} of the mass): greedy decoding, so every group has zero reward "
            "spread and nothing is learned.",
            fix({"rl.top_p": fields.default("rl.top_p")}),
            Kind.world,
        )
    ]
