"""What a task is made of: examples, and the error raised for data that cannot be used."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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
    #: A whole conversation to imitate (a demonstration): TRL's conversational messages,
    #: assistant turns with ``tool_calls`` and ``role: tool`` results included, each held
    #: as its JSON text so the example stays immutable. SFT trains every assistant turn
    #: of it (:mod:`art_hydra.engine.conversation`), and ``rl.sft_warm_start_steps``
    #: trains on the examples that have one. A list of message dicts is accepted and
    #: checked here (:func:`conversation_problem`). None: no conversation.
    conversation: tuple[str, ...] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name, value in (("prompt", self.prompt), ("answer", self.answer)):
            reason = not_text(value, optional=name == "answer")
            if reason is not None:
                raise TaskDataError(f"an example's {name} {reason}")
        if self.conversation is not None:
            object.__setattr__(self, "conversation", frozen_conversation(self.conversation))

    def conversation_messages(self) -> list[dict[str, Any]]:
        """The conversation as fresh message dicts (empty without one)."""
        return [json.loads(text) for text in self.conversation or ()]

    @classmethod
    def from_conversation(cls, messages: Sequence[Mapping[str, Any]], **fields: Any) -> Example:
        """A demonstration: ``messages`` as the conversation, the turns before its first
        assistant turn as the prompt (what a rollout starts from) and the last assistant
        turn's content as the answer, unless ``fields`` give them."""
        found = conversation_problem(messages)
        if found is not None:
            raise TaskDataError(f"an example's conversation {found}")
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        pairs = tuple((str(m["role"]), str(m.get("content") or "")) for m in messages[:first])
        last = [m for m in messages if m["role"] == "assistant"][-1]
        fields.setdefault("messages", pairs)
        fields.setdefault("prompt", "\n".join(content for _, content in pairs))
        fields.setdefault("answer", str(last.get("content") or ""))
        return cls(conversation=tuple(messages), **fields)  # type: ignore[arg-type]


#: Roles a message may have (OpenAI's and TRL's chat roles).
ROLES = ("system", "developer", "user", "assistant", "tool")


def frozen_conversation(messages: Any) -> tuple[str, ...]:
    """``messages`` (dicts, or their JSON texts already) as a tuple of JSON texts, after
    :func:`conversation_problem` found nothing (else :class:`TaskDataError`)."""
    if isinstance(messages, (list, tuple)) and all(isinstance(m, str) for m in messages):
        messages = [json.loads(m) for m in messages]
    found = conversation_problem(messages)
    if found is not None:
        raise TaskDataError(f"an example's conversation {found}")
    try:
        return tuple(json.dumps(dict(m), ensure_ascii=False) for m in messages)
    except (TypeError, ValueError) as exc:
        raise TaskDataError(f"an example's conversation is not JSON: {exc}") from None


def conversation_problem(messages: Any, column: str = "conversation") -> str | None:
    """Why ``messages`` is not a conversation SFT can train on (None: it is): each a
    ``{role, content}`` object; an assistant turn's ``tool_calls`` a list of
    ``{type: function, function: {name, arguments}}`` (arguments an object, or its JSON
    text), its content then optional; a tool message with text content; at least one
    assistant turn."""
    if not isinstance(messages, (list, tuple)) or not messages:
        return f"'{column}' must be a non-empty list of messages"
    for i, message in enumerate(messages):
        found = message_problem(message, f"'{column}'[{i}]")
        if found is not None:
            return found
    if not any(m.get("role") == "assistant" for m in messages):
        return f"'{column}' has no assistant turn to train on"
    return None


def message_problem(message: Any, at: str) -> str | None:
    """Why one message cannot be rendered by a chat template (None: it can)."""
    if not isinstance(message, Mapping):
        return f"{at} must be a {{role, content}} object, not {type(message).__name__}"
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        return f"{at} has the role {role!r}; a message's role is one of {', '.join(ROLES)}"
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            return f"{at} is a {role!r} message with tool_calls; only assistant turns call tools"
        found = tool_calls_problem(calls, at)
        if found is not None:
            return found
    if isinstance(content, list):
        return (
            f"{at} has its content as a list of parts (TRL's multimodal format: images, "
            "audio); art_hydra trains text models, so a message's content must be a string"
        )
    if content is None and role == "tool":
        return f"{at} is a tool message without content; its content is the tool's result"
    reason = not_text(content, optional=bool(calls))
    return None if reason is None else f"{at}'s content {reason}"


def tool_calls_problem(calls: Any, at: str) -> str | None:
    """Why an assistant message's ``tool_calls`` are not OpenAI's (None: they are)."""
    shape = "{type: 'function', function: {name, arguments}}"
    if not isinstance(calls, (list, tuple)):
        return f"{at}'s tool_calls must be a list of {shape}, not {type(calls).__name__}"
    for j, call in enumerate(calls):
        where = f"{at}.tool_calls[{j}]"
        if not isinstance(call, Mapping) or call.get("type", "function") != "function":
            return f"{where} must be {shape}"
        function = call.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            return f"{where} must be {shape}: its function has no name"
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return f"{where}'s arguments are text that is not JSON: {arguments[:60]!r}"
        if not isinstance(arguments, Mapping):
            return f"{where}'s arguments must be an object (or its JSON text), not {arguments!r}"
    return None


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
