"""SFT rows from whole conversations: every assistant turn trains, tool turns do not.

A demonstration (:attr:`art_hydra.tasks.Example.conversation`) is laid out exactly as a
multi-turn rollout of the same turns would be: the prompt's ids (the template with the
generation prompt), each assistant turn's ids up to and including the id the model
stops on, then the template's text up to the next generation prompt (tool results
inside) as the rollout's tool suffix. The cut comes from
:func:`art_hydra.engine.envs.template.conversation_pieces`, and each piece is encoded
alone, never the whole text at once, so the ids are those a rollout concatenates
(prompt ids + sampled ids + :class:`~art_hydra.engine.envs.template.ToolSuffix` ids):
what SFT teaches is what RL later samples and scores, token for token.

Only the assistant turns train (``completion_mask``): system, user and tool turns and
the template's own text between turns are context, as TRL's ``assistant_only_loss``
and its tool-calling SFT do. ``sft.completion_only_loss=false`` trains every token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any

from art_hydra.engine.packing import Sequence
from art_hydra.tasks.examples import Example, TaskDataError

#: What a template problem's fix says: a template that keeps earlier turns as they are.
TEMPLATE_FIX = (
    "set model.chat_template=<a training template> (a .jinja file, or a template shipped "
    "in art_hydra/templates) that renders each turn the same once later turns follow"
)


def template_messages(messages: Seq[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as transformers' chat templates take them: a tool call's arguments
    as an object (OpenAI's data often holds them as JSON text, which a template such as
    Qwen's would write out quoted, as a string)."""
    out = []
    for message in messages:
        message = dict(message)
        calls = message.get("tool_calls")
        if calls:
            message["tool_calls"] = [_call(call) for call in calls]
        out.append(message)
    return out


def _call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        function["arguments"] = json.loads(function["arguments"])
    return {**call, "type": "function", "function": function}


def row_tools(
    example: Example, default: list[dict[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """The tools' JSON schemas a demonstration is rendered with: the row's own ``tools``
    column (TRL's; a list or its JSON text) where it has one, else ``default`` (the
    task's: ``task.tools`` or the environment's methods)."""
    tools = example.columns.get("tools") if example.columns else None
    if isinstance(tools, str):
        tools = json.loads(tools)
    return list(tools) if tools else default


def example_sequence(
    tokenizer: Any,
    example: Example,
    tools: list[dict[str, Any]] | None,
    train_prompt: bool,
    stop_text: str | None = None,
) -> Sequence:
    """:func:`conversation_sequence` of ``example``'s conversation, with its row's tools
    (else ``tools``); the example is named in any error."""
    return conversation_sequence(
        tokenizer,
        example.conversation_messages(),
        row_tools(example, tools),
        train_prompt,
        stop_text=stop_text,
        where=f"the conversation of example {example.prompt[:40]!r}",
    )


def conversation_sequence(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    train_prompt: bool,
    *,
    stop_text: str | None = None,
    where: str = "a conversation",
) -> Sequence:
    """One SFT row of a whole conversation: every assistant turn (content, tool calls
    and the id the model stops on, ``stop_text``: by default the tokenizer's EOS) trains,
    everything else is context; ``prompt_len`` ends where the first assistant turn
    begins. With ``train_prompt`` every token trains. A template that cannot be cut where
    a rollout samples is a :class:`TaskDataError` naming ``where`` and the fix."""
    pieces = _pieces(tokenizer, messages, tools, stop_text, where)
    ids: list[int] = []
    marks: list[int] = []
    for piece, trained in pieces:
        encoded = piece if isinstance(piece, list) else _encode(tokenizer, piece)
        ids += encoded
        marks += [int(trained)] * len(encoded)
    prompt_len = marks.index(1) if 1 in marks else len(marks)
    return Sequence(
        tokens=ids,
        prompt_len=prompt_len,
        train_prompt=train_prompt,
        completion_mask=None if train_prompt else marks[prompt_len:],
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    from art_hydra.engine.envs.template import HFRenderer

    return HFRenderer(tokenizer).encode(text)


def _pieces(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    stop_text: str | None,
    where: str,
) -> list[tuple[str | list[int], bool]]:
    """The conversation cut as a rollout lays it out (see the module's docstring), up to
    its last trained piece (a rollout ends at the id it stops on)."""
    from art_hydra.engine.envs.template import (
        HFRenderer,
        TemplateError,
        conversation_pieces,
        turn_end,
    )

    if not getattr(tokenizer, "chat_template", None):
        raise TaskDataError(
            f"{where} needs a chat template to render its turns, and the tokenizer has "
            f"none; {TEMPLATE_FIX}"
        )
    renderer = HFRenderer(tokenizer)
    stop = stop_text if stop_text is not None else tokenizer.eos_token or ""
    try:
        pieces: list[tuple[str | list[int], bool]] = list(
            conversation_pieces(renderer, template_messages(messages), tools, stop)
        )
        end = turn_end(renderer, tools)
    except TemplateError as exc:
        raise TaskDataError(
            f"{where} cannot be trained token-exactly: {exc}; {TEMPLATE_FIX}"
        ) from None
    except Exception as exc:  # jinja's own errors, a template's raise_exception
        raise TaskDataError(
            f"{where}: the chat template failed to render it ({type(exc).__name__}: {exc}); "
            f"fix the conversation, or {TEMPLATE_FIX}"
        ) from None
    if stop and not end.startswith(stop):
        pieces = _with_stop_id(pieces, end, tokenizer.eos_token_id)
    while pieces and not pieces[-1][1]:
        pieces.pop()
    return pieces


def _with_stop_id(
    pieces: list[tuple[str | list[int], bool]], end: str, stop_id: int
) -> list[tuple[str | list[int], bool]]:
    """A template whose turn end is not the stop id's text (a character tokenizer's
    ``\\n``, a Llama's ``<|eot_id|>`` under a plain EOS): a rollout samples the turn's
    content, then the stop id, and the tool suffix writes the template's end after it
    (:class:`~art_hydra.engine.envs.template.ToolSuffix`); laid out the same here."""
    out: list[tuple[str | list[int], bool]] = []
    carry = ""
    for text, trained in pieces:
        if trained and isinstance(text, str) and text.endswith(end):
            out += [(text[: len(text) - len(end)], True), ([stop_id], True)]
            carry = end
        else:
            out.append((carry + text if isinstance(text, str) else text, trained))
            carry = ""
    if carry:
        out.append((carry, False))
    return [(text, trained) for text, trained in out if text != ""]
