"""Rewards that are callable objects, the answer column every reward sees, column
settings the data does not read, TRL data under ``task=jsonl``, rewards that apply to
nothing, and a generator that fails on the user's ``task.params``: each decided by the
pre-flight, on real files, through the real CLI where the verdict matters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import output_of, shared_config_dir
from omegaconf import OmegaConf

from art_hydra import Severity, compose
from art_hydra.config.composition import compose_and_check, make_loader, open_mapping_adds
from art_hydra.preflight import world_problems
from art_hydra.tasks.base import RewardArgsError, iter_examples, reward_object
from art_hydra.tasks.reward_set import batched_kwargs, calling, per_sample_kwargs, reward_specs

#: Room for the rows' prompts on the tiny model.
FIT = ["rl.max_prompt_length=32", "rl.max_completion_length=16"]

REWARDS = """\
from art_hydra import reward


class Scaled:
    def __init__(self, scale=1.0):
        self.scale = scale

    def __call__(self, prompt, completion, answer=None):
        return self.scale * float(completion.strip() == (answer or "").strip())


@reward
class MarkedBatched:
    def __call__(self, prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]


@reward
class MarkedScaled(Scaled):
    pass


class Broken:
    def __init__(self):
        raise ValueError("no judge model at /nowhere")

    def __call__(self, prompts, completions, **kwargs):
        return [1.0] * len(completions)


class NoCall:
    pass


class OddCall:
    def __call__(self, x):
        return 1.0


@reward
def not_applicable(prompts, completions, **kwargs):
    return [None] * len(completions)


def seen_answer(prompts, completions, answer, **kwargs):
    return [1.0] * len(completions)
"""


@pytest.fixture
def rewards_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "my_objects.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _world(*overrides: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for p in world_problems(compose(list(overrides)), None):
        found.setdefault(p.key, []).append(p)
    return found


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- a callable object as a reward -------------------------------------------------------


def test_a_class_whose_instances_are_callable_is_a_reward(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "my_objects.py").write_text(REWARDS)
    proc = cli("task.reward._target_=my_objects.Scaled", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "configuration is valid" in output_of(proc)


def test_a_reward_class_obeys_the_marker_rules_of_a_function(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "my_objects.py").write_text(REWARDS)
    task = (
        "name: mine\ngenerator: art_hydra.tasks.toy.reverse_examples\n"
        "params: {{length: 3, alphabet: abcd}}\nreward: {{_target_: x.y}}\n"
        "rewards:\n  - _target_: my_objects.{}\n"
    )
    shared = shared_config_dir(
        tmp_path,
        {
            "task/marked.yaml": task.format("MarkedBatched"),
            "task/plain.yaml": task.format("Scaled"),
        },
    )
    env = {"PYTHONPATH": str(tmp_path)}
    marked = cli("--config-dir", str(shared), "task=marked", "dry_run=true", env=env)
    assert marked.returncode == 0, output_of(marked)
    plain = cli("--config-dir", str(shared), "task=plain", "dry_run=true", env=env)
    assert plain.returncode != 0
    assert "not marked as a reward (a def or class decorated @reward" in output_of(plain)


def test_a_constructor_that_raises_is_named_with_its_file_and_line(
    cli: Any, tmp_path: Path
) -> None:
    (tmp_path / "my_objects.py").write_text(REWARDS)
    proc = cli("task.reward._target_=my_objects.Broken", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode != 0
    assert "its constructor raised ValueError: no judge model at /nowhere" in out
    line = REWARDS.splitlines().index('        raise ValueError("no judge model at /nowhere")') + 1
    assert f"my_objects.py:{line}, in __init__" in out
    assert "Traceback" not in out


def test_a_class_without_call_or_with_a_call_no_reward_has_is_refused(
    rewards_module: Path,
) -> None:
    found = _world("task.reward._target_=my_objects.NoCall")
    (problem,) = found["task.reward._target_"]
    assert "whose instances cannot be called" in problem.reason
    found = _world("task.reward._target_=my_objects.OddCall")
    (problem,) = found["task.reward._target_"]
    assert "takes (x): neither a per-sample reward" in problem.reason


def test_an_instance_is_read_as_per_sample_or_batched_by_its_call(rewards_module: Path) -> None:
    import my_objects  # type: ignore[import-not-found]

    assert calling(my_objects.Scaled()).batched is False
    assert calling(my_objects.MarkedBatched()).batched is True


def test_an_entry_s_other_keys_are_the_constructor_s_arguments(rewards_module: Path) -> None:
    """What the schema's entry holds besides _target_, weight and name goes to the class;
    a function given such keys is refused, a misspelt key of ours named."""
    import my_objects

    task = OmegaConf.create(
        {"rewards": [{"_target_": "my_objects.Scaled", "weight": 2.0, "scale": 3.0}]}
    )
    (spec,) = reward_specs(task)
    assert (spec.weight, spec.kwargs) == (2.0, (("scale", 3.0),))
    assert reward_object(my_objects.Scaled, spec).scale == 3.0
    task = OmegaConf.create({"rewards": [{"_target_": "my_objects.seen_answer", "weigth": 2}]})
    (spec,) = reward_specs(task)
    with pytest.raises(RewardArgsError, match="weigth: did you mean weight"):
        reward_object(my_objects.seen_answer, spec)


def test_a_class_reward_takes_its_arguments_from_the_command_line(cli: Any, tmp_path: Path) -> None:
    """An entry's keys besides _target_, weight and name pass the schema (only the
    pre-flight knows a class from a function) and reach the constructor."""
    (tmp_path / "my_objects.py").write_text(REWARDS)
    good = cli("task.rewards=[{_target_: my_objects.Scaled, scale: 2}]", "dry_run=true")
    assert good.returncode == 0, output_of(good)
    edited = cli(
        "task.rewards=[{_target_: my_objects.Scaled}]", "task.rewards.0.scale=2", "dry_run=true"
    )
    assert edited.returncode == 0, output_of(edited)
    typo = cli("task.rewards=[{_target_: my_objects.Scaled, scael: 2}]", "dry_run=true")
    out = output_of(typo)
    assert typo.returncode != 0
    assert "task.rewards.0.scael" in out and "(did you mean scale?)" in out, out
    assert "task.rewards=[{_target_:my_objects.Scaled,weight:1.0,name:null,scale:2}]" in (out), out
    assert "Traceback" not in out


def test_a_function_reward_given_an_extra_key_is_refused_with_the_key_it_meant(
    cli: Any, tmp_path: Path
) -> None:
    (tmp_path / "my_objects.py").write_text(REWARDS)
    proc = cli("task.rewards=[{_target_: my_objects.seen_answer, weigth: 2}]", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode != 0
    assert "task.rewards.0.weigth" in out and "weigth: did you mean weight?" in out, out
    assert "task.rewards=[{_target_:my_objects.seen_answer,weight:2,name:null}]" in out, out


def test_an_entry_s_weight_keeps_its_type_and_default(tmp_path: Path) -> None:
    """The entries are open mappings to Hydra, typed by the fit: a default for the
    weight, a type error for a weight that is not a number."""
    cfg = compose(["task.rewards=[{_target_: m.f}]"])
    assert cfg.task.rewards[0].weight == 1.0
    overrides = ["task.rewards=[{_target_: m.f}]", "task.rewards.0.weight=abc"]
    result = compose_and_check(make_loader(), "config", open_mapping_adds(overrides))
    found = {p.key: p for p in result.problems}
    assert "has the wrong type: expected float" in found["task.rewards.0.weight"].reason


def test_a_class_reward_takes_its_arguments_from_a_config_file(cli: Any, tmp_path: Path) -> None:
    """An experiment file in --config-dir may give a marked class its arguments; an
    unmarked class is refused there as an unmarked function is."""
    (tmp_path / "my_objects.py").write_text(REWARDS)
    experiment = (
        "# @package _global_\ntask:\n  rewards:\n"
        "    - {{_target_: my_objects.{}, scale: 2, weight: 0.5}}\n"
    )
    shared = shared_config_dir(
        tmp_path,
        {
            "experiment/marked.yaml": experiment.format("MarkedScaled"),
            "experiment/plain.yaml": experiment.format("Scaled"),
        },
    )
    env = {"PYTHONPATH": str(tmp_path)}
    marked = cli("--config-dir", str(shared), "experiment=marked", "dry_run=true", env=env)
    assert marked.returncode == 0, output_of(marked)
    plain = cli("--config-dir", str(shared), "experiment=plain", "dry_run=true", env=env)
    assert plain.returncode != 0
    assert "not marked as a reward (a def or class decorated @reward" in output_of(plain)


# ---- one answer for every reward ---------------------------------------------------------


def test_a_mapped_answer_is_the_answer_every_reward_sees(tmp_path: Path) -> None:
    rows = [{"prompt": "3+4=", "answer": "raw", "solution": "7"}]
    path = _jsonl(tmp_path / "data.jsonl", rows)
    cfg = compose(["task=dataset", f"task.path={path}", "task.columns.answer=solution", *FIT])
    ((_, example),) = list(iter_examples(cfg))
    assert example.answer == "7"
    assert per_sample_kwargs(example, "7")["answer"] == "7"
    assert batched_kwargs([example], ["7"])["answer"] == ["7"]
    # unmapped, a batched reward gets the data's own column, as TRL gives it
    cfg = compose(["task=dataset", f"task.path={path}", *FIT])
    ((_, example),) = list(iter_examples(cfg))
    assert batched_kwargs([example], ["7"])["answer"] == ["raw"]


# ---- column settings the data does not read ---------------------------------------------


def test_column_settings_the_format_does_not_read_are_warned(tmp_path: Path) -> None:
    conversation = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "ba"}]
    talk = _jsonl(tmp_path / "talk.jsonl", [{"messages": conversation}])
    found = _world(
        "task=dataset",
        f"task.path={talk}",
        "task.columns.prompt=question",
        "task.columns.answer=solution",
        *FIT,
    )
    (prompt,) = found["task.columns.prompt"]
    (answer,) = found["task.columns.answer"]
    assert prompt.severity == answer.severity == Severity.warning
    assert "the rows are whole conversations ('messages')" in prompt.reason
    assert "their columns are messages" in prompt.reason
    assert prompt.fix.overrides() == ["task.columns.prompt=prompt"]
    assert answer.fix.overrides() == ["task.columns.answer=null"]
    plain = _jsonl(tmp_path / "plain.jsonl", [{"prompt": "ab=", "completion": "ba"}])
    found = _world("task=dataset", f"task.path={plain}", "task.columns.messages=chat", *FIT)
    (messages,) = found["task.columns.messages"]
    assert messages.severity == Severity.warning
    assert _world("task=dataset", f"task.path={plain}", *messages.fix.overrides(), *FIT) == {}


def test_a_missing_prompt_and_a_missing_answer_are_one_report(cli: Any, tmp_path: Path) -> None:
    _jsonl(tmp_path / "qa.jsonl", [{"question": "ab=", "solution": "ba"}])
    proc = cli("task=dataset", "task.path=qa.jsonl", "algorithm=sft", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode != 0
    assert "nor a 'messages' column (task.columns.messages), nor an answer column" in out
    fixes = ["task.columns.prompt=question", "task.columns.answer=solution"]
    assert f"fix: {' '.join(fixes)}" in out
    fixed = cli("task=dataset", "task.path=qa.jsonl", "algorithm=sft", *fixes, "dry_run=true")
    assert fixed.returncode == 0, output_of(fixed)


# ---- TRL data under task=jsonl ----------------------------------------------------------


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "ab=", "completion": "ba"},
        {"messages": [{"role": "user", "content": "ab="}, {"role": "assistant", "content": "ba"}]},
    ],
    ids=["prompt-completion", "messages"],
)
def test_trl_data_under_task_jsonl_is_told_task_dataset(
    cli: Any, tmp_path: Path, row: dict[str, Any]
) -> None:
    _jsonl(tmp_path / "trl.jsonl", [row])
    proc = cli("task=jsonl", "task.path=trl.jsonl", "algorithm=sft", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode != 0
    assert "task = jsonl" in out and "which task=dataset reads" in out
    assert "fix: task=dataset task.path=trl.jsonl" in out
    if "completion" in row:  # the fix, applied (a conversation also needs a chat template)
        fixed = cli("task=dataset", "task.path=trl.jsonl", "algorithm=sft", "dry_run=true")
        assert fixed.returncode == 0, output_of(fixed)


def test_prompt_completion_under_task_jsonl_that_runs_is_warned(rewards_module: Path) -> None:
    """Nothing needs the answer, so it runs; but the completion is only a column."""
    path = _jsonl(rewards_module / "trl.jsonl", [{"prompt": "ab=", "completion": "ba"}])
    found = _world(
        "task=jsonl", f"task.path={path}", "task.reward._target_=my_objects.MarkedBatched", *FIT
    )
    (problem,) = found["task"]
    assert problem.severity == Severity.warning
    assert "prompt-completion format" in problem.reason
    assert problem.fix.overrides() == ["task=dataset", f"task.path={path}"]


# ---- rewards that apply to nothing ------------------------------------------------------


def test_rewards_that_all_return_none_are_warned_at_the_pre_flight(
    rewards_module: Path, tmp_path: Path
) -> None:
    found = _world("task.reward._target_=my_objects.not_applicable")
    (problem,) = found["task.reward._target_"]
    assert problem.severity == Severity.warning
    assert "returned None for 4 of them" in problem.reason


def test_a_reward_that_applies_beside_one_that_does_not_is_fine(rewards_module: Path) -> None:
    rewards = (
        "task.rewards=[{_target_: my_objects.not_applicable},"
        " {_target_: art_hydra.tasks.rewards.char_overlap}]"
    )
    assert _world(rewards) == {}


# ---- a generator that fails on task.params ----------------------------------------------


def test_a_generator_failing_on_a_param_names_the_param(cli: Any) -> None:
    proc = cli("task.params.alphabet=''", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode != 0
    assert "task.params.alphabet = ''" in out
    assert "with its default alphabet='abcdefgh' instead of task.params.alphabet=''" in out
    assert "fix: task.params.alphabet=abcdefgh" in out
    assert "fix the generator" not in out
    fixed = cli("task.params.alphabet=abcdefgh", "dry_run=true")
    assert fixed.returncode == 0, output_of(fixed)


def test_a_generator_failing_on_its_defaults_is_blamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_gen.py").write_text(
        "def broken(rng, num_examples, size=3):\n    raise RuntimeError('bug')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for params in ([], ["+task.params.size=5"]):
        found = _world("task=digit_sum", "task.generator=my_gen.broken", *params)
        (problem,) = found["task.generator"]
        assert "raised RuntimeError: bug (" in problem.reason
        assert "my_gen.py:2, in broken)" in problem.reason
        assert problem.fix.note == "fix the generator"
