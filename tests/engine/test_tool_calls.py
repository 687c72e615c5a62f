"""Tools and tool-call parsers: the schema a function gives the model, calls that go
wrong fed back as the tool message, and each registered format read."""

from __future__ import annotations

import threading
from typing import Literal

import pytest

from art_hydra.engine.envs import parsers
from art_hydra.engine.envs.tools import (
    ToolSchemaError,
    ToolTimeout,
    call_tool,
    environment_methods,
    function_tools,
    tool_schema,
)

pytestmark = pytest.mark.fast


def lookup(key: str, limit: int = 3, mode: Literal["a", "b"] = "a") -> str:
    """Look up a key.

    Args:
        key: The key to find.
        limit (int): How many values
            to return at most.

    Returns:
        The values.
    """
    return key * limit


def test_schema_comes_from_docstring_and_hints() -> None:
    schema = tool_schema(lookup)
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "lookup"
    assert function["description"] == "Look up a key."
    props = function["parameters"]["properties"]
    assert props["key"] == {"type": "string", "description": "The key to find."}
    assert props["limit"] == {
        "type": "integer",
        "description": "How many values to return at most.",
    }
    assert props["mode"] == {"enum": ["a", "b"]}
    assert function["parameters"]["required"] == ["key"]


def test_a_tool_without_docstring_or_hint_is_refused() -> None:
    def bare(key: str) -> str:
        return key

    def untyped(key):  # type: ignore[no-untyped-def]
        """Has a docstring."""
        return key

    def spread(**kw: str) -> str:
        """Takes anything."""
        return ""

    with pytest.raises(ToolSchemaError, match="no docstring"):
        tool_schema(bare)
    with pytest.raises(ToolSchemaError, match="no type hint"):
        tool_schema(untyped)
    with pytest.raises(ToolSchemaError, match="by name"):
        tool_schema(spread)


class Env:
    def reset(self, **row: object) -> None: ...

    def get_reward(self) -> float:
        return 1.0

    def search(self, query: str) -> str:
        """Search."""
        return query

    def _helper(self) -> None: ...


def test_environment_tools_are_its_public_methods_but_reset_and_get_reward() -> None:
    assert environment_methods(Env) == ["search"]


def boom(x: int) -> int:
    """Raises."""
    raise ValueError("bad x")


def test_failed_calls_become_the_tool_message() -> None:
    tools = {t.name: t for t in function_tools([lookup, boom])}
    assert call_tool(tools, "lookup", {"key": "ab", "limit": 2}, 5).content == "abab"
    unknown = call_tool(tools, "nope", {}, 5)
    assert unknown.error and "no tool named 'nope'" in unknown.content
    missing = call_tool(tools, "lookup", {"limit": 2}, 5)
    assert missing.error and "key" in missing.content
    raised = call_tool(tools, "boom", {"x": 1}, 5)
    assert raised.error and "bad x" in raised.content
    not_object = call_tool(tools, "lookup", ["ab"], 5)  # type: ignore[arg-type]
    assert not_object.error


def test_a_tool_that_never_returns_stops_the_run_naming_it() -> None:
    gate = threading.Event()

    def hang(x: int) -> int:
        """Waits."""
        gate.wait(10)
        return x

    tools = {t.name: t for t in function_tools([hang])}
    with pytest.raises(ToolTimeout, match=r"hang\(.*timeouts.tool_s"):
        call_tool(tools, "hang", {"x": 1}, 0.05)
    gate.set()


def test_results_are_text_json_or_str() -> None:
    def table(k: str) -> dict:
        """A dict."""
        return {"k": k}

    tools = {t.name: t for t in function_tools([table])}
    assert call_tool(tools, "table", {"k": "v"}, 5).content == '{"k": "v"}'


def test_hermes_reads_every_call_and_the_text_before() -> None:
    text = (
        'Let me look.<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call>'
    )
    turn = parsers.hermes(text)
    assert turn.content == "Let me look."
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("a", {"x": 1}), ("b", {"y": 2})]
    assert parsers.hermes("just text").tool_calls == ()


def test_hermes_reports_a_call_it_cannot_read() -> None:
    (call,) = parsers.hermes("<tool_call>{not json</tool_call>").tool_calls
    assert call.error and "not JSON" in call.error
    (unnamed,) = parsers.hermes('<tool_call>{"arguments": {}}</tool_call>').tool_calls
    assert unnamed.error and "name" in unnamed.error


def test_llama3_and_mistral_formats() -> None:
    turn = parsers.llama3_json('<|python_tag|>{"name": "f", "parameters": {"q": "x"}}')
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("f", {"q": "x"})]
    assert parsers.llama3_json("The answer is 4").tool_calls == ()
    turn = parsers.mistral('ok[TOOL_CALLS][{"name": "g", "arguments": {"n": 2}}]')
    assert turn.content == "ok" and turn.tool_calls[0].arguments == {"n": 2}


def test_openai_shape_has_arguments_as_json_text() -> None:
    call = parsers.ToolCall("f", {"a": 1})
    assert call.openai() == {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert call.template()["function"]["arguments"] == {"a": 1}


def test_auto_follows_the_tokenizer() -> None:
    assert parsers.detected_format("{{ '<tool_call>' }}", False) == "hermes"
    assert parsers.detected_format("[TOOL_CALLS]", False) == "mistral"
    assert parsers.detected_format("<|python_tag|>", False) == "llama3_json"
    assert parsers.detected_format("<tool_call>", True) == "transformers"

    class Tok:
        chat_template = "[TOOL_CALLS]"
        response_schema = None

    assert parsers.turn_parser("auto", Tok()) is parsers.mistral
    assert "hermes" in parsers.parser_names() and "auto" in parsers.parser_names()
    with pytest.raises(ValueError, match=r"task\.tool_parser"):
        parsers.turn_parser("nope", Tok())


def test_a_registered_format_is_one_function() -> None:
    @parsers.register_tool_parser("test_always")
    def always(text: str) -> parsers.ParsedTurn:
        return parsers.ParsedTurn("", (parsers.ToolCall("f", {"t": text}),))

    try:
        assert "test_always" in parsers.parser_names()
        assert parsers.get_parser("test_always") is always
    finally:
        parsers._PARSERS.pop("test_always")


def test_a_request_never_asks_for_more_than_its_trajectory_has_left() -> None:
    from art_hydra.engine.envs.loop import room

    budget = 96
    rooms = {left: room(left, budget) for left in range(1, budget + 1)}
    assert all(1 <= r <= left for left, r in rooms.items())
    assert rooms[budget] == budget  # a first turn is one request
    assert len(set(rooms.values())) <= 8 + 12  # a few batches, not one per trajectory


def test_a_library_base_classes_methods_are_not_tools() -> None:
    import string

    class Wrapped(string.Formatter):  # a library base: format, parse, ... are public
        def reset(self, **row: object) -> None: ...

        def lookup(self, key: str) -> str:
            """Look up."""
            return key

    assert environment_methods(Wrapped) == ["lookup"]
