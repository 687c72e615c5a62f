"""Conversations with tool calls as task data: a ``messages`` row with tool calls, tool
results or several assistant turns keeps its whole conversation for SFT; single-answer
rows stay as before; malformed tool calls are refused with the row named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_hydra import compose
from art_hydra.tasks import Example, TaskDataError, build_task
from art_hydra.tasks.dataset import BadRow, Columns, row_example

pytestmark = pytest.mark.fast

CALL = {"type": "function", "function": {"name": "look", "arguments": '{"key": "x"}'}}
CHAT = [
    {"role": "user", "content": "what is x?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "name": "look", "content": "7"},
    {"role": "assistant", "content": "x is 7"},
]


def test_a_tool_conversation_row_keeps_the_whole_conversation() -> None:
    example = row_example({"messages": CHAT, "tools": []}, Columns(), "SFT")
    assert isinstance(example, Example)
    assert example.conversation_messages() == CHAT
    # prompt and answer as for any messages row: the turns before the last assistant turn
    assert example.answer == "x is 7" and example.messages[-1] == ("tool", "7")
    assert isinstance(example.conversation, tuple)  # immutable
    single = row_example({"messages": [CHAT[0], CHAT[3]]}, Columns(), "SFT")
    assert isinstance(single, Example) and single.conversation is None


def test_null_keys_of_parquet_message_structs_are_dropped() -> None:
    padded = [{"tool_calls": None, "name": None, **m} for m in CHAT]
    example = row_example({"messages": padded}, Columns(), "SFT")
    assert isinstance(example, Example) and example.conversation_messages() == CHAT


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"role": "assistant", "content": "", "tool_calls": {"name": "x"}}, "must be a list"),
        ({"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}, "no name"),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]},
            "not JSON",
        ),
        ({"role": "tool", "name": "look"}, "tool message without content"),
        ({"role": "user", "content": "x", "tool_calls": [CALL]}, "only assistant turns"),
    ],
)
def test_malformed_messages_are_refused_with_the_reason(message: dict, reason: str) -> None:
    found = row_example({"messages": [CHAT[0], message, CHAT[3]]}, Columns(), "SFT")
    assert isinstance(found, BadRow) and reason in found.message, found


def test_a_bad_row_is_named_by_file_and_line(tmp_path: Path) -> None:
    bad = [CHAT[0], {"role": "tool", "content": None}, CHAT[3]]
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n" + json.dumps({"messages": bad}) + "\n")
    cfg = compose(["task=dataset", f"task.path={path}", "algorithm=sft"])
    with pytest.raises(TaskDataError, match=r"chats\.jsonl:2.*tool message without content"):
        build_task(cfg)


def test_a_rows_tools_column_must_hold_schemas() -> None:
    found = row_example({"messages": CHAT, "tools": [{"name": "x"}]}, Columns(), "SFT")
    assert isinstance(found, BadRow) and "JSON schemas" in found.message


def test_a_generator_makes_demonstrations_from_message_dicts() -> None:
    example = Example.from_conversation(CHAT)
    assert (example.prompt, example.answer) == ("what is x?", "x is 7")
    assert example.messages == (("user", "what is x?"),)
    assert Example(prompt="p", conversation=CHAT).conversation == example.conversation
    with pytest.raises(TaskDataError, match="no assistant turn"):
        Example(prompt="p", conversation=CHAT[:1])


def test_the_system_prompt_leads_a_demonstration_as_it_leads_its_prompt() -> None:
    from art_hydra.tasks.base import with_system_prompt

    led = with_system_prompt(Example.from_conversation(CHAT), "Use tools.")
    assert led.conversation_messages() == [{"role": "system", "content": "Use tools."}, *CHAT]
    assert led.messages[0] == ("system", "Use tools.")
    assert with_system_prompt(led, "Other.").conversation == led.conversation
