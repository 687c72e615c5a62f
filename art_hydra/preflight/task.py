"""The task's code and data, checked before any model: rewards and generators resolve and
accept their calls (:mod:`.rewards`, :mod:`.generator`), the data streams cleanly, and
prompts and answers fit their budgets (:mod:`.lengths`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra import folder_tokenizer, model_files
from art_hydra.config.problems import Kind, Problem, fix, placeholder
from art_hydra.config.schema import (
    AlgorithmName,
    ModelSource,
    TaskSource,
)
from art_hydra.model_files import FolderError
from art_hydra.preflight import lengths as row_lengths
from art_hydra.preflight import rewards as reward_checks
from art_hydra.preflight.common import model_folder, top_p_problems, world_problem
from art_hydra.preflight.generator import failure_problem, generator_problems
from art_hydra.safe_paths import file_refusal
from art_hydra.tasks import dataset
from art_hydra.tasks.base import (
    DataRules,
    answer_needed_by,
    data_rules,
    iter_examples,
    remote_data_allowed,
    resolve_task_code,
)
from art_hydra.tasks.examples import Example
from art_hydra.tasks.jsonl import Scan


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
    #: Where the first conversational prompt is (None: every prompt is text).
    conversation: str | None = None
    #: The first rows, on which the pre-flight calls each reward.
    rows: list[Example] = field(default_factory=list)
    #: The columns every row has (None before the first), and those some row has.
    columns_every: set[str] | None = None
    columns_some: set[str] = field(default_factory=set)
    first_where: str = ""
    #: Every row measured in the run's tokens (None: the tokenizer is not known here).
    lengths: row_lengths.Lengths | None = None
    #: Settings the data's format does not read: key -> (value, why, fix overrides).
    unused: dict[str, tuple[Any, str, dict[str, Any]]] = field(default_factory=dict)

    def add(self, where: str | int, example: Example) -> None:
        """Count ``example``; ``where`` is its ``file:line`` or its index."""
        self.count += 1
        if len(self.rows) < reward_checks.ROWS:
            self.rows.append(example)
        names = set(example.columns)
        if self.columns_every is None:
            self.columns_every, self.first_where = set(names), _where(where, example)
        self.columns_every &= names
        self.columns_some |= names
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
        if example.messages and self.conversation is None:
            self.conversation = _where(where, example)
        if self.lengths is not None:
            self.lengths.add(_where(where, example), example)


def _where(where: str | int, example: Example) -> str:
    return where if isinstance(where, str) else f"example #{where} ({example.prompt[:40]!r})"


#: Generated tasks and data files already gathered in this process (a sweep's points
#: mostly share them).
_stats_cache: dict[tuple, DataStats | Problem | tuple[str, Any]] = {}


def task_problems(cfg: DictConfig) -> list[Problem]:
    task = cfg.task
    resolved, problems = reward_checks.resolve_rewards(cfg)
    reward = reward_checks.answer_pairs(resolved)
    if task.source == TaskSource.generated:
        found = generator_problems(cfg)
        if found:
            return problems + found
        key, value = "task.generator", task.generator
    else:
        if task.source == TaskSource.jsonl:
            unreadable = _data_file_problems(str(task.path))
            if unreadable:
                return problems + unreadable
        if task.source == TaskSource.dataset:
            remote = _remote_problems(cfg)
            if remote:
                return problems + remote
        key, value = "task.path", task.path
    stats = _data_stats(cfg, reward)
    if isinstance(stats, Problem):
        return [*problems, stats]
    if isinstance(stats, tuple):
        return [*problems, world_problem(key, value, *stats)]
    needed = answer_needed_by(cfg, reward)
    if needed and stats.no_answer is not None:
        problems.append(
            world_problem(
                key,
                value,
                f"{stats.no_answer} has no answer, which {needed} needs.",
                fix(note="give every example an answer"),
            )
        )
    elif cfg.algorithm.name == AlgorithmName.rl:
        problems += _reward_call_problems(cfg, resolved, stats, key, problems)
    return (
        problems
        + _unused_column_problems(stats)
        + _template_problems(cfg, stats)
        + _length_problems(cfg, stats, key)
    )


def _unused_column_problems(stats: DataStats) -> list[Problem]:
    """Settings the data's format never reads (:func:`dataset.unused_mappings`, TRL data
    under ``task=jsonl``): the run goes on, but what was set does nothing, so it is said,
    with the overrides that read the data as meant."""
    return [
        world_problem(key, value, f"{why}.", fix(sets), warning=True)
        for key, (value, why, sets) in sorted(stats.unused.items())
    ]


def _remote_problems(cfg: DictConfig) -> list[Problem]:
    """A dataset card's remote data files: never fetched here. A config file that sets
    ``task.allow_remote_data`` is refused (only the command line lets a run contact a
    host); allowed, the pre-flight says what the run will fetch, and reads nothing."""
    task = cfg.task
    allowed = remote_data_allowed(task)
    if task.get("allow_remote_data") is True and not allowed:
        return [
            Problem(
                "task.allow_remote_data",
                True,
                "is set by a config file: it would let the run fetch files from a host a "
                "dataset card names, and only you may decide that.",
                fix(
                    {"task.allow_remote_data": True},
                    "on the command line, if you trust the hosts the card names",
                    alt=fix({"task.allow_remote_data": False}),
                ),
                Kind.override,
            )
        ]
    try:
        source = dataset.resolve_source(str(task.path), allowed)
    except dataset.SourceError:
        return []  # the data pass reports it, with its fix
    if not source.remote:
        return []
    names = sorted({p for patterns in source.remote.values() for p in patterns})
    shown = "\n".join(f"  {split}: {', '.join(ps)}" for split, ps in source.remote.items())
    return [
        world_problem(
            "task.path",
            task.path,
            f"names {len(names)} remote data file pattern(s) (its card's data_files), which "
            f"the run will fetch when it starts (task.allow_remote_data=true):\n{shown}\n"
            "The pre-flight never contacts a host, so their rows, lengths and answers are "
            "checked only as the run reads them.",
            fix(note="download them into the folder to have them checked before the run"),
            warning=True,
        )
    ]


def _reward_call_problems(
    cfg: DictConfig, resolved: Any, stats: DataStats, key: str, problems: list[Problem]
) -> list[Problem]:
    """The rewards against the rows: the columns they take, then a call on the first rows
    (see :mod:`art_hydra.preflight.rewards`)."""
    columns = reward_checks.Columns(
        frozenset(stats.columns_every or ()), frozenset(stats.columns_some), stats.first_where
    )
    value = cfg.task.path if key == "task.path" else cfg.task.generator
    found = reward_checks.column_problems(resolved, columns, key, value)
    if found:
        return found
    refused = {p.key for p in problems}
    return reward_checks.call_problems(cfg, resolved, stats.rows, refused)


def _data_stats(cfg: DictConfig, reward: Any) -> DataStats | Problem | tuple[str, Any]:
    """One streamed pass over the task's examples (:func:`iter_examples`, the run's own
    reader, without the system prompt, which is checked on its own), or (why the data
    cannot be used, its fix). Cached per source and rules: a sweep's points share it."""
    task = cfg.task
    rules = data_rules(cfg, reward)
    generated = task.source == TaskSource.generated
    dataset = task.source == TaskSource.dataset
    key = (
        str(task.source),
        (task.generator, repr(OmegaConf.to_container(task.params)), task.num_examples, cfg.seed)
        if generated
        else _fingerprint(str(task.path)),
        (repr(OmegaConf.to_container(task.columns)), task.split) if dataset else None,
        rules,
        row_lengths.tokenizer_key(cfg),
    )
    if key not in _stats_cache:
        _stats_cache[key] = _gather(cfg, rules)
    return _stats_cache[key]


def _gather(cfg: DictConfig, rules: DataRules) -> DataStats | Problem | tuple[str, Any]:
    stats = DataStats(lengths=row_lengths.lengths_for(cfg))
    scan = Scan()
    generated = cfg.task.source == TaskSource.generated
    try:
        for where, example in iter_examples(cfg, scan, rules, system=False):
            stats.add(where, example)
    except Exception as exc:  # the generator's own code, or an example it made
        if generated:
            generator = resolve_task_code(cfg.task, "task.generator")
            return failure_problem(cfg, generator, exc)
        return (
            f"cannot be read as task data: {type(exc).__name__}: {exc}",
            fix({"task.path": placeholder("a readable json, jsonl, csv or parquet file")}),
        )
    stats.unused = dict(scan.unused)
    if scan.note is not None:  # the source itself: nothing to list by row
        return scan.errors[0].removeprefix(f"{cfg.task.path}: "), _note_fix(scan.note)
    if scan.error_count:
        n = scan.error_count
        what = {TaskSource.generated: "example", TaskSource.jsonl: "line"}.get(
            cfg.task.source, "row"
        )
        reason = f"{n} {what}{'s' if n != 1 else ''} cannot be used:\n{scan.summary()}"
        if scan.fix and scan.fix.get("task") == "dataset":  # TRL's data under task=jsonl
            return world_problem(
                "task",
                "jsonl",
                f'reads {cfg.task.path} as {{"prompt", "answer"}} lines, so {reason}',
                fix(scan.fix),
            )
        if scan.fix and "<column>" not in scan.fix.values():
            return reason, fix(scan.fix)
        if scan.fix:
            return reason, fix(note=" ".join(f"{k}={v}" for k, v in scan.fix.items()))
        remedy = "fix the generator" if generated else "repair or remove the rows listed"
        return reason, fix(note=scan.note or f"{remedy} (each is named with where it is)")
    if not stats.count:
        if generated:
            return "produced no examples.", fix(note="fix the generator")
        empty = f"{cfg.task.path}: no examples (the data is empty)"
        if cfg.task.source == TaskSource.jsonl:
            empty = f"1 line cannot be used:\n{cfg.task.path}: no examples (the file is empty)"
        return empty, fix({"task.path": placeholder("data with examples")})
    return stats


def _note_fix(note: str) -> Any:
    """A source's remedy: ``task.path=<...>`` becomes a marked placeholder (the user's own
    path goes there); anything else stays an instruction."""
    match = re.fullmatch(r"task\.path=<([^>]+)>", note)
    return fix({"task.path": placeholder(match.group(1))}) if match else fix(note=note)


def _fingerprint(path: str) -> tuple:
    """What a data file or folder's contents are judged by for the cache: the size and
    modification time of each file (a hub id is its own name)."""
    local = os.path.expanduser(path)
    if not os.path.lexists(local):
        try:  # a hub id: its cached snapshot, when there is one
            local = dataset.resolve_source(path).base or local
        except dataset.SourceError:
            return (path,)
    try:
        if not os.path.isdir(local):
            info = os.stat(local)
            return (local, info.st_size, info.st_mtime_ns)
        found = []
        for root, _, files in os.walk(local):
            for name in files:
                info = os.stat(os.path.join(root, name))
                found.append((root, name, info.st_size, info.st_mtime_ns))
        return (local, tuple(sorted(found)))
    except OSError:
        return (local,)


def _template_problems(cfg: DictConfig, stats: DataStats) -> list[Problem]:
    """A conversation (TRL's conversational rows, or a text prompt under
    task.system_prompt) is rendered by the model's chat template: refused where the
    tokenizer surely has none (the tiny model, a folder whose tokenizer files carry none).
    Plain text is not made up instead: the model would train on a format it never sees
    from TRL or at inference."""
    if chat_template_known(cfg.model) is not False:
        return []
    model = (
        "the tiny model's character tokenizer"
        if cfg.model.source == ModelSource.tiny
        else f"the tokenizer of model.name={cfg.model.name}"
    )
    chat_model = "model=pretrained model.name=<folder of a model with a chat template>"
    problems = []
    if stats.conversation is not None:
        problems.append(
            world_problem(
                "task.path",
                cfg.task.path,
                f"{stats.conversation} is a conversation (TRL's conversational format: a list "
                f"of messages), which is rendered by a chat template, and {model} has none.",
                fix(note=f"{chat_model}, or data with text prompts"),
            )
        )
    if cfg.task.get("system_prompt"):
        problems.append(
            world_problem(
                "task.system_prompt",
                cfg.task.system_prompt,
                f"a system prompt is rendered by a chat template, and {model} has none.",
                fix({"task.system_prompt": None}, alt=fix(note=chat_model)),
            )
        )
    return problems


def chat_template_known(model_cfg: Any) -> bool | None:
    """Whether the model's tokenizer has a chat template, read from its files without
    loading it (:func:`art_hydra.folder_tokenizer.chat_template`, the reader the length
    check uses): False for the tiny model, None where the files are not at hand (a hub id
    not cached, a folder without tokenizer files: the model check reports that)."""
    if model_cfg.get("chat_template"):
        return True  # model.chat_template replaces the tokenizer's (read by its own check)
    if model_cfg.source == ModelSource.tiny:
        return False
    folder = model_folder(model_cfg)
    names = ("tokenizer_config.json", *folder_tokenizer.TEMPLATE_FILES)
    if folder is None or not any((folder / n).is_file() for n in names):
        return None
    try:
        config_file = folder / "tokenizer_config.json"
        config = model_files.read_json_file(config_file) if config_file.is_file() else {}
        found = folder_tokenizer.chat_template(folder, config if isinstance(config, dict) else {})
        return found is not None
    except FolderError:
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
            fix({"task.path": placeholder("a regular JSONL file")}),
        )
    ]


def _length_problems(cfg: DictConfig, stats: DataStats, key: str) -> list[Problem]:
    """Prompts and answers against their budgets, and the data problems only the
    tokenizer sees (:mod:`art_hydra.preflight.lengths`); on the tiny model also top-p
    over its vocabulary: the task's characters and EOS (pad, BOS and unknown are never
    sampled)."""
    value = cfg.task.path if key == "task.path" else cfg.task.generator
    problems = row_lengths.length_problems(cfg, stats.lengths, key, value)
    if cfg.algorithm.name == AlgorithmName.rl and cfg.model.source == ModelSource.tiny:
        problems += top_p_problems(
            cfg,
            len(stats.chars) + 1,
            "the task's characters and EOS; pad, BOS and unknown are never sampled",
        )
    return problems
