"""What a task is made of: examples, and the error raised for data that cannot be used."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.errors import CompactHydraException


@dataclass(frozen=True)
class Example:
    """One training example: a prompt and, optionally, its reference answer.

    Both are checked to be text at construction, so a generator's mistake (a number, a
    lone surrogate such as ``"\\ud800"``, which no tokenizer can encode) is named where
    the example is made, not as a crash in the tokenizer."""

    prompt: str
    answer: str | None = None
    #: A conversational prompt (TRL's list of messages) as ``(role, content)`` pairs, the
    #: chat template applied to them as they are; empty for a plain-text prompt, which
    #: the template wraps as one user message. ``prompt`` then holds the messages' text,
    #: for logs and the tiny model's character set.
    messages: tuple[tuple[str, str], ...] = ()
    #: A text prompt encoded as it is, without the chat template: TRL's standard format
    #: (TRL templates conversational rows only). Generated and JSONL text prompts are
    #: wrapped as one user turn when the tokenizer has a template.
    plain: bool = False
    #: The row's other columns by their names in the data (TRL passes them to rewards
    #: as keyword arguments); not part of the example's identity.
    columns: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name, value in (("prompt", self.prompt), ("answer", self.answer)):
            reason = not_text(value, optional=name == "answer")
            if reason is not None:
                raise TaskDataError(f"an example's {name} {reason}")


def not_text(value: object, optional: bool) -> str | None:
    """Why ``value`` is not text a tokenizer can encode (None: it is)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if value.isascii():  # a flag CPython keeps on every str: no scan
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"holds \\u{ord(value[exc.start]):04x} (character {exc.start + 1}), a lone UTF-16 "
            "surrogate, which is not text"
        )
    return None


class TaskDataError(CompactHydraException, ValueError):
    """Task data or task code that cannot be used; the message names the file and line.

    A user's mistake, not a bug: Hydra prints the message alone, without a traceback.
    """
