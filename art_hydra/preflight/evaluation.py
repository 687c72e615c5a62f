"""The pre-flight of the ``eval`` section: the evaluation data can be read, and a
held-out fraction holds out at least one of the task's distinct prompts and leaves one
to train on; decided before any model loads, from the data itself."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

from art_hydra.config.eval_rules import enabled, own_data
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.schema import TaskSource
from art_hydra.preflight.common import world_problem
from art_hydra.safe_paths import file_refusal
from art_hydra.tasks.base import iter_examples, resolve_rewards
from art_hydra.tasks.examples import TaskDataError
from art_hydra.tasks.held_out import held_out_count, own_eval_config, prompt_key
from art_hydra.tasks.jsonl import Scan


def evaluation_problems(cfg: DictConfig) -> list[Problem]:
    """Every problem of the evaluation data of ``cfg`` (none with evaluation off)."""
    if not enabled(cfg):
        return []
    if own_data(cfg):
        return _own_data_problems(cfg)
    return _fraction_problems(cfg)


def _own_data_problems(cfg: DictConfig) -> list[Problem]:
    ev = cfg.eval
    key = "eval.path" if ev.path is not None else "eval.split"
    value = ev.path if ev.path is not None else ev.split
    if ev.path is not None and cfg.task.source != TaskSource.dataset:
        reason = file_refusal(os.path.expanduser(str(ev.path)))
        if reason is not None:
            return [
                world_problem(
                    "eval.path",
                    ev.path,
                    f"{reason}; evaluation data is read from a regular JSONL file of "
                    '{"prompt": ..., "answer": ...} lines.',
                    fix({"eval.path": placeholder("a regular JSONL file")}),
                )
            ]
    scan = Scan()
    count = 0
    try:
        for _ in iter_examples(own_eval_config(cfg), scan, _rules(cfg)):
            count += 1
    except (TaskDataError, OSError) as exc:
        return [world_problem(key, value, f"cannot be read: {exc}", _fix(key))]
    if scan.error_count:
        return [
            world_problem(
                key, value, f"holds rows that cannot be used:\n{scan.summary()}", _fix(key)
            )
        ]
    if count == 0:
        return [world_problem(key, value, "holds no example to evaluate on.", _fix(key))]
    return []


def _rules(cfg: DictConfig) -> Any:
    """The task's line rules (answers needed by SFT or a reward that scores them)."""
    from art_hydra.tasks.base import data_rules

    try:
        rewards = [(r.spec.target, r.fn) for r in resolve_rewards(cfg.task)]
    except Exception:  # the task's own pre-flight names a reward that cannot be used
        rewards = []
    return data_rules(cfg, rewards)


def _fix(key: str) -> Any:
    if key == "eval.path":
        return fix({"eval.path": placeholder("a readable file of evaluation examples")})
    return fix({"eval.split": placeholder("a split the dataset has")})


def _fraction_problems(cfg: DictConfig) -> list[Problem]:
    fraction = cfg.eval.fraction
    try:
        distinct = {prompt_key(ex) for _, ex in iter_examples(cfg, Scan(), _rules(cfg))}
    except Exception:  # unreadable task data: the task's own pre-flight reports it
        return []
    if not distinct:
        return []
    count = held_out_count(len(distinct), fraction)
    if 1 <= count < len(distinct):
        return []
    what = "no prompt" if count < 1 else "every prompt"
    suggested = round(min(0.5, 1.0 / len(distinct) + 1e-9), 4)
    return [
        world_problem(
            "eval.fraction",
            fraction,
            f"holds out {what} of the task's {len(distinct)} distinct prompt(s): the task is "
            "too small for this share (a held-out prompt is never trained on).",
            fix(
                {"eval.fraction": suggested},
                alt=fix({"eval.fraction": 0, "eval.path": placeholder("a JSONL file")}),
            ),
        )
    ]
