"""The task interface and the builder that turns ``cfg.task`` into a :class:`Task`."""

from __future__ import annotations

import difflib
import inspect
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from art_hydra.config.schema import AlgorithmName, TaskSource
from art_hydra.config.targets import TargetError, resolve
from art_hydra.config.trust import current_hand
from art_hydra.errors import raised
from art_hydra.tasks.examples import Example, TaskDataError
from art_hydra.tasks.jsonl import Scan, iter_records, line_limit, record_example, trl_format
from art_hydra.tasks.reward_set import ENTRY_KEYS, RewardSpec, reward_specs, unknown_arguments
from art_hydra.tasks.rewards import needs_answer
from art_hydra.tasks.scoring import BoundReward, bind


@dataclass
class Task:
    """Examples to train on and the rewards that score a completion."""

    name: str
    examples: list[Example]
    #: The rewards, weighted (see :mod:`art_hydra.tasks.reward_set`).
    rewards: list[BoundReward]
    #: The JSON schemas of the task's tools (``task.environment``'s methods and
    #: ``task.tools``), which the chat template shows in every prompt and demonstration;
    #: None: no tools. Set once the run resolves them.
    tool_schemas: list[dict[str, Any]] | None = None

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


class RewardArgsError(TaskDataError):
    """A reward entry whose object cannot be made: a class whose constructor raised, or
    constructor arguments given to a function. ``reason`` is the message without the
    key; ``keys`` the entry's keys to blame (its ``_target_`` when none is); ``meant``
    the key each wrong key most likely meant (None: none close), for the fix."""

    def __init__(
        self,
        spec: RewardSpec,
        reason: str,
        keys: tuple[str, ...] = (),
        meant: dict[str, str | None] | None = None,
    ) -> None:
        super().__init__(f"{spec.key}={spec.target}: {reason}")
        self.reason = reason
        self.keys = keys
        self.meant = meant or {}


def reward_object(found: Any, spec: RewardSpec) -> Any:
    """The reward ``found`` (what its ``_target_`` resolved to) stands for: a function as
    it is; a class instantiated with the entry's other keys as keyword arguments, as
    Hydra's ``instantiate`` would, the instance being the reward (TRL takes any callable)."""
    kwargs = dict(spec.kwargs)
    entry = spec.key.removesuffix("._target_")
    if not inspect.isclass(found):
        if kwargs:
            keys = tuple(f"{entry}.{k}" for k in kwargs)
            near = {
                k: close[0]
                for k in kwargs
                if (close := difflib.get_close_matches(k, sorted(ENTRY_KEYS), n=1, cutoff=0.6))
            }
            meant = "".join(f" ({k}: did you mean {v}?)" for k, v in near.items())
            raise RewardArgsError(
                spec,
                f"is a function, and the entry's other keys ({', '.join(kwargs)}) would be "
                f"arguments of a reward class's constructor; a function takes none{meant}.",
                keys,
                {k: near.get(k) for k in kwargs},
            )
        return found
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    if unknown := unknown_arguments(found, kwargs):
        takes = ", ".join(str(inspect.signature(found)).strip("()").split(", ")) or "nothing"
        raise RewardArgsError(
            spec,
            f"is a class, and its constructor {found.__qualname__}({takes}) takes no "
            + ", ".join(
                f"'{k}'" + (f" (did you mean {v}?)" if v else "") for k, v in unknown.items()
            )
            + f": the entry's keys besides {', '.join(sorted(ENTRY_KEYS))} are its arguments.",
            tuple(f"{entry}.{k}" for k in unknown),
            unknown,
        )
    try:
        return found(**kwargs)
    except Exception as exc:
        raise RewardArgsError(
            spec,
            f"is a class, instantiated as {found.__qualname__}({shown})"
            + (f" (the entry's keys besides {', '.join(sorted(ENTRY_KEYS))})" if kwargs else "")
            + f", and its constructor raised {raised(exc)}.",
            tuple(f"{entry}.{k}" for k in kwargs),
        ) from exc


def resolve_rewards(task_cfg: Any) -> list[BoundReward]:
    """Every reward of the task (``task.rewards``, or the one ``task.reward``), resolved
    through the trust rules, instantiated when it is a class, and bound to how it is
    called."""
    return [
        bind(reward_object(resolve_task_code(task_cfg, spec.key), spec), spec)
        for spec in reward_specs(task_cfg)
    ]


def generate_examples(task_cfg: Any, generator: Any, seed: int) -> list[Example]:
    """The generated task's examples, reproducible from ``seed``; the generator is called
    by parameter name, ``generator(rng=..., num_examples=..., **task.params)``."""
    params = dict(task_cfg.params)
    return list(generator(rng=random.Random(seed), num_examples=task_cfg.num_examples, **params))


def with_system_prompt(example: Example, system_prompt: str | None) -> Example:
    """``example`` with ``task.system_prompt`` as its first turn: before a text prompt (a
    two-message conversation the chat template renders), or before a conversation that
    has no system turn of its own (TRL's usual ``[{"role": "user", ...}]``); a
    conversation that brings its own system turn keeps it."""
    if not system_prompt:
        return example
    if example.conversation and '"role": "system"' not in example.conversation[0]:
        # A demonstration is rendered as its rollout would be: under the same system turn.
        system = {"role": "system", "content": system_prompt}
        example = replace(example, conversation=(system, *example.conversation_messages()))
    if not example.messages:
        return replace(example, messages=(("system", system_prompt), ("user", example.prompt)))
    if any(role == "system" for role, _ in example.messages):
        return example
    return replace(example, messages=(("system", system_prompt), *example.messages))


def iter_examples(
    cfg: Any,
    errors: Scan | None = None,
    rules: DataRules | None = None,
    system: bool = True,
    *,
    fetch: bool = False,
) -> Iterator[tuple[str, Example]]:
    """Every example of ``cfg``'s task as ``(where, example)``, streamed (a file is never
    held whole), for any ``task.source``, with ``task.system_prompt`` applied.

    ``where`` names the row: ``file:line`` (JSONL lines, CSV), ``file:row N`` (parquet,
    Arrow, a JSON array; N from 0), ``split:row`` (a ``save_to_disk`` folder) or
    ``example #i`` (a generator). With ``errors`` (a :class:`Scan`), rows that cannot be
    used are skipped and recorded there, a source that cannot be opened as one error
    (the pre-flight reports them, :func:`build_task` raises them all at once); without
    it the first one raises :class:`TaskDataError`. A generator's own exception
    propagates. ``rules`` (default: the algorithm's, with no reward) bound line sizes
    and say who needs answers.
    ``system=False`` yields the rows as the data has them (the pre-flight checks the
    system prompt on its own). ``fetch=True`` (the run's start only, never a pre-flight)
    fetches a dataset card's remote data files that ``task.allow_remote_data`` allows."""
    rules = rules or data_rules(cfg, ())
    prompt = cfg.task.get("system_prompt") if system else None
    for where, example in _raw_examples(cfg, errors, rules, fetch):
        yield where, with_system_prompt(example, prompt)


def _raw_examples(
    cfg: Any, errors: Scan | None, rules: DataRules, fetch: bool = False
) -> Iterator[tuple[str, Example]]:
    """The task's examples as its source gives them, each with where it came from (see
    :func:`iter_examples`), by ``task.source``."""
    task_cfg = cfg.task
    if task_cfg.source == TaskSource.generated:
        yield from _generated_examples(task_cfg, cfg.seed, errors)
    elif task_cfg.source == TaskSource.jsonl:
        yield from _jsonl_examples(task_cfg, errors, rules)
    else:
        yield from _dataset_examples(task_cfg, errors, rules, fetch)


def _generated_examples(
    task_cfg: Any, seed: int, errors: Scan | None
) -> Iterator[tuple[str, Example]]:
    """A generator task's examples (``task.generator`` called with the run's seed); what
    it yields that is not an :class:`Example` is a bad row."""
    generator = resolve_task_code(task_cfg, "task.generator")
    for i, example in enumerate(generate_examples(task_cfg, generator, seed)):
        if isinstance(example, Example):
            yield f"example #{i} ({example.prompt[:40]!r})", example
        else:
            _bad(
                errors,
                f"example #{i}",
                f"is a {type(example).__name__}; a generator must yield "
                "art_hydra.tasks.Example objects",
            )


def _jsonl_examples(
    task_cfg: Any, errors: Scan | None, rules: DataRules
) -> Iterator[tuple[str, Example]]:
    """A JSONL file's examples, line by line (a line that cannot be used is a bad row)."""
    path = os.path.expanduser(str(task_cfg.path))
    rows = iter_records(path, max_line_bytes=rules.max_line_bytes, limit_reason=rules.limit_reason)
    for where, record in rows:
        found = (
            record if isinstance(record, str) else record_example(record, rules.answer_needed_by)
        )
        trl = None if isinstance(record, str) else trl_format(record)
        # TRL's formats are task=dataset's: the fix names it, and is checked by applying it.
        as_dataset = {"task": "dataset", "task.path": str(task_cfg.path)}
        if isinstance(found, str):
            if trl is not None:
                found += f"; the line is in TRL's {trl}, which task=dataset reads"
            _bad(errors, where, found, as_dataset if trl is not None else None)
        else:
            if trl is not None and errors is not None:
                errors.unused.setdefault(
                    "task",
                    (
                        "jsonl",
                        f"reads each line's 'prompt' and 'answer', and {where} is in TRL's "
                        f"{trl}: its completion is not the answer, only a column passed to the "
                        "rewards; task=dataset reads the format as TRL does",
                        as_dataset,
                    ),
                )
            yield where, found


def remote_data_allowed(task_cfg: Any) -> bool:
    """Whether ``task.allow_remote_data=true`` was set by the user's own hand (the command
    line, ``compose(overrides=...)``, or a Python caller's config): a config file or a
    folder cannot make a run contact a host."""
    value = task_cfg.get("allow_remote_data", False) if hasattr(task_cfg, "get") else False
    hand = current_hand()
    return value is True and (hand is None or hand.set("task.allow_remote_data"))


def _dataset_examples(
    task_cfg: Any, errors: Scan | None, rules: DataRules, fetch: bool = False
) -> Iterator[tuple[str, Example]]:
    """A dataset's examples (a file or folder :mod:`art_hydra.tasks.dataset` reads), from
    ``task.split``, its columns as ``task`` maps them; a source that cannot be opened or
    lacks the split is one error."""
    from art_hydra.tasks import dataset

    try:
        source = dataset.resolve_source(str(task_cfg.path), remote_data_allowed(task_cfg))
        if fetch:
            source = dataset.fetch_remote(source)
        splits = dataset.split_names(source)
    except dataset.SourceError as exc:
        _bad(errors, str(task_cfg.path), str(exc), fix_note=exc.fix)
        return
    if task_cfg.split not in splits:
        _bad(
            errors,
            str(task_cfg.path),
            f"has no split {task_cfg.split!r} (its splits: {', '.join(splits)})",
            {"task.split": splits[0]},
        )
        return
    columns = dataset.Columns.of(task_cfg)
    rows = dataset.iter_rows(source, task_cfg.split, rules.max_line_bytes, rules.limit_reason)
    for where, record in rows:
        if errors is not None and not isinstance(record, str):
            for key, unused in dataset.unused_mappings(record, columns).items():
                errors.unused.setdefault(key, unused)
        found = (
            record
            if isinstance(record, str)
            else dataset.row_example(record, columns, rules.answer_needed_by)
        )
        if isinstance(found, Example):
            yield where, found
        elif isinstance(found, str):
            _bad(errors, where, found)
        else:
            _bad(errors, where, found.message, found.fix)


def _bad(
    errors: Scan | None,
    where: str,
    message: str,
    fix: dict[str, str] | None = None,
    fix_note: str | None = None,
) -> None:
    """Record a row that cannot be used, or raise it when nobody collects them."""
    if errors is None:
        raise TaskDataError(f"the task data cannot be used:\n{where}: {message}")
    errors.add_error(where, message, fix)
    if fix_note is not None and errors.note is None:
        errors.note = fix_note


def build_task(cfg: Any) -> Task:
    """Build the task of run config ``cfg`` (reads ``cfg.task``, and the length budget and
    algorithm that decide which data rows are usable)."""
    task_cfg = cfg.task
    rewards = resolve_rewards(task_cfg)
    rules = data_rules(cfg, [(r.spec.target, r.fn) for r in rewards])
    scan = Scan()
    examples = [example for _, example in iter_examples(cfg, scan, rules, fetch=True)]
    if scan.error_count:
        raise TaskDataError(f"the task data cannot be used:\n{scan.summary()}")
    if not examples:
        raise TaskDataError(f"task {task_cfg.name!r} has no examples")
    return Task(task_cfg.name, examples, rewards)
