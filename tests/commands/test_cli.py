"""The CLI rejects unworkable configs with one complete report, before anything exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import output_of, problem_about

from art_hydra import ConfigValidationError, Kind, Severity, compose

#: One bad input of every class, with the Problem each one is: (key, kind, fix overrides).
EVERY_CLASS = {
    "trainer.learning_rate=abc": (
        "trainer.learning_rate",
        Kind.type,
        ["trainer.learning_rate=1e-05"],
    ),
    "+trainer.lerning_rate=1e-5": (
        "trainer.lerning_rate",
        Kind.unknown_key,
        ["trainer.learning_rate=1e-05"],
    ),
    "trainer.max_stepz=10": ("trainer.max_stepz", Kind.unknown_key, ["trainer.max_steps=10"]),
    "model.name=???": ("model.name", Kind.missing, ["model.name=<value>"]),
    "algorithm=foo": ("algorithm", Kind.group, ["algorithm=sft"]),
    "backend.name=tensorflow": ("backend.name", Kind.bound, ["backend.name=torch"]),
    "rl.num_generations=1": ("rl.num_generations", Kind.bound, ["rl.num_generations=8"]),
    "trainer.gradient_accumulation_steps=2": (
        "trainer.gradient_accumulation_steps",
        Kind.rule,
        ["trainer.gradient_accumulation_steps=1", "trainer.per_device_train_batch_size=256"],
    ),
    "bad override=1": ("bad override=1", Kind.override, []),
}


def test_founding_rule_rejected_before_run_dir(cli, tmp_path: Path) -> None:
    proc = cli("trainer.gradient_accumulation_steps=2")
    out = output_of(proc)
    assert proc.returncode == 1
    # The fix keeps the effective batch: default tiny batch 128 x 2 = 256 in one step.
    assert (
        "trainer.gradient_accumulation_steps = 2\n" in out
        and "fix: trainer.gradient_accumulation_steps=1 trainer.per_device_train_batch_size=256"
        in out
    )
    assert "Traceback" not in out
    assert not (tmp_path / "outputs").exists()


def test_every_class_of_bad_input_is_one_problem_with_its_fix() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(list(EVERY_CLASS))
    assert len(info.value.problems) == len(EVERY_CLASS)
    for key, kind, fix in EVERY_CLASS.values():
        problem = problem_about(info.value, key)
        assert (problem.kind, problem.severity) == (kind, Severity.error), key
        assert problem.fix.overrides() == fix, key


def test_sft_keeps_gradient_accumulation(cli, tmp_path: Path) -> None:
    proc = cli("algorithm=sft", "trainer.gradient_accumulation_steps=4", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "gradient_accumulation_steps: 4" in proc.stdout


def test_every_class_of_bad_input_in_one_report(cli, tmp_path: Path) -> None:
    """The report itself: one numbered entry per problem, each naming its key and with a
    fix line (what each problem is, test_every_class_of_bad_input_is_one_problem_with_its_fix
    checks on the Problems)."""
    proc = cli(*EVERY_CLASS)
    out = output_of(proc)
    assert proc.returncode == 1
    assert "Traceback" not in out
    assert "The configuration cannot run (9 problems)" in out
    entries = re.split(r"\n  \d+\. ", out)[1:]
    assert len(entries) == len(EVERY_CLASS), out
    for key, _, _ in EVERY_CLASS.values():
        head = key if key == "bad override=1" else f"{key} = "
        (entry,) = [e for e in entries if e.startswith(head)]
        assert "\n" in entry and "fix: " in entry, entry
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
    # Not in this machine's cache: HF_HUB_OFFLINE=0 lets the run download it (a warning).
    proc = cli("experiment=llama_dapo_reverse", "dry_run=true", env={"HF_HUB_OFFLINE": "0"})
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


def test_a_forked_command_reports_what_a_fresh_process_reports(cli) -> None:
    """Most tests run the CLI in a child forked from a per-worker zygote
    (tests/cli_zygote.py): it must answer as the console script started afresh does,
    and a variable one command is given must not reach the next one."""
    args = ("rl.epsilon=1.5", "trainer.learning_rate=abc", "logging.bogus=1")
    forked, fresh = cli(*args), cli(*args, fresh=True)
    assert forked.returncode == fresh.returncode == 1, output_of(forked)
    assert (forked.stdout, forked.stderr) == (fresh.stdout, fresh.stderr)
    project = ("dry_run=true", "logging.project=${oc.env:ART_HYDRA_TEST_NAME,unset}")
    given = cli(*project, env={"ART_HYDRA_TEST_NAME": "given"})
    assert given.returncode == 0 and "logging.project = given" in output_of(given), output_of(given)
    after = cli(*project)
    assert after.returncode == 0 and "logging.project = unset" in output_of(after), output_of(after)
