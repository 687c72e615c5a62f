"""Tool-call parsers: the text of an assistant turn -> its content and its tool calls.

One registry of formats (``task.tool_parser``): ``hermes`` (``<tool_call>{json}</tool_call>``,
Qwen 2.5/3, Hermes and the tiny model's template), ``llama3_json`` (a JSON object with
``name`` and ``parameters``), ``mistral`` (``[TOOL_CALLS][...]``), and ``transformers``,
the tokenizer's own ``parse_response`` where its model ships a response schema. ``auto``
takes the tokenizer's own support where there is one, else the format its chat
template writes. A new format is one function and one :func:`register_tool_parser`
line. Nothing here imports torch or transformers (the gate names the formats).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

AUTO = "auto"


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object), or why the model's
    text could not be read as a call (``error``; fed back to it as the tool message)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def openai(self) -> dict[str, Any]:
        """As an OpenAI chat ``tool_calls`` entry (arguments as a JSON string)."""
        return {
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }

    def template(self) -> dict[str, Any]:
        """As chat templates take it (transformers' convention: arguments as a dict)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn read: the text around the calls, and the calls in order."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()


Parser = Callable[[str], ParsedTurn]
_PARSERS: dict[str, Parser] = {}


def register_tool_parser(name: str) -> Callable[[Parser], Parser]:
    """Register ``fn(text) -> ParsedTurn`` as the tool-call format ``name``."""

    def add(fn: Parser) -> Parser:
        _PARSERS[name] = fn
        return fn

    return add


def parser_names() -> tuple[str, ...]:
    """Every value ``task.tool_parser`` takes."""
    return (AUTO, *sorted(_PARSERS), "transformers")


def get_parser(name: str) -> Parser | None:
    return _PARSERS.get(name)


def _call(data: Any, args_key: str = "arguments") -> ToolCall:
    """A decoded JSON call ``{"name": ..., "arguments": {...}}`` (arguments may arrive as
    a JSON string, as OpenAI writes them), or one that says why it is not a call."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall("", error='a tool call must be a JSON object with a "name"')
    arguments = data.get(args_key, data.get("arguments", data.get("parameters", {})))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(data["name"], error="its arguments are not JSON")
    if not isinstance(arguments, dict):
        return ToolCall(data["name"], error="its arguments must be a JSON object")
    return ToolCall(data["name"], arguments)


def _decoded(text: str, args_key: str = "arguments") -> ToolCall:
    try:
        return _call(json.loads(text), args_key)
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"the tool call is not JSON ({exc.msg} at {exc.pos})")


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@register_tool_parser("hermes")
def hermes(text: str) -> ParsedTurn:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them."""
    found = _HERMES.findall(text)
    if not found:
        return ParsedTurn(text.strip())
    content = text[: text.index("<tool_call>")].strip()
    return ParsedTurn(content, tuple(_decoded(body) for body in found))


@register_tool_parser("llama3_json")
def llama3_json(text: str) -> ParsedTurn:
    """Llama 3's JSON tool calls: the turn is ``{"name": ..., "parameters": {...}}``
    (after an optional ``<|python_tag|>``), several separated by ``;``."""
    body = text.replace("<|python_tag|>", "").strip()
    if not body.startswith("{"):
        return ParsedTurn(text.strip())
    calls = []
    for part in (p for p in re.split(r"\}\s*;\s*\{", body) if p.strip()):
        piece = part if part.startswith("{") else "{" + part
        piece = piece if piece.rstrip().endswith("}") else piece + "}"
        calls.append(_decoded(piece, "parameters"))
    return ParsedTurn("", tuple(calls))


@register_tool_parser("mistral")
def mistral(text: str) -> ParsedTurn:
    """Mistral's ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``."""
    marker = "[TOOL_CALLS]"
    if marker not in text:
        return ParsedTurn(text.strip())
    content, _, body = text.partition(marker)
    try:
        data = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return ParsedTurn(content.strip(), (ToolCall("", error=f"not JSON ({exc.msg})"),))
    items = data if isinstance(data, list) else [data]
    return ParsedTurn(content.strip(), tuple(_call(item) for item in items))


def from_response(parsed: Any) -> ParsedTurn:
    """transformers' ``tokenizer.parse_response`` output (a message dict) as a turn."""
    if not isinstance(parsed, dict):
        return ParsedTurn(str(parsed))
    calls = []
    for entry in parsed.get("tool_calls") or []:
        function = entry.get("function", entry) if isinstance(entry, dict) else entry
        calls.append(_call(function))
    return ParsedTurn(str(parsed.get("content") or "").strip(), tuple(calls))


def detected_format(template: str | None, has_response_schema: bool) -> str:
    """The format ``auto`` stands for: the tokenizer's own parser where its model ships a
    response schema, else the one the chat template writes (hermes when it names none)."""
    if has_response_schema:
        return "transformers"
    text = template or ""
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_tag|>" in text or '"parameters"' in text:
        return "llama3_json"
    return "hermes"


def turn_parser(name: str, tokenizer: Any) -> Parser:
    """The parser ``task.tool_parser=name`` stands for with ``tokenizer`` (a transformers
    tokenizer, or anything with ``chat_template`` and ``response_schema``)."""
    if name == AUTO:
        schema = getattr(tokenizer, "response_schema", None)
        name = detected_format(getattr(tokenizer, "chat_template", None), bool(schema))
    if name == "transformers":
        return lambda text: from_response(tokenizer.parse_response(text))
    parser = _PARSERS.get(name)
    if parser is None:
        raise ValueError(f"task.tool_parser={name!r} is not one of {', '.join(parser_names())}")
    return parser
