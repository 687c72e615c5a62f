"""The SLURM launcher preset: a sweep sends each job as one multi-process job, each task
one rank. Tried here through its local twin (``hydra/launcher=slurm_local``, submitit's
local executor, CPU and gloo), with the pre-flight checking every point for the ranks
the launcher will start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import output_of, run_cli

QUIET = ["logging.progress_bar=off", "logging.tensorboard=false", "logging.plot=false"]


def _job_folders(root: Path) -> list[Path]:
    sweeps = sorted((root / "outputs" / "multirun").glob("*/*"))
    assert len(sweeps) == 1, sweeps
    return sorted(p for p in sweeps[0].iterdir() if p.is_dir() and p.name.isdigit())


@pytest.mark.dist
def test_a_local_slurm_sweep_runs_each_job_on_two_ranks(tmp_path: Path) -> None:
    proc = run_cli(
        "-m",
        "hydra/launcher=slurm_local",
        "trainer.per_device_train_batch_size=32",
        "trainer.max_steps=3",
        "seed=1,2",
        *QUIET,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, output_of(proc)
    jobs = _job_folders(tmp_path)
    assert [j.name for j in jobs] == ["0", "1"]
    first_rewards = []
    for job in jobs:
        states = [json.loads((job / ".ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert [s["state"] for s in states] == ["done", "done"]
        assert states[0]["pid"] != states[1]["pid"]
        config = yaml.safe_load((job / "run_config.yaml").read_text())
        assert config["distributed"]["world_size"] == 2
        assert config["trainer"]["per_device_train_batch_size"] == 32
        lines = (job / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
        first_rewards.append(json.loads(lines[0])["reward_mean"])
        # Rank 0 alone writes the record; rank 1 logs to a file of its own.
        assert (job / "checkpoints" / "step-000003").is_dir()
        assert (job / "art_hydra_rank1.log").is_file()
    # Each job ran its own point (its own seed), not one shared stream.
    assert first_rewards[0] != first_rewards[1]


@pytest.mark.fast  # a refusal before any process starts
def test_the_sweep_preflight_counts_the_ranks_the_launcher_starts(tmp_path: Path) -> None:
    proc = run_cli(
        "-m",
        "hydra/launcher=slurm",
        "hydra.launcher.nodes=2",
        "hydra.launcher.tasks_per_node=4",
        "distributed.world_size=2",
        "seed=1,2",
        "dry_run=true",
        cwd=tmp_path,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "distributed.world_size = 2" in out
    assert "the launcher starts 8 ranks per job, not 2" in out
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out
    assert not (tmp_path / "outputs").exists()


@pytest.mark.fast  # a refusal before any process starts
def test_a_slurm_sweep_leaves_gpus_to_the_cluster_but_a_local_one_does_not(
    tmp_path: Path,
) -> None:
    """A SLURM sweep is sent from a login node, often without a GPU: the job checks its
    own devices. The local twin runs here, so a GPU this machine lacks is refused."""
    from art_hydra.preflight import cuda_present

    if cuda_present():
        pytest.skip("this machine has a GPU: both verdicts would be 'ok'")
    common = ["backend.device=cuda", "hydra.launcher.tasks_per_node=2", "dry_run=true"]
    slurm = run_cli("-m", "hydra/launcher=slurm", *common, cwd=tmp_path)
    assert slurm.returncode == 0, output_of(slurm)
    assert "pre-flight passed for 1 of 1 sweep point(s)" in slurm.stdout
    local = run_cli("-m", "hydra/launcher=slurm_local", *common, cwd=tmp_path)
    assert local.returncode == 1
    assert "backend.device = cuda" in output_of(local)


@pytest.mark.fast  # a refusal before any process starts
def test_an_uneven_point_is_refused_for_the_ranks_of_its_job(tmp_path: Path) -> None:
    proc = run_cli(
        "-m",
        "hydra/launcher=slurm_local",
        "trainer.per_device_train_batch_size=8,12",
        "dry_run=true",
        cwd=tmp_path,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "1 of 2 sweep point(s) cannot run" in out
    assert "each of the 2 ranks samples whole groups of 8" in out


DYING = """
import os
def die_on_rank1(prompt, completion, answer):
    # At a step (the model's completions), not in the pre-flight's call on each row's answer.
    if os.environ.get("RANK") == "1" and completion.strip() != (answer or "").strip():
        os._exit(3)
    return 0.5
"""


@pytest.mark.dist
def test_a_task_that_dies_is_reported_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "dying.py").write_text(DYING)
    proc = run_cli(
        "-m",
        "hydra/launcher=slurm_local",
        "trainer.per_device_train_batch_size=32",
        "trainer.max_steps=2",
        "task.allowed_modules=[dying]",
        "task.reward._target_=dying.die_on_rank1",
        "distributed.timeout_s=20",
        *QUIET,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
        timeout=300,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "A job of the sweep stopped" in out
    assert "(task: 1)" in out and "The task's process died" in out
    assert "Traceback" not in out
    # The surviving rank stopped on its own, naming the dead one.
    (job,) = _job_folders(tmp_path)
    rank0 = json.loads((job / ".ranks" / "rank0.json").read_text())["state"]
    assert rank0.startswith("failed: RankFailure") and "rank 1" in rank0
