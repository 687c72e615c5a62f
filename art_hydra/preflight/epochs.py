"""``trainer.num_train_epochs`` made a step count: the world pre-flight counts the
training examples and records the run's steps as ``trainer.max_steps``.

Only the data tells how many steps an epoch holds, and the world pre-flight is the
first moment that reads it (no model yet). It counts what the producer will walk: the
task's examples as the run builds them (``task.system_prompt`` applied), less the
prompts ``eval.fraction`` holds out; the arithmetic is
:mod:`art_hydra.config.run_length`'s. :func:`settle_steps` then writes the number into
the config once, so everything downstream (the learning-rate schedule, evaluation and
checkpoint cadence, the progress bar, the run's saved config, a resume's comparison)
reads an int. A source whose size the pre-flight cannot know (a dataset card's remote
files, fetched only when the run starts) is refused with the setting that works.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf, read_write

from art_hydra.config.eval_rules import enabled as eval_enabled
from art_hydra.config.eval_rules import eval_interval_problems
from art_hydra.config.eval_rules import own_data as eval_own_data
from art_hydra.config.problems import ConfigValidationError, Problem, fix, placeholder
from art_hydra.config.run_length import (
    consumption,
    known_steps,
    sized_by_epochs,
    steps_for_epochs,
)
from art_hydra.config.schema import TaskSource
from art_hydra.config.validators import logged_steps_problems, warmup_problems
from art_hydra.preflight.common import world_problem
from art_hydra.tasks.base import data_rules, iter_examples, remote_data_allowed
from art_hydra.tasks.examples import TaskDataError
from art_hydra.tasks.held_out import prompt_key
from art_hydra.tasks.jsonl import Scan

#: Training-example counts already made in this process, by what decides them (a
#: sweep's points mostly share one): the count, or why it cannot be known up front.
_counts: dict[tuple, int | str | None] = {}


def _fingerprint(path: str) -> tuple:
    """A data file's or folder's size and modification times (a hub id: its name)."""
    path = os.path.expanduser(path)
    if os.path.isfile(path):
        info = os.stat(path)
        return path, info.st_size, info.st_mtime_ns
    if os.path.isdir(path):
        return path, tuple(
            (name, os.stat(os.path.join(root, name)).st_mtime_ns)
            for root, _, names in sorted(os.walk(path))
            for name in sorted(names)
        )
    return (path,)


def _holds_out(cfg: DictConfig) -> bool:
    """Whether evaluation takes its prompts from the task's own (``eval.fraction``)."""
    return bool(eval_enabled(cfg)) and not eval_own_data(cfg)


def _count_key(cfg: DictConfig) -> tuple:
    task = cfg.task
    source = None if task.source == TaskSource.generated else _fingerprint(str(task.path))
    held = (cfg.eval.fraction,) if _holds_out(cfg) else None
    rules = data_rules(cfg, ())
    return (OmegaConf.to_yaml(task), source, cfg.seed, held, rules, remote_data_allowed(task))


def training_examples(cfg: DictConfig) -> int | str | None:
    """How many examples (RL: prompts) the run trains on, as its producer walks them;
    a string: why that cannot be known before the run; None: the data cannot be read
    as it is (the task's own checks say why)."""
    key = _count_key(cfg)
    if key not in _counts:
        _counts[key] = _count(cfg)
    return _counts[key]


def _remote(cfg: DictConfig) -> str | None:
    """Why a dataset's size is unknown before the run: remote files its card names."""
    from art_hydra.tasks import dataset

    if cfg.task.source != TaskSource.dataset:
        return None
    try:
        source = dataset.resolve_source(str(cfg.task.path), remote_data_allowed(cfg.task))
    except dataset.SourceError:
        return None
    if not source.remote:
        return None
    return (
        f"task.path={cfg.task.path} names remote data files (its card's data_files), which "
        "only the run fetches: the pre-flight never contacts a host, so the number of "
        "examples an epoch holds is unknown before the run"
    )


def _count(cfg: DictConfig) -> int | str | None:
    """The training examples, counted as the data streams by: only the held-out split's
    needs are kept (each distinct prompt's key and how many examples it has), never the
    examples themselves."""
    remote = _remote(cfg)
    if remote is not None:
        return remote
    scan = Scan()
    held = _holds_out(cfg)
    total, per_prompt = 0, {}
    try:
        for _, example in iter_examples(cfg, scan, data_rules(cfg, ())):
            total += 1
            if held:
                key = prompt_key(example)
                per_prompt[key] = per_prompt.get(key, 0) + 1
    except Exception:  # a generator's own error, unreadable data: the task check's
        return None
    if scan.error_count or scan.note is not None or not total:
        return None
    if not held:
        return total
    return _left_to_train(cfg, total, per_prompt)


class _Prompt(NamedTuple):
    """A distinct prompt as the held-out split reads it (:func:`prompt_key`'s fields)."""

    prompt: Any
    messages: Any
    plain: Any


def _left_to_train(cfg: DictConfig, total: int, per_prompt: dict[Any, int]) -> int | None:
    """The examples left to train on once ``eval.fraction`` holds its prompts out, drawn
    by the run's own split (:func:`split_examples`, one stand-in per distinct prompt)."""
    from art_hydra.tasks.held_out import split_examples

    try:
        stand_ins: Any = [_Prompt(*key) for key in per_prompt]
        _, held = split_examples(stand_ins, cfg.eval.fraction, cfg.seed)
    except TaskDataError:  # a share that holds out none or all: evaluation's check
        return None
    return total - sum(per_prompt[prompt_key(p)] for p in held)


def run_steps(cfg: DictConfig) -> int | None:
    """The run's optimizer steps: ``trainer.max_steps``, its default, or the steps
    ``trainer.num_train_epochs`` passes over the counted data take (None: the data
    cannot be counted, which a problem of the pre-flight says)."""
    steps = known_steps(cfg)
    if steps is not None:
        return steps
    if not _countable(cfg):
        return None
    count = training_examples(cfg)
    return steps_for_epochs(cfg, count) if isinstance(count, int) else None


#: The sections whose values decide the count and what a step consumes.
_READS = ("trainer.", "rl.", "algorithm.", "distributed.", "task.", "eval.", "seed")


def _countable(cfg: DictConfig, failed: frozenset[str] = frozenset()) -> bool:
    """Whether sizing can read ``cfg``: none of the keys it reads has an error (reset to a
    default, maybe ``???``), and a step consumes data (a batch smaller than one prompt
    group takes none: the batch's own check reports it)."""
    if any(key.startswith(_READS) for key in failed):
        return False
    try:
        use = consumption(cfg)
    except Exception:  # a value no check could read: the config's own report names it
        return False
    return use.per_block > 0 and use.block > 0


def sizing_problems(cfg: DictConfig, failed: frozenset[str] = frozenset()) -> list[Problem]:
    """A run sized by ``trainer.num_train_epochs``: data of unknown size refused, and
    the rules on the run's length (warmup, logging, evaluation) checked on the count.
    Nothing is written into ``cfg`` (a sweep's pre-flight shares it between points).
    ``failed``: keys with an error already; sizing skips a config whose keys it reads
    are among them, or whose steps consume no data (the report says why)."""
    if not sized_by_epochs(cfg) or not _countable(cfg, failed):
        return []
    count = training_examples(cfg)
    if isinstance(count, str):
        epochs = cfg.trainer.num_train_epochs
        return [
            world_problem(
                "trainer.num_train_epochs",
                epochs,
                f"sizes the run from the number of training examples, and {count}.",
                fix(
                    {"trainer.max_steps": placeholder("optimizer steps")},
                    "a length in steps, which wins over trainer.num_train_epochs",
                    alt=fix(note="download the files into the folder: the pre-flight counts them"),
                ),
            )
        ]
    if count is None:
        return []
    steps = steps_for_epochs(cfg, count)
    if steps is None:
        return []
    found = [*warmup_problems(cfg, steps), *logged_steps_problems(cfg, steps)]
    if eval_enabled(cfg):
        found += eval_interval_problems(cfg, steps)
    return [world_problem(p.key, p.value, p.reason, p.fix, warning=True) for p in found]


def settle_steps(cfg: DictConfig, failed: frozenset[str] = frozenset()) -> None:
    """Write the run's steps into ``trainer.max_steps`` once (a run sized by epochs, or
    left null): from here on everything reads an int, and the run's saved config keeps
    the number it trained. Left null when the data cannot be counted, or a key sizing
    reads is among the ``failed`` ones (the config's report goes first)."""
    if cfg.trainer.max_steps is not None or not _countable(cfg, failed):
        return
    steps = run_steps(cfg)
    if steps is None:
        return
    with read_write(cfg), read_write(cfg.trainer):
        cfg.trainer.max_steps = steps


def epochs_sized(cfg: Any) -> bool:
    """Whether a settled ``cfg``'s ``trainer.max_steps`` (written by :func:`settle_steps`)
    is the count of its ``trainer.num_train_epochs``: no ``max_steps`` the user typed, and
    the data's count gives that number (a ``max_steps`` that won over the epochs differs
    from it, or was typed)."""
    from art_hydra.config.trust import current_hand

    t = cfg.trainer
    if t.num_train_epochs is None or t.max_steps is None:
        return False
    hand = current_hand()
    if hand is not None and hand.set("trainer.max_steps"):
        return False
    with read_write(cfg), read_write(cfg.trainer):
        saved, cfg.trainer.max_steps = t.max_steps, None
        try:
            counted = run_steps(cfg)
        finally:
            cfg.trainer.max_steps = saved
    return counted == saved


def require_steps(cfg: Any) -> None:
    """:func:`settle_steps` for a run about to start (a path that skipped the world
    pre-flight, such as a caller's ``run_validated``): a count that cannot be made
    stops it with the report."""
    settle_steps(cfg)
    if cfg.trainer.max_steps is None:
        found = sizing_problems(cfg) or [
            world_problem(
                "trainer.num_train_epochs",
                cfg.trainer.num_train_epochs,
                "sizes the run from the training examples, and they cannot be counted: the "
                "task's data cannot be read as it is (the world pre-flight says why).",
                fix({"trainer.max_steps": placeholder("optimizer steps")}),
            )
        ]
        raise ConfigValidationError(found)
