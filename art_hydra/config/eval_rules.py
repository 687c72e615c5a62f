"""The ``eval`` section's rules: when evaluation is on, which ``eval/*`` metrics a run
logs (the objective may name them), and the validators between its keys.

Plain Python on the compose path: it reads the resolved config only (the held-out
split itself, and whether a file can be read, are decided later, by
:mod:`art_hydra.tasks.held_out` and :mod:`art_hydra.preflight.evaluation`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig

from art_hydra.config.objective import reward_name
from art_hydra.config.problems import Kind, Problem, Severity, fix, placeholder
from art_hydra.config.run_length import known_steps, steps_named
from art_hydra.config.schema import AlgorithmName, TaskSource
from art_hydra.config.validator_registry import validator

#: The prefix of every evaluation metric in a step's record (and its TensorBoard tag).
PREFIX = "eval/"

#: The fix that turns evaluation on: the shortest way there.
TURN_ON = {"eval.fraction": 0.1}


def enabled(cfg: Any) -> bool:
    """Whether ``cfg`` evaluates: a held-out fraction, or its own data (``eval.path``, or
    ``eval.split`` of a dataset task)."""
    ev = cfg.eval
    return ev.fraction > 0 or ev.path is not None or ev.split is not None


def own_data(cfg: Any) -> bool:
    """Whether evaluation reads data of its own instead of holding out a fraction."""
    return cfg.eval.path is not None or cfg.eval.split is not None


def reward_names(task: Any) -> list[str]:
    """The task's rewards by their metric names (``task.rewards``, else the one
    ``task.reward``)."""
    if len(task.rewards):
        return [reward_name(e._target_, e.name) for e in task.rewards]
    return [reward_name(task.reward._target_)]


def metric_names(cfg: Any) -> tuple[str, ...]:
    """Every ``eval/*`` metric a run with ``cfg`` logs at an evaluation (none when
    evaluation is off). ``eval/exact`` needs reference answers; it is listed as the
    objective may name it (a run without answers logs none)."""
    if not enabled(cfg):
        return ()
    names = [
        "eval/reward",
        *(f"eval/reward_{n}" for n in reward_names(cfg.task)),
        "eval/exact",
        "eval/completion_length",
        "eval/examples",
        "eval/time_s",
    ]
    if cfg.eval.num_samples > 0:
        names += ["eval/sampled_reward", "eval/sampled_exact"]
    if cfg.algorithm.name == AlgorithmName.sft:
        names.append("eval/loss")
    return tuple(names)


def objective_problem(cfg: DictConfig, metric: str) -> Problem | None:
    """An ``objective.metric`` of ``eval/*``: None when this run logs it, else the
    problem (evaluation off, or a name evaluation never logs)."""
    if not enabled(cfg):
        return Problem(
            "objective.metric",
            metric,
            "names an evaluation metric, but evaluation is off (eval.fraction=0, no "
            "eval.path or eval.split): the run logs no eval/* metric and every job would "
            "return NaN to the sweeper.",
            fix(TURN_ON, "hold out 10% of the prompts", alt=fix({"objective.metric": "auto"})),
        )
    valid = metric_names(cfg)
    if metric in valid:
        return None
    return Problem(
        "objective.metric",
        metric,
        f"is no evaluation metric this run logs; it logs {', '.join(valid)}.",
        fix({"objective.metric": "eval/reward"}),
    )


def _warning(key: str, value: object, reason: str, remedy: object) -> Problem:
    return Problem(key, value, reason, remedy, Kind.rule, Severity.warning)  # type: ignore[arg-type]


@validator
def eval_data_is_one_choice(cfg: DictConfig) -> Iterator[Problem]:
    """Evaluation holds out a fraction of the task's prompts or reads its own data, not
    both: which one was meant cannot be guessed. ``eval.split`` alone names a split of
    the task's own dataset, which only a dataset task has."""
    ev = cfg.eval
    if ev.fraction > 0 and own_data(cfg):
        key = "eval.path" if ev.path is not None else "eval.split"
        yield Problem(
            key,
            ev.path if ev.path is not None else ev.split,
            f"is set together with eval.fraction={ev.fraction}: evaluation either holds out "
            "a fraction of the task's prompts or reads its own data, not both.",
            fix({"eval.fraction": 0}, "evaluate on this data", alt=fix({key: None})),
        )
    if ev.split is not None and cfg.task.source != TaskSource.dataset:
        yield Problem(
            "eval.split",
            ev.split,
            f"names a dataset split, but task.source={cfg.task.source.name} has no splits "
            "(only task.source=dataset has).",
            fix({"eval.split": None}, alt=fix({"eval.path": placeholder("a JSONL file")})),
        )
    if (
        ev.split is not None
        and ev.path is None
        and cfg.task.source == TaskSource.dataset
        and ev.split == cfg.task.split
    ):
        yield _warning(
            "eval.split",
            ev.split,
            f"is the split the run trains on (task.split={cfg.task.split}): evaluation on "
            "the training data measures memory, not generalisation.",
            fix({"eval.split": "test"}, alt=fix({"eval.fraction": 0.1, "eval.split": None})),
        )


@validator
def eval_fraction_holds_out_a_prompt(cfg: DictConfig) -> Iterator[Problem]:
    """A generated task of N examples has at most N distinct prompts: a fraction that
    holds out less than one of them holds out nothing (the run's own split checks the
    distinct prompts the data really has)."""
    ev = cfg.eval
    if ev.fraction <= 0 or cfg.task.source != TaskSource.generated:
        return
    n = cfg.task.num_examples
    if round(ev.fraction * n) < 1:
        yield Problem(
            "eval.fraction",
            ev.fraction,
            f"holds out no prompt of task.num_examples={n} (at most {n} distinct prompts; "
            f"{ev.fraction} of them rounds to 0).",
            fix({"eval.fraction": round(min(0.5, 1.0 / n + 1e-9), 4)}),
        )


@validator
def eval_settings_need_evaluation(cfg: DictConfig) -> Iterator[Problem]:
    """An evaluation interval longer than the run evaluates only at the end. (Evaluation
    settings without evaluation are :mod:`art_hydra.config.inert`'s: each one set.)"""
    steps = known_steps(cfg)  # a run sized by the data: the world pre-flight's, counted
    if enabled(cfg) and steps is not None:
        yield from eval_interval_problems(cfg, steps)


def eval_interval_problems(cfg: DictConfig, steps: int) -> Iterator[Problem]:
    """An evaluation interval longer than the run's ``steps``."""
    ev = cfg.eval
    if ev.every_steps > steps:
        yield _warning(
            "eval.every_steps",
            ev.every_steps,
            f"is longer than the run ({steps_named(cfg, steps)}): it evaluates only at the end.",
            fix({"eval.every_steps": max(1, steps // 5)}),
        )
