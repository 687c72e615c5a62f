"""The agent keys at composition (no files, no user code imported) and their trust rules:
``task.environment`` names a class, ``task.tools`` functions, ``task.tool_parser`` a
registered format; keys that do nothing without an environment or tools are warned
about; a config file may name only an environment marked ``@environment`` and tools
marked ``@tool``, while the command line may name any. Both verdicts for each."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hydra.types import RunMode

from art_hydra import ConfigValidationError, compose
from art_hydra.config.composition import (
    compose_and_check,
    make_loader,
    open_mapping_adds,
    settled,
)
from art_hydra.config.problems import Problem, Severity
from art_hydra.config.targets import key_role, marker_in_source
from art_hydra.tasks.agent_code import resolve_agent_code
from art_hydra.tasks.examples import TaskDataError

pytestmark = pytest.mark.fast

OWN_ENV = "art_hydra.tasks.tool_lookup.LookupEnv"
OWN_TOOL = "art_hydra.tasks.tool_lookup.lookup"

AGENTS = '''
from art_hydra import environment, tool


@environment
class Marked:
    def reset(self, **row):
        return None


class Unmarked:
    def reset(self, **row):
        return None


@tool
def marked_tool(x: int) -> int:
    """Echo.

    Args:
        x: A number.
    """
    return x


def unmarked_tool(x: int) -> int:
    """Echo.

    Args:
        x: A number.
    """
    return x
'''


@pytest.fixture(scope="module")
def loader() -> Any:
    return make_loader()


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("agents")
    (folder / "ar_agents.py").write_text(AGENTS)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _problems(loader: Any, *overrides: str) -> list[Problem]:
    """The problems of ``overrides`` as the command line composes them."""
    overrides = settled(open_mapping_adds(overrides))
    return compose_and_check(loader, "config", overrides, RunMode.RUN).problems


def _only(problems: list[Problem], key: str, severity: Severity = Severity.error) -> Problem:
    assert [(p.key, p.severity) for p in problems] == [(key, severity)], problems
    return problems[0]


def test_the_roles_of_the_agent_keys() -> None:
    assert key_role("task.environment._target_") == "environment"
    assert key_role("task.tools.3") == "tool"


def test_art_hydras_own_environment_and_tool_compose(loader: Any) -> None:
    env = f"task.environment._target_={OWN_ENV}"
    assert _problems(loader, env, f"task.tools=[{OWN_TOOL}]", "rl.max_tool_calls=2") == []


def test_an_environment_without_its_class_is_refused(loader: Any) -> None:
    found = _only(_problems(loader, "task.environment.size=3"), "task.environment")
    assert "without _target_" in found.reason
    assert "task.environment._target_" in dict(found.fix.sets)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("task.environment._target_", "subprocess.Popen", "standard-library"),
        ("task.environment._target_", "numpy.ndarray", "library 'numpy'"),
        ("task.environment._target_", "art_hydra.tasks.toy.Example", "art_hydra's own"),
        ("task.tools", "[os.system]", "standard-library"),
        ("task.tools", "[art_hydra.run.train]", "art_hydra's own tools"),
    ],
)
def test_code_that_is_never_an_environment_or_tool_is_refused(
    loader: Any, key: str, value: str, why: str
) -> None:
    problems = _problems(loader, f"{key}={value}")
    found = _only(problems, key if key.endswith("_target_") else f"{key}.0")
    assert why in found.reason


def test_an_unknown_tool_parser_is_refused_with_the_nearest(loader: Any) -> None:
    tools = f"task.tools=[{OWN_TOOL}]"
    found = _only(_problems(loader, "task.tool_parser=hermez", tools), "task.tool_parser")
    assert dict(found.fix.sets) == {"task.tool_parser": "hermes"}
    assert _problems(loader, "task.tool_parser=mistral", tools) == []


@pytest.mark.parametrize(
    "setting", ["task.tool_parser=hermes", "rl.max_tool_calls=3", "timeouts.tool_s=5"]
)
def test_tool_settings_without_tools_warn_and_with_tools_do_not(loader: Any, setting: str) -> None:
    key = setting.partition("=")[0]
    found = _only(_problems(loader, setting), key, Severity.warning)
    assert "no environment and no tools" in found.reason
    assert _problems(loader, setting, f"task.tools=[{OWN_TOOL}]") == []


def test_a_warm_start_under_sft_warns(loader: Any) -> None:
    found = _only(
        _problems(loader, "algorithm=sft", "rl.sft_warm_start_steps=3"),
        "rl.sft_warm_start_steps",
        Severity.warning,
    )
    assert "algorithm=sft" in found.reason


# ---- trust ---------------------------------------------------------------------------------


def test_marker_in_source_reads_an_environment_class(agents: Path) -> None:
    assert marker_in_source("ar_agents.Marked", "environment") is True
    assert marker_in_source("ar_agents.Unmarked", "environment") is False
    assert marker_in_source("ar_agents.marked_tool", "tool") is True


def _shared(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "shared" / "experiment"
    folder.mkdir(parents=True)
    (folder / "agent.yaml").write_text("# @package _global_\n" + body)
    return tmp_path / "shared"


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("task:\n  environment:\n    _target_: ar_agents.Unmarked\n", "task.environment._target_"),
        ("task:\n  tools: [ar_agents.unmarked_tool]\n", "task.tools.0"),
    ],
)
def test_a_config_file_may_name_only_marked_agent_code(
    agents: Path, tmp_path: Path, body: str, key: str
) -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["experiment=agent"], config_dir=str(_shared(tmp_path, body)))
    (found,) = [p for p in info.value.problems if p.key == key]
    assert "not marked" in found.reason
    marked = body.replace("Unmarked", "Marked").replace("unmarked_tool", "marked_tool")
    compose(["experiment=agent"], config_dir=str(_shared(tmp_path / "ok", marked)))


def test_resolve_agent_code_gives_the_class_and_the_functions(agents: Path) -> None:
    cfg = compose(
        ["task.environment._target_=ar_agents.Marked", "task.tools=[ar_agents.marked_tool]"]
    )
    env_class, tools = resolve_agent_code(cfg.task)
    assert env_class.__name__ == "Marked" and [t.__name__ for t in tools] == ["marked_tool"]
    assert resolve_agent_code(compose([]).task) == (None, [])
    bad = compose(["task.tools=[ar_agents.marked_tool,ar_agents.missing]"])
    with pytest.raises(TaskDataError, match=r"^task\.tools\.1=ar_agents\.missing: "):
        resolve_agent_code(bad.task)


def test_load_chat_template_reads_a_file_or_a_shipped_name(tmp_path: Path) -> None:
    from art_hydra.templates import ChatTemplateError, load_chat_template, shipped_names

    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    assert load_chat_template(str(path)) == "{{ messages }}"
    with pytest.raises(ChatTemplateError, match="names no template"):
        load_chat_template("no_such_name")
    for name in shipped_names():
        assert load_chat_template(name)


def test_allowed_modules_on_the_command_line_extend_trust_to_agent_code(
    agents: Path, tmp_path: Path
) -> None:
    body = "task:\n  environment:\n    _target_: ar_agents.Unmarked\n"
    shared = str(_shared(tmp_path, body))
    compose(["experiment=agent", "task.allowed_modules=[ar_agents]"], config_dir=shared)


def test_the_dry_runs_account_lists_the_agent_code(agents: Path) -> None:
    from art_hydra.config.trust import outside_code

    cfg = compose(
        [
            "task.environment._target_=ar_agents.Marked",
            f"task.tools=[ar_agents.marked_tool,{OWN_TOOL}]",
        ]
    )
    found = [(what, name) for what, name, _ in outside_code(cfg)]
    assert found == [("environment", "ar_agents.Marked"), ("tool", "ar_agents.marked_tool")]


def test_a_config_file_may_name_only_a_template_as_the_chat_template(tmp_path: Path) -> None:
    """An experiment from elsewhere naming any readable file as model.chat_template would
    copy it into prompts and saved tokenizers: refused unless it is a shipped name or a
    .jinja file; the command line may name any file."""
    from conftest import output_of, run_cli

    experiments = tmp_path / "conf" / "experiment"
    experiments.mkdir(parents=True)
    secret = tmp_path / "id_rsa"
    secret.write_text("not a template")
    (experiments / "leak.yaml").write_text(
        f"# @package _global_\nmodel:\n  chat_template: {secret}\n"
    )
    proc = run_cli("--config-dir", "conf", "experiment=leak", "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 1 and "model.chat_template = " in output_of(proc)
    assert "may name a shipped template or a .jinja file" in output_of(proc)
    (experiments / "shipped.yaml").write_text(
        "# @package _global_\nmodel:\n  chat_template: tools\n"
    )
    proc = run_cli("--config-dir", "conf", "experiment=shipped", "dry_run=true", cwd=tmp_path)
    assert "may name a shipped template" not in output_of(proc)
