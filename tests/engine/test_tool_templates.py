"""Real families' tool templates, in shape, through the template checks: Llama 3.1 (a
call written alone, results as ipython turns) and Qwen3 (an empty think block on a last
turn without reasoning, earlier reasoning dropped after a new question) keep a tool
suffix that can be found; only Qwen3's dropping of earlier turns is a finding, the
warning kind."""

from __future__ import annotations

from typing import Any

import pytest

from art_hydra.engine.envs import template as tpl
from art_hydra.folder_tokenizer import render_bounded

pytestmark = pytest.mark.fast

LLAMA31 = (
    "{{- bos_token }}"
    "{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython"
    "<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}"
    "{%- elif 'tool_calls' in message %}"
    "{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    '{{- \'{"name": "\' + tool_call.name + \'", "parameters": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

QWEN3 = (
    "{%- if tools %}{{- '<|im_start|>system\\n<tools>' }}{%- for t in tools %}"
    "{{- '\\n' + t | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and not "
    "(message.content.startswith('<tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' "
    "+ content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- set tool_call = tool_call.function %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {}}}]


class Chars:
    """A template renderer in the folder tokenizer's sandbox, one id per character."""

    def __init__(self, template: str) -> None:
        self.template = template

    def render(self, messages: Any, tools: Any, gen: bool) -> str:
        variables = {
            "messages": list(messages),
            "tools": tools,
            "add_generation_prompt": gen,
            "bos_token": "<|begin_of_text|>",
        }
        return render_bounded(self.template, variables, "test")

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_llama31_writes_the_call_alone_and_holds_a_tool_conversation() -> None:
    renderer = Chars(LLAMA31)
    assert tpl.check_template(renderer, TOOLS) == []
    suffix = tpl.ToolSuffix(renderer, TOOLS, {9: "<|eot_id|>"})
    ids = suffix.ids(9, [tpl.tool_message("42")])
    assert "".join(map(chr, ids)) == (
        "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_qwen3_keeps_a_tool_suffix_and_warns_of_dropped_reasoning() -> None:
    renderer = Chars(QWEN3)
    found = tpl.check_template(renderer, TOOLS)
    assert [f.kind for f in found] == [tpl.EARLIER_CHANGED], found
    suffix = tpl.ToolSuffix(renderer, TOOLS, {5: "<|im_end|>"})
    ids = suffix.ids(5, [tpl.tool_message("42")])
    # The stop id wrote <|im_end|>; the newline after it is the template's, untrained.
    assert "".join(map(chr, ids)) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
