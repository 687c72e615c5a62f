"""The pre-flight of the ``eval`` section: the evaluation data can be read, and a
held-out fraction holds out at least one of the task's distinct prompts and leaves one
to train on; decided before any model loads, from the data itself."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig

from art_hydra.config.eval_rules import enabled, own_data
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.schema import AlgorithmName, TaskSource
from art_hydra.preflight import lengths
from art_hydra.preflight.common import world_problem
from art_hydra.safe_paths import file_refusal
from art_hydra.tasks.base import iter_examples, resolve_rewards
from art_hydra.tasks.examples import TaskDataError
from art_hydra.tasks.held_out import (
    held_out_count,
    own_eval_config,
    prompt_key,
    split_examples,
)
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
    # Measured as the training data is: evaluation encodes its prompts (and, under SFT,
    # scores the loss on prompt + answer rows) with the run's tokenizer and budgets.
    measured = lengths.lengths_for(cfg)
    try:
        for where, example in iter_examples(own_eval_config(cfg), scan, _rules(cfg)):
            count += 1
            if measured is not None:
                measured.add(where, example)
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
    problems = lengths.length_problems(cfg, measured, key, value, "evaluated on")
    return problems + _generation_problems(cfg, measured)


def _generation_problems(cfg: DictConfig, measured: lengths.Lengths | None) -> list[Problem]:
    """Evaluation generates up to ``eval.max_completion_length`` (else
    ``rl.max_completion_length``) tokens after each of its prompts: the longest prompt
    plus that must fit the model's positions, or the first evaluation, after training,
    would index past the position table (an IndexError) or run on untrained positions.
    The tiny model is built to the run's room and has no such limit."""
    if measured is None or measured.overrun or not measured.prompt.size:
        return []
    positions = lengths.positions(cfg)
    own = cfg.eval.max_completion_length
    new = own if own is not None else cfg.rl.max_completion_length
    prompt = measured.prompt
    if positions is None or prompt.size + new <= positions:
        return []
    said = (
        f"eval.max_completion_length={own}"
        if own is not None
        else f"rl.max_completion_length={new} (eval.max_completion_length=null)"
    )
    remedy = (
        fix({"eval.max_completion_length": positions - prompt.size}, "completions that fit")
        if prompt.size < positions
        else fix(note="shorten or drop the longest evaluation prompts")
    )
    return [
        world_problem(
            "eval.max_completion_length",
            own,
            f"evaluation generates up to {said} tokens after each evaluation prompt, and the "
            f"longest ({prompt.where}) takes {prompt.size} tokens: {prompt.size + new} is more "
            f"than the model's {positions} positions, so the first evaluation (after "
            "training) would index past its position table or run on untrained positions.",
            remedy,
        )
    ]


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
        rows = list(iter_examples(cfg, Scan(), _rules(cfg)))
    except Exception:  # unreadable task data: the task's own pre-flight reports it
        return []
    distinct = {prompt_key(ex) for _, ex in rows}
    if not distinct:
        return []
    count = held_out_count(len(distinct), fraction)
    if 1 <= count < len(distinct):
        return _held_out_problems(cfg, rows)
    what = "no prompt" if count < 1 else "every prompt"
    # The smallest share that holds out one prompt and keeps one to train on; a task of
    # one prompt has none, so evaluation goes off or reads data of its own.
    suggested = round(min(0.5, 1.0 / len(distinct) + 1e-9), 4)
    works = 1 <= held_out_count(len(distinct), suggested) < len(distinct)
    own_file = fix({"eval.fraction": 0, "eval.path": placeholder("a JSONL file")})
    remedy = (
        fix({"eval.fraction": suggested}, alt=own_file)
        if works and suggested != fraction
        else fix(
            {"eval.fraction": 0},
            "no evaluation: one prompt cannot be both trained on and held out",
            alt=own_file,
        )
    )
    return [
        world_problem(
            "eval.fraction",
            fraction,
            f"holds out {what} of the task's {len(distinct)} distinct prompt(s): the task is "
            "too small for this share (a held-out prompt is never trained on).",
            remedy,
        )
    ]


def _held_out_problems(cfg: DictConfig, rows: list[tuple[str, Any]]) -> list[Problem]:
    """The held-out prompts (the run's own split) against the model's positions. Under
    RL with no ``eval.max_completion_length`` of its own they are the task's prompts with
    its completion budget, which the model check already held against the positions."""
    if cfg.algorithm.name == AlgorithmName.rl and cfg.eval.max_completion_length is None:
        return []
    if lengths.positions(cfg) is None:
        return []
    measured = lengths.lengths_for(cfg)
    if measured is None:
        return []
    where = {id(ex): place for place, ex in rows}
    try:
        _, held = split_examples([ex for _, ex in rows], cfg.eval.fraction, cfg.seed)
    except TaskDataError:
        return []
    if cfg.eval.max_examples is not None:
        held = held[: cfg.eval.max_examples]
    for example in held:
        measured.add(where.get(id(example), "a held-out prompt"), example)
    return _generation_problems(cfg, measured)
