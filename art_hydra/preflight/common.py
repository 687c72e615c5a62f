"""What every pre-flight check shares: the world problem, the top-p rule (which needs
the vocabulary, known from the tiny tokenizer or a model folder's config), and where the
model's files are (the model, length and task checks all read them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from art_hydra import model_files
from art_hydra.config import fields
from art_hydra.config.problems import Kind, Problem, Severity, fix
from art_hydra.config.schema import ModelSource


def world_problem(key: str, value: Any, reason: str, remedy: Any, warning: bool = False) -> Problem:
    return Problem(
        key, value, reason, remedy, Kind.world, Severity.warning if warning else Severity.error
    )


def top_p_problems(cfg: DictConfig, drawable: int, what: str) -> list[Problem]:
    """The most likely of the ``drawable`` tokens (those the sampler may draw: the
    special ids it never samples left out) has at least 1/drawable of the mass, so
    top-p at or below that surely keeps one token: greedy decoding, every group
    without spread. ``what`` says where the count comes from, for the message."""
    if drawable < 1 or cfg.rl.top_p > 1 / drawable:
        return []
    return [
        Problem(
            "rl.top_p",
            cfg.rl.top_p,
            f"keeps only the most likely token: the sampler can draw {drawable} tokens ({what}), "
            f"and the most likely always has at least "
            f"1/{drawable} = {1 / drawable:.3g} of the mass, so sampling is greedy, every group "
            "has zero reward spread and nothing is learned.",
            fix({"rl.top_p": fields.default("rl.top_p")}),
            Kind.world,
        )
    ]


def model_folder(model_cfg: DictConfig) -> Path | None:
    """The folder the run will load ``model.name`` from (``model_cfg``: the model
    section): :func:`~art_hydra.model_files.load_folder`; None for the tiny model."""
    if model_cfg.source != ModelSource.pretrained:
        return None
    return model_files.load_folder(str(model_cfg.name), model_cfg.revision)
