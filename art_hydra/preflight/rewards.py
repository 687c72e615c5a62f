"""The task's rewards, checked before any model: each resolves through the trust rules,
can be called as art_hydra will call it, and scores a few real rows.

Every reward of ``task.rewards`` (or the one ``task.reward``) is

1. resolved like the run resolves it (:func:`art_hydra.tasks.base.resolve_task_code`: a
   config file may name only a marked function or class), each problem under its own key
   (``task.rewards.1._target_``); a class is instantiated with the entry's other keys
   (:func:`art_hydra.tasks.base.reward_object`), a constructor that raises named with its
   file and line;
2. read for how it is called (:func:`art_hydra.tasks.reward_set.calling`): an ``async
   def`` or a generator function is refused, as is a signature that is neither a
   per-sample nor a batched reward;
3. checked against the data: a column it requires as a parameter must be in every row
   (a data problem naming the columns the rows have);
4. called on the first few rows (each row's answer as the completion where it has one,
   else its prompt), within ``timeouts.reward_s``, through the run's own scoring
   (:func:`art_hydra.tasks.scoring.score_rewards`): a reward that raises, hangs, returns
   the wrong count or something that is not a number is refused here, not at step 1.

A reward is user code and runs here as it would at step 1 (the trust rules decided
first that it may run at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.config.problems import Problem, fix
from art_hydra.config.targets import NotMarkedError, TargetError, key_role
from art_hydra.errors import RewardError
from art_hydra.preflight.common import world_problem
from art_hydra.tasks.base import RewardArgsError, resolve_task_code, reward_object
from art_hydra.tasks.examples import Example, TaskDataError
from art_hydra.tasks.reward_set import Calling, RewardSpec, calling, reward_specs
from art_hydra.tasks.scoring import BoundReward, score_rewards

#: Rows each reward is called on in the pre-flight.
ROWS = 4


@dataclass
class Resolved:
    """One reward of the config, as far as it resolved (``fn``/``how`` None: a problem
    was reported)."""

    spec: RewardSpec
    fn: Any = None
    how: Calling | None = None

    @property
    def bound(self) -> BoundReward | None:
        return BoundReward(self.fn, self.spec, self.how) if self.how is not None else None


def resolve_rewards(cfg: DictConfig) -> tuple[list[Resolved], list[Problem]]:
    """Every reward resolved and read for its calling convention, with the problems of
    those that cannot run."""
    found: list[Resolved] = []
    problems: list[Problem] = []
    for spec in reward_specs(cfg.task):
        item = Resolved(spec)
        found.append(item)
        try:
            found_object = resolve_task_code(cfg.task, spec.key)
        except TaskDataError as exc:
            problems.append(_target_problem(spec, exc))
            continue
        try:
            item.fn = reward_object(found_object, spec)
        except RewardArgsError as exc:
            problems.append(_args_problem(cfg, spec, exc))
            continue
        how = calling(item.fn)
        if isinstance(how, str):
            problems.append(
                world_problem(
                    spec.key,
                    spec.target,
                    how,
                    fix(
                        note="write it as def f(prompt, completion, answer) -> float (per "
                        "sample) or def f(prompts, completions, **kwargs) -> list[float | None] "
                        "(batched, as TRL)"
                    ),
                )
            )
            continue
        item.how = how
    return found, problems


def _args_problem(cfg: DictConfig, spec: RewardSpec, exc: RewardArgsError) -> Problem:
    """A reward entry whose object cannot be made (:func:`reward_object`): a key neither
    a function nor the class's constructor takes is dropped from the entry, or spelt as
    the key it most likely meant (``weigth``: weight; ``scael``: scale); a constructor
    that raised is the user's code, named with its file and line."""
    entry = spec.key.removesuffix("._target_")
    kwargs = dict(spec.kwargs)
    if exc.__cause__ is None:  # keys the function or the constructor does not take
        entries = OmegaConf.to_container(cfg.task.rewards, resolve=True)
        wanted = [dict(e) for e in entries] if isinstance(entries, list) else []
        index = int(entry.rpartition(".")[2])
        if index < len(wanted):
            for k, close in exc.meant.items():
                value = wanted[index].pop(k, None)
                if close:
                    wanted[index][close] = value
        first = next(iter(exc.meant), None)
        return world_problem(
            exc.keys[0] if exc.keys else spec.key,
            kwargs.get(first, spec.target),
            f"{spec.target} ({spec.key}) {exc.reason}",
            fix({"task.rewards": wanted}),
        )
    return world_problem(
        spec.key,
        spec.target,
        exc.reason,
        fix(
            note="fix the constructor where it raised"
            + (f", or the arguments the entry gives it ({', '.join(exc.keys)})" if exc.keys else "")
        ),
    )


def _target_problem(spec: RewardSpec, exc: TaskDataError) -> Problem:
    cause = exc.__cause__
    reason = str(cause) if isinstance(cause, TargetError) else str(exc)
    role = key_role(spec.key)
    remedy = (
        fix(
            note=f"mark it @{role} (from art_hydra import {role}), or {spec.key}={spec.target} "
            "on the command line"
        )
        if isinstance(cause, NotMarkedError)
        else fix(note=f"{spec.key}=<module.function>")
    )
    return world_problem(spec.key, spec.target, reason, remedy)


def answer_pairs(resolved: Sequence[Resolved]) -> list[tuple[str, Any]]:
    """``(path, function)`` of each reward, for the data rules (who needs an answer)."""
    return [(r.spec.target, r.fn) for r in resolved]


@dataclass(frozen=True)
class Columns:
    """Which columns the task's rows have: in every row, in some, and where the first row
    lacking one is."""

    every: frozenset[str]
    some: frozenset[str]
    first_row: str


def column_problems(
    resolved: Sequence[Resolved], columns: Columns, data_key: str, data_value: Any
) -> list[Problem]:
    """A column a reward requires as a parameter that not every row has: a data problem
    (under ``data_key``) naming the reward, the column and the columns present."""
    problems = []
    for item in resolved:
        if item.how is None:
            continue
        for column in item.how.columns_named():
            if column in columns.every:
                continue
            present = ", ".join(sorted(columns.every)) or "none besides the prompt and answer"
            which = (
                f"not every row has it (the first row without it: {columns.first_row})"
                if column in columns.some
                else "no row has it"
            )
            problems.append(
                world_problem(
                    data_key,
                    data_value,
                    f"the reward {item.spec.target} ({item.spec.key}) takes the column "
                    f"'{column}' as a parameter, but {which}; the columns every row has: "
                    f"{present}.",
                    fix(
                        note=f"give every row a '{column}' column, or give the reward's "
                        f"parameter a default ({column}=None)"
                    ),
                )
            )
    return problems


#: Rewards already called on the same rows in this process (a sweep's points share them):
#: the problem, or the values it gave (None: does not apply).
_called: dict[tuple[str, str, int], Problem | list[float | None]] = {}


def call_problems(
    cfg: DictConfig, resolved: Sequence[Resolved], rows: Sequence[Example], skip: set[str]
) -> list[Problem]:
    """Each reward (but those in ``skip``, keys already refused) called on ``rows``, each
    row's answer as its completion (its prompt when it has none), within
    ``timeouts.reward_s``; a failure is a problem under the reward's key. Rows no reward
    applies to (every one returned None) are a warning, as TRL warns of them: the run
    would give them a total of 0 every time they are drawn."""
    if not rows:
        return []
    pairs = [(row, row.answer if row.answer else row.prompt) for row in rows]
    agent = agent_arguments(cfg, rows)
    if agent is UNAVAILABLE:  # the environments' check says why they cannot be made
        return []
    problems = []
    values: list[list[float | None]] = []
    for item in resolved:
        bound = item.bound
        if bound is None or item.spec.key in skip:
            continue
        key = (item.spec.target, item.spec.key, id(rows))
        if key not in _called:
            _called[key] = _call(cfg, bound, pairs, agent)
        found = _called[key]
        if isinstance(found, Problem):
            problems.append(found)
        else:
            values.append(found)
    if problems or not values or len(values) != len(resolved):
        return problems
    none_all = [i for i in range(len(pairs)) if all(v[i] is None for v in values)]
    if not none_all:
        return problems
    keys = ", ".join(item.spec.key for item in resolved)
    every = "every reward" if len(resolved) > 1 else "the reward"
    first = pairs[none_all[0]][0].prompt
    return [
        world_problem(
            resolved[0].spec.key if len(resolved) == 1 else "task.rewards",
            resolved[0].spec.target if len(resolved) == 1 else [r.spec.target for r in resolved],
            f"was called on the first {len(pairs)} rows of the data (each row's answer as the "
            f"completion) and {every} ({keys}) returned None for {len(none_all)} of them "
            f"(the first: prompt {first[:80]!r}): no reward applies to those completions, so "
            "their total is 0 (as in TRL, which warns of it) and they teach nothing.",
            fix(
                note="return a number where a reward applies, or add a reward that applies "
                "to these rows"
            ),
            warning=True,
        )
    ]


#: The rollouts' environments could not be made here (the environments' own check
#: reports why): rewards of an agent task are not called then.
UNAVAILABLE: Any = object()


def agent_arguments(cfg: DictConfig, rows: Sequence[Example]) -> Any:
    """What a multi-turn rollout gives the rewards, for the dry run on ``rows``: each
    row's answer as a one-turn conversation (``completions``, as a run passes messages)
    and, with ``task.environment``, one environment per row made and reset, bounded by
    ``timeouts.tool_s``; None for a single-turn task, :data:`UNAVAILABLE` when the
    environments cannot be made."""
    from art_hydra import workers
    from art_hydra.tasks.agent_code import (
        environment_kwargs,
        reset_arguments,
        reset_row,
        resolve_agent_code,
        uses_agent_code,
    )

    if not uses_agent_code(cfg.task):
        return None
    found: dict[str, Any] = {
        "completions": [[{"role": "assistant", "content": r.answer or r.prompt}] for r in rows]
    }

    def make() -> None:
        env_class, _ = resolve_agent_code(cfg.task)
        if env_class is None:
            return
        envs = []
        for row in rows:
            env = env_class(**environment_kwargs(cfg.task))
            env.reset(**reset_arguments(env.reset, reset_row(row)))
            envs.append(env)
        found["environments"] = envs

    failed: list[BaseException] = []

    def work() -> None:
        try:
            make()
        except BaseException as exc:
            failed.append(exc)

    thread = workers.start(work, "preflight-environments")
    thread.join(float(cfg.timeouts.tool_s))
    if thread.is_alive() or failed:
        return UNAVAILABLE
    return found


def _call(
    cfg: DictConfig,
    bound: BoundReward,
    pairs: list[tuple[Example, str]],
    agent: dict[str, list[Any]] | None = None,
) -> Problem | list[float | None]:
    timeout = float(cfg.timeouts.reward_s)
    try:
        return score_rewards([bound], pairs, timeout, agent=agent).per_reward[0]
    except RewardError as exc:
        return world_problem(
            bound.spec.key,
            bound.spec.target,
            f"was called on the first {len(pairs)} rows of the data (each row's answer as the "
            f"completion, its prompt where it has none) and failed: {exc}",
            fix(
                note="make it return one finite number per completion (a batched reward: a "
                "list of numbers or None, one per completion); try it with the rows named"
            ),
        )
