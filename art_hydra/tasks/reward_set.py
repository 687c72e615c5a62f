"""The task's rewards: which functions, with which weights and names, and how each is called.

``task.rewards`` lists ``{_target_, weight, name}``; when it is empty, the one reward
``task.reward._target_`` (the shorthand the shipped task files use) is the list, with
weight 1. A non-empty ``task.rewards`` replaces ``task.reward`` (the CLI refuses both set
by hand, see :mod:`art_hydra.config.trust`).

Each reward is one of two kinds, told from its signature:

- **per sample** (art_hydra's own): ``f(prompt=..., completion=..., answer=...)`` for one
  completion, returning a number; it may also name any column of the row
  (``Example.columns``) as a parameter;
- **batched** (TRL's ``GRPOTrainer`` convention): ``f(prompts=[...], completions=[...],
  completion_ids=[...], trainer_state=..., answer=[...], **columns)`` for the whole
  generation batch, returning one value per completion, ``None`` where the reward does
  not apply. Conversational rows (``Example.messages``) pass their prompt as a list of
  ``{"role", "content"}`` messages and their completion as
  ``[{"role": "assistant", "content": text}]``, as TRL does; plain rows pass text.

A function that names ``prompts``, ``completions`` or ``completion_ids``, or that takes
only ``**kwargs``, is batched; one that names ``completion`` or ``prompt`` is per sample.
Only the arguments a function accepts are passed, unless it takes ``**kwargs`` (TRL
passes everything; a function written for TRL has ``**kwargs``, so it gets everything).

This module is on the compose/validate path: no torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

from art_hydra.config.objective import reward_name
from art_hydra.config.schema import RewardEntry
from art_hydra.tasks.examples import Example

#: The names a per-sample reward is called with.
PER_SAMPLE_NAMES = ("prompt", "completion", "answer")
#: The names a batched reward is called with besides the columns (and ``answer``).
BATCHED_NAMES = ("prompts", "completions", "completion_ids", "trainer_state")
#: What a multi-turn rollout gives its rewards besides (TRL's ``environments``, batched;
#: each one's ``environment`` and conversation, per sample): never a data column.
AGENT_NAMES = ("environments", "environment", "completion_messages")


@dataclass(frozen=True)
class RewardSpec:
    """One reward as the config names it."""

    #: The config key of its target, for messages: ``task.rewards.1._target_`` or
    #: ``task.reward._target_``.
    key: str
    target: str
    weight: float
    #: Its name in the metrics (``reward/<name>/mean``).
    name: str
    #: The entry's keys besides :data:`ENTRY_KEYS`, as ``(key, value)``: the keyword
    #: arguments a reward class is instantiated with (a function takes none).
    kwargs: tuple[tuple[str, Any], ...] = ()


#: The keys of a ``task.rewards`` entry that are art_hydra's own (the schema's
#: :class:`~art_hydra.config.schema.RewardEntry`); every other key is an argument of the
#: reward class's constructor.
ENTRY_KEYS = frozenset(f.name for f in dataclasses.fields(RewardEntry))
#: An entry's weight when it gives none (the schema's default).
_WEIGHT = next(f.default for f in dataclasses.fields(RewardEntry) if f.name == "weight")


def unknown_arguments(cls: type, kwargs: Mapping[str, Any]) -> dict[str, str | None]:
    """The keys of ``kwargs`` that ``cls``'s constructor does not take, each with the
    parameter (or entry key of art_hydra's own) it most likely meant; empty when the
    constructor takes them all (or ``**kwargs``, or has no signature to read)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return {}
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return {}
    named = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    return {
        k: next(iter(difflib.get_close_matches(k, [*named, *ENTRY_KEYS], n=1, cutoff=0.6)), None)
        for k in kwargs
        if k not in named
    }


def reward_specs(task_cfg: Any) -> list[RewardSpec]:
    """The rewards of ``task_cfg``: ``task.rewards`` when not empty, else the one
    ``task.reward._target_``. Reads nothing but the task section."""
    entries = OmegaConf.select(task_cfg, "rewards", default=None) or []
    if len(entries):
        specs = []
        for i, entry in enumerate(entries):
            target = OmegaConf.select(entry, "_target_", default=None)
            name = OmegaConf.select(entry, "name", default=None)
            weight = OmegaConf.select(entry, "weight", default=_WEIGHT)
            plain = OmegaConf.to_container(entry, resolve=True) if entry is not None else {}
            kwargs = tuple(
                (str(k), v) for k, v in (plain or {}).items() if str(k) not in ENTRY_KEYS
            )
            specs.append(
                RewardSpec(
                    f"task.rewards.{i}._target_",
                    str(target),
                    float(_WEIGHT if weight is None else weight),
                    reward_name(target, name),
                    kwargs,
                )
            )
        return specs
    target = OmegaConf.select(task_cfg, "reward._target_", default=None)
    return [RewardSpec("task.reward._target_", str(target), 1.0, reward_name(target))]


def uses_list(task_cfg: Any) -> bool:
    """Whether ``task.rewards`` (not the shorthand) names the rewards."""
    return bool(len(OmegaConf.select(task_cfg, "rewards", default=None) or []))


# ---- how a reward is called ----------------------------------------------------------


@dataclass(frozen=True)
class Calling:
    """How a reward function is called, read from its signature."""

    batched: bool
    #: The parameters it accepts by name.
    accepts: frozenset[str]
    #: It takes ``**kwargs``: it is given everything.
    takes_all: bool
    #: Parameters it requires (no default) that the call must supply.
    required: tuple[str, ...]

    def columns_named(self) -> tuple[str, ...]:
        """The required parameters that are not art_hydra's own arguments: row columns."""
        own = set(BATCHED_NAMES if self.batched else PER_SAMPLE_NAMES) | {"answer", *AGENT_NAMES}
        return tuple(p for p in self.required if p not in own)

    def pick(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments of ``kwargs`` it accepts (all of them with ``**kwargs``)."""
        if self.takes_all:
            return dict(kwargs)
        return {k: v for k, v in kwargs.items() if k in self.accepts}


def calling(fn: Any) -> Calling | str:
    """How ``fn`` is called, or why it cannot be called as a reward (in words)."""
    call = None if inspect.isfunction(fn) else inspect.getattr_static(type(fn), "__call__", None)
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call):
        return (
            "is a coroutine function (async def): calling it returns a coroutine, not a "
            "score; art_hydra calls rewards synchronously."
        )
    if any(inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f) for f in (fn, call)):
        return "is a generator function (it yields): calling it returns a generator, not a score."
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        return f"has no signature to read ({exc})."
    params = signature.parameters.values()
    named = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    names = {p.name for p in named}
    takes_all = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    positional_only = [
        p.name
        for p in params
        if p.kind == inspect.Parameter.POSITIONAL_ONLY and p.default is inspect.Parameter.empty
    ]
    if positional_only:
        return (
            f"has positional-only parameters ({', '.join(positional_only)}): rewards are called "
            "by parameter name."
        )
    batched = bool(names & {"prompts", "completions", "completion_ids"})
    if not batched and not names & {"prompt", "completion"}:
        if not takes_all:
            own = ", ".join(signature.parameters)
            return (
                f"takes ({own}): neither a per-sample reward, called by parameter name as "
                "reward(prompt=..., completion=..., answer=...), nor a batched one, called as "
                "TRL calls it: reward(prompts=..., completions=..., **columns)."
            )
        batched = True  # only **kwargs: TRL's convention
    required = tuple(p.name for p in named if p.default is inspect.Parameter.empty)
    return Calling(batched, frozenset(names), takes_all, required)


def per_sample_kwargs(
    example: Example, completion: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Everything a per-sample reward may be given for one completion: the row's columns,
    then art_hydra's own arguments (which win over a column of the same name), then a
    multi-turn rollout's own (``environment``, ``completion_messages``)."""
    return {
        **dict(example.columns),
        "prompt": example.prompt,
        "completion": completion,
        "answer": example.answer,
        **(extra or {}),
    }


def _messages(example: Example) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in example.messages]


def batched_kwargs(
    examples: Sequence[Example],
    completions: Sequence[str],
    completion_ids: Sequence[Sequence[int]] | None = None,
    global_step: int = 0,
    agent: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """Everything a batched reward may be given, as TRL's ``GRPOTrainer`` gives it: one
    list entry per completion (each prompt repeated for its group), every column of the
    rows as a list (None where a row lacks it), ``answer`` as a column, and
    ``trainer_state`` (here an object with ``global_step``). A multi-turn rollout's
    ``agent`` lists win: ``completions`` as each trajectory's messages (assistant turns
    with their tool calls, and the tool results) and ``environments``, as TRL passes
    them."""
    columns: dict[str, list[Any]] = {}
    for name in dict.fromkeys(k for ex in examples for k in ex.columns):
        columns[name] = [ex.columns.get(name) for ex in examples]
    columns.setdefault("answer", [ex.answer for ex in examples])
    return {
        **columns,
        "prompts": [_messages(ex) if ex.messages else ex.prompt for ex in examples],
        "completions": [
            [{"role": "assistant", "content": text}] if ex.messages else text
            for ex, text in zip(examples, completions, strict=True)
        ],
        "completion_ids": [list(ids) for ids in completion_ids]
        if completion_ids is not None
        else [[] for _ in examples],
        "trainer_state": SimpleNamespace(global_step=global_step),
        **(agent or {}),
    }


def combine(per_reward: Sequence[Sequence[float | None]], weights: Sequence[float]) -> list[float]:
    """The total reward of each sample: the weighted sum over the rewards that apply
    (TRL's ``nansum``: a None is left out). A sample no reward applies to totals 0, as in
    TRL (which warns; the producer counts them in ``reward_none_all``)."""
    count = len(per_reward[0]) if per_reward else 0
    totals = []
    for i in range(count):
        total = 0.0
        for values, weight in zip(per_reward, weights, strict=True):
            value = values[i]
            if value is not None:
                total += weight * value
        totals.append(total)
    return totals
