"""The command's verdicts: working configs run, sweeps as plain Hydra reads them, every
class of problem (config and world) in one report before anything exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, report_entries

from art_hydra import compose
from art_hydra.runs.run_folder import write_manifest, write_run_config

HINT = "HYDRA_FULL_ERROR"


@pytest.mark.parametrize(
    "args",
    [
        ["trainer.max_steps=10"],
        ["trainer.max_steps=1"],
        ["algorithm=sft", "trainer.max_steps=20"],
        ["-m", "trainer.max_steps=5,10"],
        ["hydra.mode=MULTIRUN", "seed=1,2"],
    ],
    ids=lambda a: " ".join(a),
)
def test_working_configs_pass_the_dry_run(cli, tmp_path: Path, args: list[str]) -> None:
    proc = cli(*args, "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "dry run" in proc.stdout
    assert not (tmp_path / "outputs").exists()


def test_hydra_runtime_values_are_checked_per_sweep_point(cli, tmp_path: Path) -> None:
    proc = cli("-m", "trainer.gradient_accumulation_steps=${hydra:job.num}", "seed=1,2,3")
    out = output_of(proc)
    assert proc.returncode == 1
    assert "Pre-flight: 2 of 3 sweep point(s) cannot run." in out
    key = "trainer.gradient_accumulation_steps"
    assert [(k, v) for k, v, _ in report_entries(out)] == [(key, "0"), (key, "2")]
    assert "Point #1" not in out
    assert HINT not in out and "Traceback" not in out
    assert not (tmp_path / "outputs").exists()


def test_config_and_world_problems_share_one_report(cli, tmp_path: Path) -> None:
    proc = cli(
        "task=jsonl",
        f"task.path={tmp_path}/missing.jsonl",
        "rl.max_prompt_length=16",
        "rl.max_completion_length=16",
        "trainer.gradient_accumulation_steps=2",
        "task.reward._target_=art_hydra.tasks.rewards.nope",
        "dry_run=true",
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert "The configuration cannot run (3 problems)" in out
    entries = {key: (value, fix) for key, value, fix in report_entries(out)}
    assert entries.keys() == {
        "trainer.gradient_accumulation_steps",  # the config
        "task.reward._target_",  # the config, with the world's knowledge of rewards
        "task.path",  # the world
    }
    assert entries["task.path"][0] == f"{tmp_path}/missing.jsonl"
    # The nearest of art_hydra's own rewards (the user named one of art_hydra's).
    assert entries["task.reward._target_"][1].startswith(
        "task.reward._target_=art_hydra.tasks.rewards."
    )
    assert HINT not in out and "Traceback" not in out
    assert not (tmp_path / "outputs").exists()


def test_warnings_are_printed_and_the_run_goes_on(cli) -> None:
    proc = cli("trainer.warmup_steps=500", "dry_run=true")
    assert proc.returncode == 0
    assert "with 1 warning" in proc.stderr
    assert [(k, v) for k, v, _ in report_entries(proc.stderr)] == [("trainer.warmup_steps", "500")]
    assert cli("trainer.warmup_steps=500", "strict=true", "dry_run=true").returncode == 1


def _snapshot(folder: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in folder.rglob("*") if p.is_file()}


def test_a_refused_resume_changes_no_file(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    write_run_config(run, compose(["trainer.max_steps=4"]))
    state = run / "checkpoints" / "step-000004" / "trainer_state"
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"step": 4}))
    write_manifest(state.parent, 4)
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("original: true\n")
    before = _snapshot(run)
    proc = cli("resume=true", f"hydra.run.dir={run}", "rl.temperature=0.5", "seed=7")
    out = output_of(proc)
    assert proc.returncode == 1
    entries = {key: (value, fix) for key, value, fix in report_entries(out)}
    assert entries["rl.temperature"][0] == "0.5"
    assert entries["seed"][0] == "7" and entries["seed"][1].startswith("seed=42")
    assert _snapshot(run) == before
    again = cli(f"hydra.run.dir={run}", "trainer.max_steps=4")
    assert again.returncode == 1 and "already holds a run" in output_of(again)
    assert _snapshot(run) == before
