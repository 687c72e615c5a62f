"""The task's code and data, checked before any model: rewards and generators resolve and
accept their calls, the data streams cleanly, and prompts and answers fit their budgets."""

from __future__ import annotations

import inspect
import os
import random
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.backends import tiny
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.schema import (
    AlgorithmName,
    ModelSource,
    TaskSource,
)
from art_hydra.config.targets import ROLE_OF_KEY, NotMarkedError, TargetError
from art_hydra.config.validators import budget_fix
from art_hydra.preflight.common import top_p_problems, world_problem
from art_hydra.safe_paths import file_refusal
from art_hydra.tasks.base import data_rules, generate_examples, resolve_task_code
from art_hydra.tasks.examples import Example, TaskDataError
from art_hydra.tasks.jsonl import scan_jsonl
from art_hydra.tasks.rewards import needs_answer


def _code(cfg: DictConfig, key: str) -> tuple[Any, list[Problem]]:
    """The reward or generator ``key`` names, or why it may not or cannot run: a config
    file may name only a marked function (see :mod:`art_hydra.config.targets`)."""
    path = cfg.task.reward._target_ if key == "task.reward._target_" else cfg.task.generator
    try:
        return resolve_task_code(cfg.task, key), []
    except TaskDataError as exc:
        cause = exc.__cause__
        reason = str(cause) if isinstance(cause, TargetError) else str(exc)
        role = ROLE_OF_KEY[key]
        remedy = (
            fix(
                {key: path},
                f"on the command line, if you trust it; or mark it @{role} "
                f"(from art_hydra import {role})",
            )
            if isinstance(cause, NotMarkedError)
            else fix({key: placeholder("module.function")})
        )
        return None, [world_problem(key, path, reason, remedy)]


def _signature_problems(fn: Any, key: str, kwargs: dict[str, Any], what: str) -> list[Problem]:
    """Whether ``fn`` can be called by parameter name with ``kwargs`` (``what`` spells
    the call for the message)."""
    try:
        signature = inspect.signature(fn)
    except ValueError:
        return []  # no signature to inspect: the call itself will tell
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        own = ", ".join(signature.parameters)
        return [
            world_problem(
                key,
                f"{fn.__module__}.{fn.__qualname__}",
                f"does not accept the call {what}: arguments are passed by parameter name, "
                f"and its parameters are ({own}) ({exc}).",
                _params_fix(signature, key, kwargs, what),
            )
        ]
    return []


def _params_fix(signature: inspect.Signature, key: str, kwargs: dict[str, Any], what: str) -> Any:
    """Drop the ``task.params`` arguments the generator does not take (the user's own
    overrides of them); for a reward, or a generator missing what art_hydra passes, its
    parameters must change."""
    takes_any = any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())
    extra = [k for k in kwargs if k not in signature.parameters]
    passed = {"rng", "num_examples"}
    if key == "task.generator" and extra and not takes_any and not passed & set(extra):
        return fix(
            note=f"drop the task.params argument(s) it does not take: {', '.join(extra)}",
            drops=tuple(f"task.params.{k}" for k in extra),
            alt=fix(note=f"name its parameters as in {what}"),
        )
    return fix(note=f"name its parameters as in {what}")


@dataclass
class DataStats:
    """What the length and vocabulary checks need from a task's examples, gathered in one
    pass (a streamed file is never held whole)."""

    count: int = 0
    #: (size in characters, where) of the longest prompt, answer and prompt + answer.
    prompt: tuple[int, str] = (0, "")
    answer: tuple[int, str] = (0, "")
    example: tuple[int, str] = (0, "")
    chars: set[str] = field(default_factory=set)
    #: Where the first example without an answer is (None: every one has one).
    no_answer: str | None = None

    def add(self, where: str | int, example: Example) -> None:
        """Count ``example``; ``where`` is its ``file:line`` or its index."""
        self.count += 1
        answer = example.answer or ""
        prompt = len(example.prompt)
        if prompt > self.prompt[0]:
            self.prompt = (prompt, _where(where, example))
        if len(answer) > self.answer[0]:
            self.answer = (len(answer), _where(where, example))
        if prompt + len(answer) > self.example[0]:
            self.example = (prompt + len(answer), _where(where, example))
        self.chars.update(example.prompt, answer)
        if not answer and self.no_answer is None:
            self.no_answer = _where(where, example)


def _where(where: str | int, example: Example) -> str:
    return where if isinstance(where, str) else f"example #{where} ({example.prompt[:40]!r})"


#: Generated tasks and data files already gathered in this process (a sweep's points
#: mostly share them).
_stats_cache: dict[tuple, DataStats | str] = {}


def task_problems(cfg: DictConfig) -> list[Problem]:
    task = cfg.task
    reward, problems = _code(cfg, "task.reward._target_")
    if reward is not None:
        problems += _signature_problems(
            reward,
            "task.reward._target_",
            {"prompt": "p", "completion": "c", "answer": "a"},
            "reward(prompt=..., completion=..., answer=...)",
        )
    if task.source == TaskSource.jsonl:
        unreadable = _data_file_problems(str(task.path))
        if unreadable:
            return problems + unreadable
        stats = _jsonl_stats(cfg, reward)
        key = "task.path"
    else:
        generator, found = _code(cfg, "task.generator")
        problems += found
        if generator is None:
            return problems
        params = dict(task.params)
        taken = sorted({"rng", "num_examples"} & set(params))
        if taken:
            return [
                *problems,
                world_problem(
                    f"task.params.{taken[0]}",
                    params[taken[0]],
                    "is an argument art_hydra gives every generator itself (rng is seeded "
                    "from seed, num_examples is task.num_examples).",
                    fix(
                        note=f"drop task.params.{taken[0]} (~task.params.{taken[0]})",
                        drops=(f"task.params.{taken[0]}",),
                    ),
                ),
            ]
        names = "".join(f", {k}=..." for k in params)
        found = _signature_problems(
            generator,
            "task.generator",
            {"rng": random.Random(0), "num_examples": 1, **params},
            f"generator(rng=..., num_examples=...{names}) (task.params)",
        )
        if found:
            return problems + found
        stats = _generated_stats(cfg, generator)
        key = "task.generator"
    if isinstance(stats, str):
        value = task.path if key == "task.path" else task.generator
        remedy = data_remedy(stats) if key == "task.path" else fix(note="fix the generator")
        return [*problems, world_problem(key, value, stats, remedy)]
    needed = _answer_needed_by(cfg, reward)
    if needed and stats.no_answer is not None:
        problems.append(
            world_problem(
                key,
                task.generator,
                f"{stats.no_answer} has no answer, which {needed} needs.",
                fix(note="give every example an answer"),
            )
        )
    return problems + _length_problems(cfg, stats)


#: What the scan says when the file as a whole cannot be used (no line is to blame).
_WHOLE_FILE = {
    "cannot be read as task data": "make the file readable by this user, or name another",
    "reading the task data failed": "check the disk and read the file again, or name another",
    "no examples (the file is empty)": "write one JSON object per line into it, or name another",
}


def data_remedy(summary: str) -> Any:
    """The fix for a data file the scan refused, by cause: the file as a whole (unreadable,
    failing, empty) or its lines (then the lines listed are what to repair)."""
    for phrase, remedy in _WHOLE_FILE.items():
        if phrase in summary:
            return fix({"task.path": placeholder("a readable JSONL file")}, remedy)
    return fix(note="repair or remove the lines listed (each names file:line)")


def _generated_stats(cfg: DictConfig, generator: Any) -> DataStats | str:
    task = cfg.task
    params = OmegaConf.to_container(task.params)
    key = (task.generator, repr(params), task.num_examples, cfg.seed)
    if key not in _stats_cache:
        try:
            examples = generate_examples(task, generator, cfg.seed)
        except Exception as exc:
            _stats_cache[key] = f"raised {type(exc).__name__}: {exc}"
            return _stats_cache[key]
        stats = DataStats()
        for i, example in enumerate(examples):
            if not isinstance(example, Example):
                stats_or_error: DataStats | str = (
                    f"produced a {type(example).__name__} as example #{i}; it must yield "
                    "art_hydra.tasks.Example objects."
                )
                break
            stats.add(i, example)
        else:
            stats_or_error = stats if stats.count else "produced no examples."
        _stats_cache[key] = stats_or_error
    return _stats_cache[key]


def _answer_needed_by(cfg: DictConfig, reward: Any) -> str | None:
    if cfg.algorithm.name == AlgorithmName.sft:
        return "SFT"
    if reward is not None and needs_answer(reward):
        return f"the reward {cfg.task.reward._target_}"
    return None


def _data_file_problems(path: str) -> list[Problem]:
    """``task.path`` must name a regular file: a FIFO or ``/dev/zero`` would never end,
    and a path no file can have (a NUL byte, an over-long name) would raise ``OSError``.
    Decided by ``os.stat`` alone (opening a FIFO blocks until a writer comes)."""
    reason = file_refusal(os.path.expanduser(path))
    if reason is None:
        return []
    return [
        world_problem(
            "task.path",
            path,
            f"{reason}; task data is read from a regular JSONL file.",
            fix({"task.path": placeholder("your JSONL file")}),
        )
    ]


def _jsonl_stats(cfg: DictConfig, reward: Any) -> DataStats | str:
    path = os.path.expanduser(str(cfg.task.path))
    rules = data_rules(cfg, reward)
    try:
        info = os.stat(path)
        key: tuple = (path, info.st_size, info.st_mtime_ns, rules)
    except OSError:
        key = (path, None, None, rules)
    if key not in _stats_cache:
        stats = DataStats()
        scan = scan_jsonl(
            path,
            max_line_bytes=rules.max_line_bytes,
            limit_reason=rules.limit_reason,
            answer_needed_by=rules.answer_needed_by,
            visit=lambda number, example: stats.add(f"{path}:{number}", example),
        )
        n = scan.error_count
        _stats_cache[key] = (
            f"{n} line{'s' if n != 1 else ''} cannot be used:\n{scan.summary()}" if n else stats
        )
    return _stats_cache[key]


def _length_problems(cfg: DictConfig, stats: DataStats) -> list[Problem]:
    """Prompts and answers against their budgets, where the tokenizer is known without a
    model: the tiny model's character tokenizer (BOS + one token per character)."""
    if cfg.model.source != ModelSource.tiny:
        return []
    if cfg.algorithm.name == AlgorithmName.rl:
        checks = [
            ("rl.max_prompt_length", stats.prompt[0] + 1, stats.prompt[1], "prompt (BOS included)"),
            ("rl.max_completion_length", stats.answer[0], stats.answer[1], "answer"),
        ]
    else:
        size, where = stats.example
        checks = [("sft.max_length", size + 2, where, "example (BOS + prompt + answer + EOS)")]
    problems = []
    for key, size, where, what in checks:
        budget = OmegaConf.select(cfg, key)
        if size > budget:
            consequence = (
                "the model could never produce the whole answer, so the reward caps below its best."
                if key == "rl.max_completion_length"
                else "it cannot be trained on without cutting it."
            )
            problems.append(
                world_problem(
                    key,
                    budget,
                    f"the longest {what} ({where}) takes {size} tokens of the tiny model's "
                    f"character tokenizer, more than {key}={budget}: {consequence}",
                    budget_fix(cfg, key, size),
                )
            )
    if cfg.algorithm.name == AlgorithmName.rl:
        problems += top_p_problems(cfg, len(tiny.SPECIALS) + len(stats.chars))
    return problems
