"""The CLI rejects unworkable configs with one complete report, before anything exists."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import output_of


def test_founding_rule_rejected_before_run_dir(cli, tmp_path: Path) -> None:
    proc = cli("trainer.gradient_accumulation_steps=2")
    out = output_of(proc)
    assert proc.returncode == 1
    assert "trainer.gradient_accumulation_steps = 2" in out
    assert "waits for that input's optimizer-step result" in out
    assert "hang" in out
    # The fix keeps the effective batch: default tiny batch 128 x 2 = 256 in one step.
    assert (
        "fix: trainer.gradient_accumulation_steps=1 trainer.per_device_train_batch_size=256" in out
    )
    assert "Traceback" not in out
    assert not (tmp_path / "outputs").exists()


def test_sft_keeps_gradient_accumulation(cli, tmp_path: Path) -> None:
    proc = cli("algorithm=sft", "trainer.gradient_accumulation_steps=4", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "gradient_accumulation_steps: 4" in proc.stdout


def test_every_class_of_bad_input_in_one_report(cli, tmp_path: Path) -> None:
    proc = cli(
        "trainer.learning_rate=abc",  # type error in an override
        "+trainer.lerning_rate=1e-5",  # unknown key slipped in with '+'
        "trainer.max_stepz=10",  # unknown key without '+'
        "model.name=???",  # missing mandatory value
        "algorithm=foo",  # bad group choice
        "backend.name=tensorflow",  # not one of the enum's values
        "rl.num_generations=1",  # validator finding
        "trainer.gradient_accumulation_steps=2",  # the founding rule
        "bad override=1",  # not an override at all
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert "Traceback" not in out
    assert "The configuration cannot run (9 problems)" in out
    expected = [
        (
            "trainer.learning_rate = abc",
            "has the wrong type: expected float",
            "fix: trainer.learning_rate=1e-05 (float)",
        ),
        (
            "trainer.lerning_rate = 1e-05",
            "is not a key of TrainerConfig",
            "fix: trainer.learning_rate=1e-05",
        ),
        ("trainer.max_stepz = 10", "Did you mean trainer.max_steps", "fix: trainer.max_steps=10"),
        ("model.name = ???", "is mandatory and has no value", "fix: model.name=<value>"),
        ("algorithm = foo", "Available: rl, sft", "fix: algorithm="),
        ("backend.name = tensorflow", "expected one of torch, unsloth", "fix: backend.name="),
        ("rl.num_generations = 1", "must be at least 2", "fix: rl.num_generations=8"),
        (
            "trainer.gradient_accumulation_steps = 2",
            "would wait on each other forever",
            "fix: trainer.gradient_accumulation_steps=1",
        ),
        ("bad override=1", "is not a valid override", "fix: write key=value"),
    ]
    entries = re.split(r"\n  \d+\. ", out)
    for head, reason, fix in expected:
        matching = [e for e in entries if e.startswith(head)]
        assert len(matching) == 1, f"missing {head!r} in:\n{out}"
        body, _, fix_line = matching[0].partition("fix: ")
        assert reason in body, f"{head}: expected reason {reason!r} in {body!r}"
        assert ("fix: " + fix_line).startswith(fix), f"{head}: expected {fix!r}, got {fix_line!r}"
    assert not (tmp_path / "outputs").exists()


def test_full_error_env_shows_traceback(cli) -> None:
    proc = cli("trainer.gradient_accumulation_steps=2", env={"HYDRA_FULL_ERROR": "1"})
    out = output_of(proc)
    assert proc.returncode != 0
    assert "Traceback" in out and "ConfigValidationError" in out


def test_sweep_value_without_multirun_is_explained(cli) -> None:
    proc = cli("trainer.learning_rate=1e-4,1e-5")
    assert proc.returncode == 1
    assert "fix: art-hydra -m trainer.learning_rate=1e-4,1e-5" in output_of(proc)


def test_dry_run_prints_resolved_config_and_writes_nothing(cli, tmp_path: Path) -> None:
    proc = cli("dry_run=true", "trainer.max_steps=${checkpoint.every_steps}")
    assert proc.returncode == 0, output_of(proc)
    assert "max_steps: 50" in proc.stdout  # resolved interpolation
    assert "dry run: the configuration is valid" in proc.stdout
    assert "hydra:" not in proc.stdout
    assert not (tmp_path / "outputs").exists()


def test_python_m_matches_console_script(cli) -> None:
    proc = cli("rl.epsilon=1.5", module=True)
    assert proc.returncode == 1
    assert "rl.epsilon = 1.5" in output_of(proc)


def test_experiment_and_model_groups_from_cli(cli) -> None:
    proc = cli("experiment=llama_dapo_reverse", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "meta-llama/Llama-3.2-1B-Instruct" in proc.stdout
    assert "epsilon_high: 0.28" in proc.stdout


def test_extra_config_dir_is_honoured(cli, tmp_path: Path) -> None:
    extra = tmp_path / "my_conf" / "model"
    extra.mkdir(parents=True)
    (extra / "mine.yaml").write_text(
        "# @package _global_\nmodel:\n  name: /models/mine\n  max_seq_length: 8\n"
    )
    proc = cli("--config-dir", str(tmp_path / "my_conf"), "model=mine")
    out = output_of(proc)
    assert proc.returncode == 1
    assert "longer than model.max_seq_length=8" in out
