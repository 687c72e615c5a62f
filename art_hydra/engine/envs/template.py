"""What a chat template must do for tool turns, decided by rendering probe conversations.

A multi-turn rollout never re-tokenizes what the model sampled: the next turn's input is
the previous ids, the sampled ids, and the *tool suffix*, the template's own text between
the end of an assistant turn and the next generation prompt (the tool results inside),
tokenized alone. That text is found by rendering a probe conversation with and without
the tool messages and taking the difference, which is only possible when the template
renders the shorter conversation as a prefix of the longer one.

The same renders decide, before any model loads (the pre-flight renders with the
folder's tokenizer, the run with transformers'; both through :class:`ChatRenderer`):
whether the template shows tool calls and tool results at all, whether the tool suffix
can be found, and whether earlier turns stay unchanged as later ones are appended
(templates that drop earlier turns' reasoning do not; training then sees a context that
serving will not). SFT on conversations cuts its rows at the same places, so a turn is
laid out alike whether it was sampled (RL) or demonstrated (SFT).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: Probe texts: odd enough never to occur in a template's own text.
MARK = "Zq7xMARK"
USER = "Zq7xUSER"
CALL_NAME = "zq7x_tool"
CALL_ARG = "Zq7xARG"
RESULT = "Zq7xRESULT"
THOUGHT = "Zq7xTHOUGHT"

#: Finding kinds (the caller decides how severe each is for its algorithm).
NO_TOOLS = "no_tools"  # rendering with tools raised
NO_CALLS = "no_calls"  # tool calls are not in the rendered text
NO_RESULTS = "no_results"  # tool results are not in the rendered text
NO_SUFFIX = "no_suffix"  # the tool suffix cannot be found (not a prefix)
EARLIER_CHANGED = "earlier_changed"  # an earlier turn renders differently later on


class ChatRenderer(Protocol):
    """A tokenizer's chat template and encoder, as transformers' or the folder's."""

    def render(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool
    ) -> str:
        """The template applied to ``messages`` (``gen``: with the generation prompt)."""

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, no special tokens added (a template's own are matched)."""


class TemplateError(ValueError):
    """A chat template that cannot hold a multi-turn tool conversation (see ``kind``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str


def probe_call(name: str = CALL_NAME) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": {"arg": CALL_ARG}}}


def _assistant(content: str, calls: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [probe_call()]
    return message


def tool_message(content: str, name: str = CALL_NAME) -> dict[str, Any]:
    return {"role": "tool", "name": name, "content": content}


def turn_end(renderer: ChatRenderer, tools: list[dict[str, Any]] | None) -> str:
    """The text the template writes after an assistant turn's content (its end-of-turn
    token and what follows it, say ``<|im_end|>\\n``)."""
    text = renderer.render([{"role": "user", "content": USER}, _assistant(MARK)], tools, False)
    if MARK not in text:
        raise TemplateError(NO_CALLS, "the chat template does not render an assistant turn")
    return text[text.rindex(MARK) + len(MARK) :]


def suffix_text(
    renderer: ChatRenderer,
    results: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> tuple[str, str]:
    """``(end, after)``: the template's end of an assistant turn, and the text it writes
    after it for the tool messages ``results`` up to and including the next generation
    prompt. Raises :class:`TemplateError` when the longer conversation does not begin
    with the shorter (the suffix cannot be found)."""
    # The probe turn carries reasoning, as a thinking model's sampled turn does: Qwen3's
    # template writes an empty <think></think> into a last turn without any, which the
    # same turn loses once results follow it. A template may leave the content out of a
    # turn with tool calls (Llama 3.1 writes the call alone); only what follows matters.
    turn = _assistant(f"<think>\n{THOUGHT}\n</think>\n\n{MARK}", calls=True)
    head = [{"role": "user", "content": USER}, turn]
    before = renderer.render(head, tools, False)
    after = renderer.render([*head, *results], tools, True)
    if not after.startswith(before):
        raise TemplateError(
            NO_SUFFIX,
            "the chat template renders a conversation ending in an assistant turn "
            "differently once tool results follow it, so the text the tool results add "
            "cannot be found without re-tokenizing the model's own turn",
        )
    end = before[before.rindex(MARK) + len(MARK) :] if MARK in before else ""
    return end, after[len(before) :]


class ToolSuffix:
    """The ids appended after a sampled assistant turn for its tool results."""

    def __init__(
        self, renderer: ChatRenderer, tools: list[dict[str, Any]] | None, stop_texts: dict[int, str]
    ) -> None:
        self.renderer = renderer
        self.tools = tools
        #: The text of each stop id (``<|im_end|>``), to know what the turn already ended with.
        self.stop_texts = stop_texts
        self.end = turn_end(renderer, tools)

    def ids(self, last_id: int | None, results: Sequence[dict[str, Any]]) -> list[int]:
        """The tool suffix after a turn whose last sampled id is ``last_id``: the rest of
        the template's end of turn (what the stop id did not already write), then the
        tool messages and the next generation prompt."""
        _, after = suffix_text(self.renderer, results, self.tools)
        end = self.end
        stopped = self.stop_texts.get(last_id) if last_id is not None else None
        bridge = end[len(stopped) :] if stopped and end.startswith(stopped) else end
        if stopped and not end.startswith(stopped) and end.strip():
            bridge = end  # a stop id the template does not write (an extra EOS): keep its end
        return self.renderer.encode(bridge + after)


def check_template(renderer: ChatRenderer, tools: list[dict[str, Any]] | None) -> list[Finding]:
    """What keeps the template from a token-exact multi-turn tool conversation, by kind
    (empty: nothing). Each render is a probe; a template that raises is a finding too."""
    user = {"role": "user", "content": USER}
    try:
        renderer.render([user], tools, True)
    except Exception as exc:
        return [Finding(NO_TOOLS, f"rendering a prompt with the tools raised {exc!r}")]
    found: list[Finding] = []
    try:
        called = renderer.render([user, _assistant("", calls=True)], tools, False)
        if CALL_NAME not in called or CALL_ARG not in called:
            found.append(
                Finding(NO_CALLS, "it leaves an assistant message's tool_calls out of the text")
            )
    except Exception as exc:
        found.append(Finding(NO_CALLS, f"rendering an assistant tool call raised {exc!r}"))
    try:
        end, after = suffix_text(renderer, [tool_message(RESULT)], tools)
        if RESULT not in after:
            found.append(Finding(NO_RESULTS, "it leaves tool messages (role 'tool') out"))
        del end
    except TemplateError as exc:
        found.append(Finding(exc.kind, str(exc)))
    except Exception as exc:
        found.append(Finding(NO_RESULTS, f"rendering a tool message raised {exc!r}"))
    if not found:
        found += _earlier_turns(renderer, tools)
    return found


def _earlier_turns(renderer: ChatRenderer, tools: list[dict[str, Any]] | None) -> list[Finding]:
    """Whether every prefix of a two-turn tool conversation (the first turn with its
    reasoning) renders as the beginning of the longer ones."""
    first = _assistant(f"<think>{THOUGHT}</think>{MARK}", calls=True)
    conversation = [
        {"role": "user", "content": USER},
        first,
        tool_message(RESULT),
        _assistant("done"),
        {"role": "user", "content": USER + "2"},
        _assistant("again"),
    ]
    try:
        texts = [renderer.render(conversation[: k + 1], tools, False) for k in range(1, 6)]
    except Exception as exc:
        return [Finding(EARLIER_CHANGED, f"rendering a longer conversation raised {exc!r}")]
    for k in range(len(texts) - 1):
        if not texts[k + 1].startswith(texts[k]):
            dropped = THOUGHT in texts[k] and THOUGHT not in texts[k + 1]
            why = (
                "it drops an earlier assistant turn's reasoning once a later turn is appended"
                if dropped
                else "an earlier turn renders differently once a later one is appended"
            )
            return [Finding(EARLIER_CHANGED, why)]
    return []


class HFRenderer:
    """:class:`ChatRenderer` over a transformers tokenizer (the run's)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def render(
        self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), tools=tools, add_generation_prompt=gen, tokenize=False
            )
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def conversation_pieces(
    renderer: ChatRenderer,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    stop_text: str,
) -> list[tuple[str, bool]]:
    """A whole conversation cut as a multi-turn rollout lays it out: ``(text, trained)``
    pieces, the assistant turns' content and end-of-turn token trained (as sampled), the
    rest (system, user, tool turns, generation prompts, what follows the end token) not.
    Raises :class:`TemplateError` where a prefix renders differently once the
    conversation goes on."""
    pieces: list[tuple[str, bool]] = []
    done = ""
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = renderer.render(messages[:k], tools, True)
        full = renderer.render(messages[: k + 1], tools, False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise TemplateError(
                EARLIER_CHANGED,
                f"the chat template renders the conversation's first {k} messages "
                "differently once more follow, so its turns cannot be cut where a "
                "rollout would sample them",
            )
        turn = full[len(prompt) :]
        end = turn_end(renderer, tools)
        keep = end[len(stop_text) :] if stop_text and end.startswith(stop_text) else ""
        trained = turn[: len(turn) - len(keep)] if keep and turn.endswith(keep) else turn
        pieces += [(prompt[len(done) :], False), (trained, True)]
        done = prompt + trained
    rest = renderer.render(messages, tools, False)
    if rest.startswith(done) and len(rest) > len(done):
        pieces.append((rest[len(done) :], False))
    return [(text, trained) for text, trained in pieces if text]
