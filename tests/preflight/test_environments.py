"""The environment pre-flight (issue 36, "checked before it starts"): the environment
class, its tools, ``reset`` on real rows, the chat template's tool turns and the
budgets, each decided before any model loads. Each check is tested both ways: a good
environment passes with no problem, each bad case gives exactly the expected one.

Templates are real jinja (a Qwen2.5-style Hermes template as Qwen2.5 ships it, one that
drops tool messages, a Qwen3-style one that drops earlier reasoning), rendered by the
tiny model's character tokenizer through ``model.chat_template`` or by a model folder's
tokenizer (``tokenizers`` only, no torch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import output_of, run_cli, write_model_files

from art_hydra import compose
from art_hydra.config.problems import Problem, Severity
from art_hydra.preflight.environments import environment_problems

pytestmark = pytest.mark.fast

#: Qwen2.5-Instruct's chat template (tools in the system turn, Hermes tool calls, tool
#: results as <tool_response> in a user turn).
QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n" }}
    {{- "You are provided with function signatures within <tools></tools>:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nReturn a call as <tool_call>{...}</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
        or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + CONTENT + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + CONTENT }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}TOOL_BRANCH
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
TOOL_BRANCH = """
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}"""
#: Qwen2.5's template as it is.
HERMES = QWEN25.replace("TOOL_BRANCH", TOOL_BRANCH).replace("CONTENT", "message.content")
#: The same, leaving tool messages out.
NO_TOOL_MESSAGES = QWEN25.replace("TOOL_BRANCH", "").replace("CONTENT", "message.content")
#: Qwen3's habit: an assistant turn before the last user message loses its reasoning.
QWEN3_LIKE = (
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    + QWEN25.replace("TOOL_BRANCH", TOOL_BRANCH).replace(
        "CONTENT",
        "(message.content.split('</think>')[-1] if loop.index0 < ns.last else message.content)",
    )
)

#: The user's agent code: good and bad environments and tools.
AGENTS = '''
from art_hydra import environment, tool


@environment
class GoodEnv:
    """A table lookup."""

    def __init__(self, size: int = 3) -> None:
        self.size = size

    def reset(self, prompt, city=None, **kwargs):
        return None if city is None else f"You are in {city}."

    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: The key to look up.
        """
        return key.upper()


class NoReset:
    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return key


class RaisingInit(GoodEnv):
    def __init__(self) -> None:
        raise RuntimeError("no table today")


class ResetRaises(GoodEnv):
    def reset(self, prompt, city=None):
        if city == "Atlantis":
            raise KeyError(city)


class ResetReturnsNumber(GoodEnv):
    def reset(self, **row):
        return 42


class UndocumentedTool(GoodEnv):
    def search(self, query: str) -> str:
        return query


class UndescribedArgument(GoodEnv):
    def search(self, query: str, limit: int = 3) -> str:
        """Search the table.

        Args:
            query: What to search for.
        """
        return query


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return key


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b
'''

#: Room for Qwen2.5's system turn with the tools, counted in characters.
ROOMY = ["rl.max_prompt_length=1024", "rl.max_completion_length=1024"]


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agents module on the import path, and a dataset with a ``city`` column whose
    third row ``reset`` fails on (for ResetRaises)."""
    folder = tmp_path_factory.mktemp("agents")
    (folder / "pf_agents.py").write_text(AGENTS)
    rows = [
        {"prompt": "ab", "answer": "AB", "city": "Paris"},
        {"prompt": "cd", "answer": "CD", "city": "Rome"},
        {"prompt": "ef", "answer": "EF", "city": "Atlantis"},
    ]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, text in {"hermes": HERMES, "no_tools": NO_TOOL_MESSAGES, "qwen3": QWEN3_LIKE}.items():
        (folder / f"{name}.jinja").write_text(text)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _problems(agents: Path, *overrides: str, template: str | None = "hermes") -> list[Problem]:
    base = ["task=dataset", f"task.path={agents / 'rows.jsonl'}", *ROOMY]
    if template:
        base.append(f"model.chat_template={agents / template}.jinja")
    return environment_problems(compose([*base, *overrides]))


def _one(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, problems
    return problems[0]


# ---- the environment class --------------------------------------------------------------


def test_a_good_environment_and_tools_pass(agents: Path) -> None:
    env = "task.environment={_target_: pf_agents.GoodEnv, size: 5}"
    assert _problems(agents, env, "task.tools=[pf_agents.add]") == []


def test_an_environment_without_reset_is_refused(agents: Path) -> None:
    found = _one(_problems(agents, "task.environment._target_=pf_agents.NoReset"))
    assert found.key == "task.environment._target_" and "no reset method" in found.reason


def test_a_constructor_that_raises_is_named(agents: Path) -> None:
    found = _one(_problems(agents, "task.environment._target_=pf_agents.RaisingInit"))
    assert found.key == "task.environment._target_" and found.is_error
    assert "no table today" in found.reason and "RuntimeError" in found.reason


def test_constructor_arguments_it_does_not_take_are_named(agents: Path) -> None:
    env = "task.environment={_target_: pf_agents.GoodEnv, colour: red}"
    found = _one(_problems(agents, env))
    assert "colour" in found.reason and "constructor raised" in found.reason


def test_a_function_is_not_an_environment(agents: Path) -> None:
    found = _one(_problems(agents, "task.environment._target_=pf_agents.add"))
    assert found.key == "task.environment._target_" and "not a class" in found.reason


# ---- reset on the first rows ----------------------------------------------------------


def test_reset_gets_the_rows_columns_and_a_failing_row_is_named(agents: Path) -> None:
    found = _one(_problems(agents, "task.environment._target_=pf_agents.ResetRaises"))
    assert found.key == "task.environment._target_"
    assert "rows.jsonl:3" in found.reason and "KeyError" in found.reason


def test_reset_must_return_text_or_none(agents: Path) -> None:
    found = _one(_problems(agents, "task.environment._target_=pf_agents.ResetReturnsNumber"))
    assert "returned a int" in found.reason and "rows.jsonl:1" in found.reason


# ---- the tools ----------------------------------------------------------------------------


def test_a_tool_without_a_docstring_is_refused(agents: Path) -> None:
    found = _one(_problems(agents, "task.environment._target_=pf_agents.UndocumentedTool"))
    assert found.key == "task.environment._target_" and found.value.endswith(".search")
    assert "no docstring" in found.reason and found.is_error


def test_an_undescribed_argument_is_a_warning(agents: Path) -> None:
    found = _one(_problems(agents, "task.environment._target_=pf_agents.UndescribedArgument"))
    assert found.severity == Severity.warning and "limit" in found.reason


def test_two_tools_of_one_name_are_refused(agents: Path) -> None:
    both = ["task.environment._target_=pf_agents.GoodEnv", "task.tools=[pf_agents.lookup]"]
    found = _one(_problems(agents, *both))
    assert found.key == "task.tools.0" and "'lookup'" in found.reason and found.is_error


def test_a_tool_that_does_not_resolve_is_named_by_its_index(agents: Path) -> None:
    found = _one(_problems(agents, "task.tools=[pf_agents.add,pf_agents.nothing]"))
    assert found.key == "task.tools.1" and "no attribute 'nothing'" in found.reason


# ---- the chat template ----------------------------------------------------------------------


def test_the_tiny_model_needs_a_template_for_tools(agents: Path) -> None:
    found = _one(_problems(agents, "task.tools=[pf_agents.add]", template=None))
    assert found.key == "model.chat_template" and dict(found.fix.sets) == {
        "model.chat_template": "tools"
    }


def test_a_template_that_leaves_tool_results_out_is_refused(agents: Path) -> None:
    found = _one(_problems(agents, "task.tools=[pf_agents.add]", template="no_tools"))
    assert found.key == "model.chat_template" and "tool results" in found.reason


def test_dropping_earlier_reasoning_warns_under_rl(agents: Path) -> None:
    found = _one(_problems(agents, "task.tools=[pf_agents.add]", template="qwen3"))
    assert found.severity == Severity.warning and "reasoning" in found.reason


def test_dropping_earlier_reasoning_refuses_sft_on_multi_turn_conversations(
    tmp_path: Path,
) -> None:
    template = tmp_path / "qwen3.jinja"
    template.write_text(QWEN3_LIKE)
    lookup = ["task=tool_lookup", "algorithm=sft", "sft.max_length=4096", "task.num_examples=4"]
    lookup.append(f"model.chat_template={template}")
    found = _one(environment_problems(compose(lookup)))
    assert found.is_error and "multi-turn" in found.reason
    # Without conversations to cut (no demonstrations), SFT is not affected.
    assert environment_problems(compose([*lookup, "+task.params.demonstrations=0.0"])) == []


def test_the_shipped_tools_template_holds_a_tool_conversation() -> None:
    from art_hydra.engine.envs.template import check_template
    from art_hydra.preflight.environments import TinyRenderer
    from art_hydra.templates import load_chat_template, shipped_names

    if "tools" not in shipped_names():
        pytest.skip("art_hydra/templates/tools.jinja is not there yet")
    assert check_template(TinyRenderer(load_chat_template("tools")), None) == []


@pytest.mark.parametrize(
    ("value", "why"),
    [("no_such_template", "names no template"), ("/nowhere/t.jinja", "does not exist")],
)
def test_a_chat_template_that_cannot_be_read_is_named(value: str, why: str) -> None:
    found = _one(environment_problems(compose([f"model.chat_template={value}"])))
    assert found.key == "model.chat_template" and why in found.reason


def test_a_folder_or_huge_chat_template_is_refused(tmp_path: Path) -> None:
    from art_hydra.templates import MAX_BYTES

    huge = tmp_path / "huge.jinja"
    huge.write_text("x" * (MAX_BYTES + 1))
    for value, why in ((tmp_path, "directory"), (huge, "larger than")):
        found = _one(environment_problems(compose([f"model.chat_template={value}"])))
        assert why in found.reason


def _qwen_folder(folder: Path, template: str | None) -> Path:
    """A model folder with a character tokenizer, ChatML's markers as special tokens, and
    ``template`` as its chat template (tokenizers only)."""
    from tokenizers import AddedToken, Tokenizer

    write_model_files(folder, {"model_type": "qwen2", "vocab_size": 128})
    core = Tokenizer.from_file(str(folder / "tokenizer.json"))
    core.add_special_tokens([AddedToken("<|im_start|>", special=True)])
    core.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    core.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<pad>", "unk_token": "<unk>"}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_model_folders_qwen_template_passes_and_one_without_fails(
    agents: Path, tmp_path: Path
) -> None:
    tools = ["task.tools=[pf_agents.add]", "model=pretrained"]
    good = _qwen_folder(tmp_path / "qwen", HERMES)
    assert _problems(agents, *tools, f"model.name={good}", template=None) == []
    bare = _qwen_folder(tmp_path / "bare", None)
    found = _one(_problems(agents, *tools, f"model.name={bare}", template=None))
    assert found.key == "model.chat_template" and "has no chat template" in found.reason


# ---- the budgets -----------------------------------------------------------------------------


def test_prompts_are_measured_with_the_tools_schemas(agents: Path) -> None:
    found = _one(_problems(agents, "task.tools=[pf_agents.add]", "rl.max_prompt_length=64"))
    assert found.key == "rl.max_prompt_length" and "tools' schemas" in found.reason


def test_a_completion_budget_too_small_for_one_tool_result_is_refused(agents: Path) -> None:
    found = _one(_problems(agents, "task.tools=[pf_agents.add]", "rl.max_completion_length=16"))
    assert found.key == "rl.max_completion_length" and found.is_error


def test_more_tool_calls_than_the_budget_holds_warn(agents: Path) -> None:
    found = _one(_problems(agents, "task.tools=[pf_agents.add]", "rl.max_tool_calls=20"))
    assert found.key == "rl.max_tool_calls" and found.severity == Severity.warning
    fits = dict(found.fix.sets)["rl.max_tool_calls"]
    assert f"at most {fits} calls" in found.reason and 1 <= fits < 20


# ---- the warm start -----------------------------------------------------------------------------


def test_a_warm_start_needs_demonstrations() -> None:
    found = _one(environment_problems(compose(["rl.sft_warm_start_steps=5"])))
    assert found.key == "rl.sft_warm_start_steps" and dict(found.fix.sets) == {
        "rl.sft_warm_start_steps": 0
    }
    assert environment_problems(compose(["experiment=tool_use"])) == []


# ---- the command line ---------------------------------------------------------------


def test_a_bad_environment_is_refused_before_any_run_folder(agents: Path, tmp_path: Path) -> None:
    proc = run_cli(
        "task.environment._target_=pf_agents.RaisingInit",
        "model.chat_template=tools",
        *ROOMY,
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env={"PYTHONPATH": str(agents)},
        module=True,
    )
    assert proc.returncode != 0
    out = output_of(proc)
    assert "task.environment._target_ = pf_agents.RaisingInit" in out and "no table today" in out
    assert not (tmp_path / "run").exists()
