"""Every row's prompt and answer measured in the run's own tokens, before any model.

The run encodes a prompt with :func:`art_hydra.engine.producer.encode_prompt`: the chat
template over the example's messages (or one user message, ``task.system_prompt``
first when set) for a tokenizer with one, plain text with the tokenizer's special
tokens otherwise; an answer without special tokens; an SFT row as prompt + answer +
EOS. Here the same is counted with the tiny model's character tokenizer (BOS + one
token per character, a run of newlines one ``<unk>``) or a model folder's tokenizer
(:mod:`art_hydra.folder_tokenizer`), and the longest of each is held against
``rl.max_prompt_length``, ``rl.max_completion_length`` or ``sft.max_length``. The same
pass finds text the tokenizer would read as one of its special tokens (a literal
``<|im_end|>`` in a prompt ends the turn) and characters it cannot encode.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from art_hydra import folder_tokenizer
from art_hydra.config.problems import Problem, fix
from art_hydra.config.schema import AlgorithmName, ModelSource
from art_hydra.config.validators import budget_fix
from art_hydra.engine.backends import tiny
from art_hydra.preflight.common import world_problem
from art_hydra.tasks.base import with_system_prompt
from art_hydra.tasks.examples import Example

#: Rows named in a data problem's reason (the count says how many more).
SHOWN_ROWS = 3


class Counter(Protocol):
    """How one tokenizer counts what the run encodes."""

    #: In words, for messages ("the tiny model's character tokenizer").
    name: str

    def prompt(self, example: Example, system: str | None) -> tuple[int, bool]:
        """(the prompt's length in tokens, whether it holds an unknown token)."""

    def answer(self, text: str) -> tuple[int, bool]:
        """(the answer's length without special tokens, whether it holds an unknown)."""

    #: Literal text the tokenizer turns into a special token: a pattern, or None.
    specials: re.Pattern[str] | None


#: Newline runs: the tiny tokenizer splits on ``.`` (which does not match a newline), so
#: a run of them is one piece, and no such piece is in its vocabulary: one ``<unk>``.
_NEWLINES = re.compile(r"\n+")


def _specials_pattern(tokens: Iterable[str]) -> re.Pattern[str] | None:
    tokens = sorted({t for t in tokens if t and not t.isspace()}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in tokens)) if tokens else None


class TinyCounter:
    """The tiny model's character tokenizer (:func:`art_hydra.engine.backends.tiny.build_tokenizer`
    over the task's own characters): every character one token, except that the special
    tokens' text is one token and a run of newlines is one ``<unk>``."""

    name = "the tiny model's character tokenizer"
    specials = _specials_pattern(tiny.SPECIALS)

    def _count(self, text: str) -> tuple[int, bool]:
        size, unknown = 0, False
        for part in self.specials.split(text) if self.specials else [text]:
            runs = _NEWLINES.findall(part)
            size += len(part) - sum(len(r) for r in runs) + len(runs)
            unknown = unknown or bool(runs)
        size += len(self.specials.findall(text)) if self.specials else 0
        return size, unknown

    def prompt(self, example: Example, system: str | None) -> tuple[int, bool]:
        size, unknown = self._count(example.prompt)
        return size + 1, unknown  # BOS

    def answer(self, text: str) -> tuple[int, bool]:
        return self._count(text)


class FolderCounter:
    """A model folder's tokenizer and chat template."""

    def __init__(self, tokenizer: Any, folder: str) -> None:
        self.tokenizer = tokenizer
        self.name = f"the tokenizer of {folder}" + (
            " with its chat template" if tokenizer.chat_template else ""
        )
        self.unk = tokenizer.unknown_id()
        self.specials = _specials_pattern(_literal_tokens(tokenizer))

    def prompt(self, example: Example, system: str | None) -> tuple[int, bool]:
        example = with_system_prompt(example, system)
        if example.plain and not example.messages:  # TRL's standard text row: no template
            ids = self.tokenizer.encode(example.prompt, add_special_tokens=True)
        else:
            messages = list(example.messages) or [("user", example.prompt)]
            ids = self.tokenizer.prompt_ids(messages, example.prompt)
        return len(ids), self.unk is not None and self.unk in ids

    def answer(self, text: str) -> tuple[int, bool]:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return len(ids), self.unk is not None and self.unk in ids


def _literal_tokens(tokenizer: Any) -> list[str]:
    """The added tokens text could be mistaken for: the special ones, and markup-like
    added ones (``<think>``); plain added words and whitespace tokens are text anyway."""
    decoder = tokenizer.core.get_added_tokens_decoder()
    found = [str(t.content) for t in decoder.values() if t.special]
    found += [
        str(t.content)
        for t in decoder.values()
        if not t.special and re.fullmatch(r"<[^<>]+>|\[[^\[\]]+\]", str(t.content))
    ]
    return found + list(tokenizer.specials.values())


@dataclass
class Longest:
    """The largest size seen and the first row that has it."""

    size: int = 0
    where: str = ""

    def see(self, size: int, where: str) -> None:
        if size > self.size:
            self.size, self.where = size, where


@dataclass
class Rows:
    """Rows with one kind of data problem: the first few named, all counted."""

    count: int = 0
    shown: list[str] = field(default_factory=list)

    def see(self, where: str) -> None:
        self.count += 1
        if len(self.shown) < SHOWN_ROWS:
            self.shown.append(where)

    def words(self) -> str:
        more = self.count - len(self.shown)
        return "; ".join(self.shown) + (f" and {more} more row(s)" if more > 0 else "")


@dataclass
class Lengths:
    """One pass's measurements (fed row by row from the task's streamed check)."""

    counter: Counter
    system: str | None = None
    prompt: Longest = field(default_factory=Longest)
    answer: Longest = field(default_factory=Longest)
    example: Longest = field(default_factory=Longest)
    lookalike: Rows = field(default_factory=Rows)
    lookalike_tokens: set[str] = field(default_factory=set)
    unknown_prompt: Rows = field(default_factory=Rows)
    unknown_answer: Rows = field(default_factory=Rows)
    #: Rows the chat template refuses (raise_exception, a role it does not take), and
    #: the first refusal's message.
    template_failures: Rows = field(default_factory=Rows)
    template_message: str = ""
    #: Why the chat template overran its time or size budget, and on which row: the
    #: pass renders nothing after it (every row would wait as long).
    overrun: str = ""
    overrun_where: str = ""

    def add(self, where: str, example: Example) -> None:
        if self.overrun:
            return
        answer_text = example.answer or ""
        try:
            prompt, unknown_p = self.counter.prompt(example, self.system)
        except folder_tokenizer.TemplateOverrun as exc:
            self.overrun, self.overrun_where = str(exc), where
            return
        except Exception as exc:  # jinja2 errors of a hub template: named, the run would fail
            self.template_failures.see(where)
            self.template_message = self.template_message or f"{type(exc).__name__}: {exc}"
            return
        answer, unknown_a = self.counter.answer(answer_text)
        self.prompt.see(prompt, where)
        self.answer.see(answer, where)
        self.example.see(prompt + answer + 1, where)  # + EOS
        if unknown_p:
            self.unknown_prompt.see(where)
        if unknown_a:
            self.unknown_answer.see(where)
        pattern = self.counter.specials
        if pattern is not None:
            texts = [example.prompt, answer_text, *(c for _, c in example.messages)]
            hits = {m for text in texts for m in pattern.findall(text)}
            if hits:
                self.lookalike.see(where)
                self.lookalike_tokens |= hits


def measure(cfg: DictConfig, rows: Iterable[tuple[str, Example]]) -> Lengths | None:
    """Measure ``rows`` ((where, example) pairs) with the run's tokenizer; None when it
    cannot be known before loading (the model pre-flight says why)."""
    lengths = lengths_for(cfg)
    if lengths is not None:
        for where, example in rows:
            lengths.add(where, example)
    return lengths


def lengths_for(cfg: DictConfig) -> Lengths | None:
    """An empty :class:`Lengths` for ``cfg``'s tokenizer (None: not readable here)."""
    counter = counter_for(cfg)
    if counter is None:
        return None
    system = OmegaConf.select(cfg, "task.system_prompt", default=None)
    return Lengths(counter, system if isinstance(system, str) and system else None)


#: Folder tokenizers loaded in this process, by (folder, tokenizer.json's mtime and size).
_loaded: dict[tuple, Any] = {}


def counter_for(cfg: DictConfig) -> Counter | None:
    """The tokenizer the run will encode with, when the pre-flight can read it."""
    if cfg.model.source == ModelSource.tiny:
        return TinyCounter()
    from art_hydra.preflight.common import model_folder

    folder = model_folder(cfg.model)
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    tokenizer = load_tokenizer(folder)
    return None if tokenizer is None else FolderCounter(tokenizer, str(cfg.model.name))


def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer (cached per file version), or None if it cannot load."""
    from art_hydra import folder_tokenizer
    from art_hydra.model_files import FolderError

    try:
        info = os.stat(folder / "tokenizer.json")
        key: tuple = (str(folder), info.st_mtime_ns, info.st_size)
    except OSError:
        return None
    if key not in _loaded:
        try:
            _loaded[key] = folder_tokenizer.load(folder)
        except FolderError:
            _loaded[key] = None
    return _loaded[key]


def tokenizer_key(cfg: DictConfig) -> tuple:
    """What decides the counts besides the data (for the task check's cache)."""
    if cfg.model.source == ModelSource.tiny:
        return ("tiny",)
    system = OmegaConf.select(cfg, "task.system_prompt", default=None)
    return (str(cfg.model.name), cfg.model.revision, system)


def length_problems(
    cfg: DictConfig,
    lengths: Lengths | None,
    data_key: str,
    data_value: Any,
    use: str = "trained on",
) -> list[Problem]:
    """The longest prompt, answer or SFT row against its budget, and the data problems
    the pass found; ``data_key``/``data_value`` name the data (``task.path``), ``use``
    what the run does with it (evaluation's data is "evaluated on")."""
    if lengths is None:
        return []
    if lengths.overrun:  # the counts stop at that row: only the template is reported
        return [_overrun_problem(cfg, lengths)]
    return [
        *_budget_problems(cfg, lengths, use),
        *_data_problems(lengths, data_key, data_value),
    ]


def _overrun_problem(cfg: DictConfig, lengths: Lengths) -> Problem:
    """The model's chat template, not the data, is what cannot be rendered in bounds."""
    return world_problem(
        "model.name",
        cfg.model.name,
        f"{lengths.overrun} (the prompt of {lengths.overrun_where}). Each prompt is rendered "
        f"within {folder_tokenizer.RENDER_SECONDS:g} seconds and "
        f"{folder_tokenizer.RENDER_MAX_CHARS:,} characters; the run renders every prompt "
        "with the same template.",
        fix(
            note="repair the chat template of that model folder (a loop that does not end, or "
            "text it builds without bound), or model.name=<a model whose template renders>"
        ),
    )


def _budget_problems(cfg: DictConfig, lengths: Lengths, use: str) -> list[Problem]:
    what = lengths.counter.name
    if cfg.algorithm.name == AlgorithmName.rl:
        templated = "template included" if isinstance(lengths.counter, FolderCounter) else ""
        prompt_what = "prompt (" + (templated or "BOS included") + ")"
        checks = [
            ("rl.max_prompt_length", lengths.prompt, prompt_what),
            ("rl.max_completion_length", lengths.answer, "answer"),
        ]
    else:
        checks = [("sft.max_length", lengths.example, "example (prompt + answer + EOS)")]
    problems = []
    for key, longest, row in checks:
        budget = OmegaConf.select(cfg, key)
        if longest.size <= budget:
            continue
        consequence = (
            "the model could never produce the whole answer, so the reward caps below its best."
            if key == "rl.max_completion_length"
            else f"it cannot be {use} without cutting it."
        )
        problems.append(
            world_problem(
                key,
                budget,
                f"the longest {row} ({longest.where}) takes {longest.size} tokens of {what}, "
                f"more than {key}={budget}: {consequence}",
                _budget_remedy(cfg, key, longest.size),
            )
        )
    return problems


#: The most tokens a budget fix may offer: past it no model trains on one row, and a
#: budget that large is a sign the row, not the budget, is wrong.
MAX_OFFERED_TOKENS = 1 << 20


def _ceiling(cfg: DictConfig, key: str) -> tuple[int, str]:
    """The largest value a budget fix may set ``key`` (or model.max_seq_length) to, and
    what sets it: the schema's bound, the model's positions, :data:`MAX_OFFERED_TOKENS`."""
    from art_hydra.config.fields import info_of

    found = [(MAX_OFFERED_TOKENS, f"a fix offers at most {MAX_OFFERED_TOKENS} tokens")]
    for name in (key, "model.max_seq_length"):
        info = info_of(name)
        bound = info.bound if info is not None else None
        for limit, less in ((getattr(bound, "le", None), 0), (getattr(bound, "lt", None), 1)):
            if limit is not None:
                found.append((int(limit) - less, f"{name} is at most {int(limit) - less}"))
    limit = positions(cfg)
    if limit is not None:
        found.append((limit, f"the model has {limit} positions"))
    return min(found)


def _budget_remedy(cfg: DictConfig, key: str, size: int) -> Any:
    """The budget fix, when every value it sets is one the config accepts (the schema's
    bound, the model's positions, :data:`MAX_OFFERED_TOKENS`); else the note that no
    setting fits: the rows must be shorter."""
    sets = dict(budget_fix(cfg, key, size).sets)
    needed = max(int(v) for v in sets.values())
    ceiling, what = _ceiling(cfg, key)
    if needed > ceiling:
        return fix(
            note=f"{what} and these budgets would need {needed}: shorten or drop the longest rows"
        )
    return fix(sets)


def positions(cfg: DictConfig) -> int | None:
    """The model folder's position limit (None: the tiny model, which is built to the
    run's room, or a folder not here or not readable)."""
    if cfg.model.source == ModelSource.tiny:
        return None
    from art_hydra import model_files
    from art_hydra.preflight.common import model_folder

    return model_files.folder_positions(model_folder(cfg.model))


def _data_problems(lengths: Lengths, key: str, value: Any) -> list[Problem]:
    what = lengths.counter.name
    problems = []
    if lengths.template_failures.count:
        problems.append(
            world_problem(
                key,
                value,
                f"{lengths.template_failures.count} prompt(s) cannot be rendered by {what} "
                f"({lengths.template_message}): {lengths.template_failures.words()}; the run "
                "would fail on them the same way.",
                fix(
                    note="give the prompts the roles the template accepts (some refuse a system "
                    "message: unset task.system_prompt), or use a model whose template takes them"
                ),
            )
        )
    if lengths.lookalike.count:
        shown = ", ".join(repr(t) for t in sorted(lengths.lookalike_tokens)[:5])
        problems.append(
            world_problem(
                key,
                value,
                f"{lengths.lookalike.count} row(s) hold text that {what} reads as its special "
                f"tokens ({shown}), not as text: {lengths.lookalike.words()}. A literal end or "
                "padding token inside a prompt or answer cuts the turn or the answer short.",
                fix(note="remove or rewrite that text in the data (for example '< eos >')"),
            )
        )
    if lengths.unknown_answer.count:
        problems.append(
            world_problem(
                key,
                value,
                f"{lengths.unknown_answer.count} answer(s) hold characters {what} cannot "
                f"encode (they become its unknown token, which is never sampled): "
                f"{lengths.unknown_answer.words()}.",
                fix(note="remove or replace those characters in the answers"),
            )
        )
    if lengths.unknown_prompt.count:
        problems.append(
            world_problem(
                key,
                value,
                f"{lengths.unknown_prompt.count} prompt(s) hold characters {what} cannot "
                f"encode (the model sees its unknown token instead): "
                f"{lengths.unknown_prompt.words()}.",
                fix(note="remove or replace those characters in the prompts"),
                warning=True,
            )
        )
    return problems
