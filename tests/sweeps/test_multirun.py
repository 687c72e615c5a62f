"""--multirun: every point is checked in the parent before any job starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, report_entries

#: Jobs that really train, but only for a step.
ONE_STEP = [
    "trainer.max_steps=1",
    "checkpoint.every_steps=0",
    "trainer.per_device_train_batch_size=16",
    "logging.tensorboard=false",
    "logging.plot=false",
]


def _job_dirs(root: Path) -> list[Path]:
    return sorted(p.parent.parent for p in root.glob("outputs/multirun/*/*/*/.hydra/config.yaml"))


def test_preflight_rejects_and_launches_nothing(cli, tmp_path: Path) -> None:
    proc = cli(
        "-m",
        "trainer.gradient_accumulation_steps=1,2",
        "algorithm=rl,sft",
        "rl.num_generations=8,1",
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert "Pre-flight: 3 of 8 sweep point(s) cannot run." in out
    # Each invalid point is printed with its overrides and its problems.
    for index, point in [
        (1, "trainer.gradient_accumulation_steps=1 algorithm=rl rl.num_generations=1"),
        (4, "trainer.gradient_accumulation_steps=2 algorithm=rl rl.num_generations=8"),
        (5, "trainer.gradient_accumulation_steps=2 algorithm=rl rl.num_generations=1"),
    ]:
        assert f"Point #{index}: {point}" in out
    assert "Point #2:" not in out  # sft ignores rl.num_generations
    accumulation, generations = "trainer.gradient_accumulation_steps", "rl.num_generations"
    # Each distinct problem once, with the points it stops.
    assert [(k, v) for k, v, _ in report_entries(out)] == [(generations, "1"), (accumulation, "2")]
    assert "in 2 sweep point(s): #1, #5" in out and "in 2 sweep point(s): #4, #5" in out
    assert "No job was launched" in out and "hydra.sweeper.skip_invalid=true" in out
    assert "Traceback" not in out
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_skip_invalid_runs_valid_points_and_names_skipped(cli, tmp_path: Path) -> None:
    proc = cli(
        "-m",
        "trainer.gradient_accumulation_steps=1,2",
        "algorithm=rl,sft",
        "hydra.sweeper.skip_invalid=true",
        *ONE_STEP,
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "Point #2: trainer.gradient_accumulation_steps=2 algorithm=rl" in out
    assert "Skipping these 1 point(s); launching the 3 valid one(s)" in out
    jobs = _job_dirs(tmp_path)
    assert sorted(j.name for j in jobs) == ["0", "1", "3"]  # each job keeps its point's number
    launched = sorted((j / ".hydra" / "overrides.yaml").read_text() for j in jobs)
    assert not any("gradient_accumulation_steps=2\n- algorithm=rl" in t for t in launched)


def test_dry_run_preflights_whole_sweep_and_launches_nothing(cli, tmp_path: Path) -> None:
    proc = cli("-m", "trainer.learning_rate=1e-4,1e-3", "algorithm=rl,sft", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "pre-flight passed for 4 of 4 sweep point(s); nothing was launched" in out
    assert not (tmp_path / "outputs").exists()


def test_type_error_in_one_sweep_value_is_found_before_launch(cli, tmp_path: Path) -> None:
    proc = cli("-m", "trainer.learning_rate=1e-4,abc")
    out = output_of(proc)
    assert proc.returncode == 1
    assert "Point #1: trainer.learning_rate=abc" in out
    assert report_entries(out) == [
        ("trainer.learning_rate", "abc", "trainer.learning_rate=1e-05 (float)")
    ]
    assert not (tmp_path / "outputs").exists()


def test_bad_non_swept_override_is_reported_fully(cli, tmp_path: Path) -> None:
    proc = cli("-m", "algorithm=rl,sft", "trainer.max_stepz=3", "model=huge")
    out = output_of(proc)
    assert proc.returncode == 1
    entries = {key: (value, fix) for key, value, fix in report_entries(out)}
    assert entries["trainer.max_stepz"] == ("3", "trainer.max_steps=3 ~trainer.max_stepz")
    assert entries["model"][0] == "huge"
    assert not (tmp_path / "outputs").exists()


def test_sweeper_params_in_config_are_preflighted(cli, tmp_path: Path) -> None:
    experiments = tmp_path / "my_conf" / "experiment"
    experiments.mkdir(parents=True)
    (experiments / "accum_sweep.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n"
        "      trainer.gradient_accumulation_steps: 1,3\n"
    )
    proc = cli("-m", "--config-dir", str(tmp_path / "my_conf"), "experiment=accum_sweep")
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "Pre-flight: 1 of 2 sweep point(s) cannot run." in out
    assert "Point #1: trainer.gradient_accumulation_steps=3" in out
    # The same from the command line (a new key in a mapping needs '+').
    proc = cli("-m", "+hydra.sweeper.params={trainer.gradient_accumulation_steps: '1,3'}")
    assert "Point #1: trainer.gradient_accumulation_steps=3" in output_of(proc)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_valid_sweep_runs_every_job(cli, tmp_path: Path, launcher: str) -> None:
    proc = cli("-m", f"hydra/launcher={launcher}", "algorithm=rl,sft", "seed=1,2", *ONE_STEP)
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert len(_job_dirs(tmp_path)) == 4
    # One sweep folder: each worker reads the folder the master resolved (its
    # ${art_hydra.unique:} mark), never a mark of its own process.
    assert len({job.parent for job in _job_dirs(tmp_path)}) == 1


def test_joblib_preflight_rejects_before_workers_start(cli, tmp_path: Path) -> None:
    proc = cli(
        "-m", "hydra/launcher=joblib", "algorithm=rl,sft", "trainer.gradient_accumulation_steps=2"
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert "Point #0: algorithm=rl trainer.gradient_accumulation_steps=2" in out
    assert "Joblib" not in out
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_a_sweeper_without_a_preflight_gets_its_points_checked_by_the_launcher(
    cli, tmp_path: Path
) -> None:
    # Hydra's own basic sweeper checks nothing (like Optuna, which makes points as it
    # goes): the launcher refuses the invalid point before its job starts, records why in
    # its folder, and runs the valid one.
    proc = cli("-m", "hydra/sweeper=basic", "trainer.gradient_accumulation_steps=1,2", *ONE_STEP)
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "Point #1 was not launched (trainer.gradient_accumulation_steps = 2;" in out
    (sweep,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    record = json.loads((sweep / "1" / "result.json").read_text())
    assert record["status"] == "refused"
    assert "trainer.gradient_accumulation_steps" in record["reason"]
    assert not (sweep / "1" / ".hydra").exists()  # never launched
    assert (sweep / "0" / "metrics.jsonl").exists()
    assert "Traceback" not in out


def test_a_study_with_several_directions_is_refused_before_it_starts(cli, tmp_path: Path) -> None:
    proc = cli(
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.direction=[maximize,minimize]",
        "rl.temperature=interval(0.7,1.2)",
        f"hydra.sweep.dir={tmp_path / 'study'}",
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "each art_hydra job returns one objective" in out and "Traceback" not in out
    assert not (tmp_path / "study").exists()


def test_an_optuna_dry_run_checks_the_first_trials_and_writes_nothing(cli, tmp_path: Path) -> None:
    proc = cli(
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.direction=maximize",
        "dry_run=true",
        "trainer.gradient_accumulation_steps=choice(1,2)",
        f"hydra.sweep.dir={tmp_path / 'study'}",
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "1 of 2 combination(s) of the search space cannot run" in out
    assert "nothing was launched" in out and "Traceback" not in out
    assert not (tmp_path / "study").exists()
