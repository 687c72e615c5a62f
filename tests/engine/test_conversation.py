"""SFT rows of whole conversations are token-exact with a multi-turn rollout of the same
turns (prompt ids + sampled ids + tool-suffix ids), and train exactly the assistant turns
once packed; on the tiny model's character tokenizer and on Qwen's tokenizer class with
Qwen2.5's Hermes tool template (TRL's copy)."""

from __future__ import annotations

import importlib.util
import string
from pathlib import Path
from typing import Any

import pytest
from model_folders import qwen_tokenizer

from art_hydra.engine.backends.tiny import build_tokenizer
from art_hydra.engine.conversation import conversation_sequence, example_sequence
from art_hydra.engine.envs.template import HFRenderer, ToolSuffix
from art_hydra.engine.packing import PACKED, pack
from art_hydra.tasks.examples import Example, TaskDataError

pytestmark = pytest.mark.fast

#: A tool template in the tiny tokenizer's characters (no newline): the turn ends with EOS.
TINY = (
    "{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<A>{{ m['content'] or '' }}"
    "{% for c in m['tool_calls'] or [] %}"
    "[call {{ c['function']['name'] }} {{ c['function']['arguments'] | tojson }}]"
    "{% endfor %}{{ eos_token }} "
    "{% elif m['role'] == 'tool' %}<T>{{ m['content'] }} "
    "{% else %}<{{ m['role'][0] | upper }}>{{ m['content'] }} {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<A>{% endif %}"
)
CALL = {"type": "function", "function": {"name": "look", "arguments": '{"key": "x"}'}}
CHAT = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "what is x?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "name": "look", "content": "7"},
    {"role": "assistant", "content": "x is 7"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "look",
            "description": "Look a key up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
        },
    }
]


def _rollout(tok: Any, turns: list[str], stop: str) -> tuple[list[int], list[int]]:
    """What the RL loop builds for CHAT's turns, sampled as ``turns`` (each ending with the
    stop id): prompt ids (the template with the generation prompt, as the producer encodes
    prompts), the sampled ids, the tool suffix's ids; and 1 on each sampled id."""
    renderer = HFRenderer(tok)
    out = tok.apply_chat_template(CHAT[:2], tools=TOOLS, add_generation_prompt=True)
    ids = list(out["input_ids"] if hasattr(out, "keys") else out)
    marks = [0] * len(ids)
    stop_id = tok.convert_tokens_to_ids(stop)
    suffix = ToolSuffix(renderer, TOOLS, {stop_id: stop})
    first = renderer.encode(turns[0])
    tail = suffix.ids(stop_id, [CHAT[3]])
    second = renderer.encode(turns[1])
    ids += first + tail + second
    marks += [1] * len(first) + [0] * len(tail) + [1] * len(second)
    return ids, marks


def _check(tok: Any, turns: list[str], stop: str) -> None:
    sequence = conversation_sequence(tok, CHAT, TOOLS, train_prompt=False)
    ids, marks = _rollout(tok, turns, stop)
    assert sequence.tokens == ids  # token-exact with the rollout
    assert sequence.prompt_len == marks.index(1)
    assert sequence.completion_mask == marks[sequence.prompt_len :]
    # Packed: the loss falls on exactly the assistant turns' ids (both turns), each
    # predicted from the position before it.
    batch = pack([sequence], 1024, tok.pad_token_id or 0, PACKED)
    trained = batch.targets[batch.loss_mask.bool()].tolist()
    assert trained == [t for t, m in zip(ids, marks, strict=True) if m]
    assert tok.decode(trained) == "".join(turns)
    # sft.completion_only_loss=false: every token trains.
    whole = conversation_sequence(tok, CHAT, TOOLS, train_prompt=True)
    assert whole.tokens == ids and whole.completion_mask is None


def test_the_tiny_tokenizer_row_is_the_rollout_of_the_same_turns() -> None:
    tok = build_tokenizer(string.printable[:95])
    tok.chat_template = TINY
    _check(tok, ['[call look {"key": "x"}]<eos>', "x is 7<eos>"], "<eos>")


def _qwen25_template() -> str:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("trl (which ships Qwen2.5's template) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "chat_templates" / "qwen2_5.jinja"
    return path.read_text()


def test_qwen25_hermes_template_row_is_the_rollout_of_the_same_turns(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    qwen_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.chat_template = _qwen25_template()
    call = '<tool_call>\n{"name": "look", "arguments": {"key": "x"}}\n</tool_call><|im_end|>'
    _check(tok, [call, "x is 7<|im_end|>"], "<|im_end|>")


def test_a_turn_end_that_is_not_the_stop_id_trains_the_stop_id_as_sampled() -> None:
    """A template ending turns with a space, not EOS: the rollout samples the content and
    EOS, and the tool suffix writes the template's end after it."""
    tok = build_tokenizer(string.printable[:95])
    tok.chat_template = TINY.replace("{{ eos_token }} ", " ")
    sequence = conversation_sequence(tok, CHAT, TOOLS, train_prompt=False)
    marks = sequence.completion_mask or []
    trained = [t for t, m in zip(sequence.tokens[sequence.prompt_len :], marks, strict=True) if m]
    assert tok.decode(trained) == '[call look {"key": "x"}]<eos>x is 7<eos>'
    assert tok.decode(sequence.tokens).endswith("<T>7 <A>x is 7<eos>")


def test_a_template_that_drops_earlier_reasoning_names_the_fix() -> None:
    tok = build_tokenizer(string.printable[:95])
    # Drops every assistant turn's content but the last one's (as reasoning templates do).
    tok.chat_template = TINY.replace(
        "<A>{{ m['content'] or '' }}", "<A>{% if loop.last %}{{ m['content'] or '' }}{% endif %}"
    )
    chat = [*CHAT[:2], {"role": "assistant", "content": "hm"}, *CHAT[3:]]
    with pytest.raises(TaskDataError, match=r"model\.chat_template=") as caught:
        conversation_sequence(tok, chat, None, train_prompt=False, where="row data.jsonl:3")
    assert "row data.jsonl:3" in str(caught.value)


def test_a_tokenizer_without_a_template_is_refused_with_the_fix() -> None:
    example = Example.from_conversation(CHAT)
    with pytest.raises(TaskDataError, match=r"has none.*model\.chat_template"):
        example_sequence(build_tokenizer(), example, None, train_prompt=False)


def test_a_rows_own_tools_column_is_rendered() -> None:
    tok = build_tokenizer(string.printable[:95])
    tok.chat_template = TINY
    example = Example.from_conversation(CHAT, columns={"tools": TOOLS})
    text = tok.decode(example_sequence(tok, example, None, train_prompt=False).tokens)
    assert text.startswith("<tools>look;")
    # JSON-text arguments are rendered as the object transformers' templates expect.
    assert '[call look {"key": "x"}]' in text
