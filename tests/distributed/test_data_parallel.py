"""Data-parallel training on 2 CPU ranks (gloo): the same step as one process on the
global batch, learning, exact resume, a dead rank named, and bad configs refused before
any process group forms."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ART_HYDRA, output_of, two_ranks_by_hand, wait_for_steps
from safetensors.torch import load_file

pytestmark = pytest.mark.dist

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
HERE = Path(__file__).resolve().parent
QUIET = ["logging.progress_bar=off", "logging.tensorboard=false", "logging.plot=false"]


def _torchrun(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_give_the_single_process_gradient(tmp_path: Path) -> None:
    script = str(HERE / "grad_check.py")
    # The tree under test stays first (a worktree's art_hydra, not the installed one).
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    single = subprocess.run(
        [sys.executable, script, str(tmp_path / "one.safetensors")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr
    ranks = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc_per_node=2", script, str(tmp_path / "two.safetensors")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ranks.returncode == 0, ranks.stderr
    one, two = load_file(tmp_path / "one.safetensors"), load_file(tmp_path / "two.safetensors")
    assert one.keys() == two.keys() and one
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    scale = max(one[k].abs().max().item() for k in one)
    assert worst <= 1e-6 * max(scale, 1.0), (worst, scale)


def test_the_default_task_learns_on_two_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = _torchrun(
        "-m",
        "art_hydra",
        "trainer.per_device_train_batch_size=64",
        "trainer.max_steps=200",
        "hydra.run.dir=run",
        *QUIET,
        "logging.report_to=[mlflow]",  # a tracker: rank 0 alone reports
        cwd=tmp_path,
    )
    assert proc.returncode == 0, output_of(proc)[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 201))  # rank 0 alone writes the record
    first = sum(r["reward_mean"] for r in rows[:5]) / 5
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    assert first < 0.3 and last > 0.8, (first, last)
    assert (tmp_path / "run" / "art_hydra_rank1.log").exists()
    # Rank 0 alone says what happened and reports to the trackers: one MLflow run.
    log = (tmp_path / "run" / "art_hydra.log").read_text()
    assert log.count("progress: step 200/200") == 1 and log.count("batch: RL,") == 1
    assert "progress:" not in (tmp_path / "run" / "art_hydra_rank1.log").read_text()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store
    from mlflow.tracking import MlflowClient

    store = tmp_path / "run" / "trackers" / "mlflow" / "mlruns"
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "reward_mean")
    assert sorted(m.step for m in history) == list(range(1, 201))
    statuses = sorted((tmp_path / "run" / ".ranks").glob("rank*.json"))
    assert [json.loads(p.read_text())["state"] for p in statuses] == ["done", "done"]


def test_a_two_rank_checkpoint_resumes_exactly_and_loads_alone(tmp_path: Path) -> None:
    common = [
        "-m",
        "art_hydra",
        "trainer.per_device_train_batch_size=32",
        "trainer.lr_scheduler_type=constant",
        "checkpoint.every_steps=3",
        *QUIET,
    ]
    whole = _torchrun(*common, "trainer.max_steps=8", "hydra.run.dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, output_of(whole)[-3000:]
    first = _torchrun(*common, "trainer.max_steps=3", "hydra.run.dir=parts", cwd=tmp_path)
    assert first.returncode == 0, output_of(first)[-3000:]
    second = _torchrun(
        *common, "trainer.max_steps=8", "resume=true", "hydra.run.dir=parts", cwd=tmp_path
    )
    assert second.returncode == 0, output_of(second)[-3000:]
    final = "checkpoints/step-000008/model.safetensors"
    a, b = load_file(tmp_path / "whole" / final), load_file(tmp_path / "parts" / final)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in _metrics(tmp_path / "whole")] == [
        r["loss"] for r in _metrics(tmp_path / "parts")
    ]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "parts" / "checkpoints" / "step-000008")
    assert model(torch.tensor([[1, 4, 5]])).logits.shape[-1] == model.config.vocab_size
    # Training on from it in one process would drop rank 1's sampler state: refused,
    # naming the launch that resumes it.
    alone = subprocess.run(
        [ART_HYDRA, *common[2:], "trainer.max_steps=10", "resume=true", "hydra.run.dir=parts"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = output_of(alone)
    assert alone.returncode == 1, out
    assert "distributed.world_size = 1" in out and "differs from the run's saved config" in out
    assert "resume with 2 rank(s), as the run was launched: torchrun --nproc_per_node=2" in out
    assert "Traceback" not in out


def _two_ranks(tmp_path: Path, *args: str) -> list[subprocess.Popen]:
    return two_ranks_by_hand(*QUIET, *args, cwd=tmp_path)


@pytest.mark.parametrize("both", [False, True], ids=["one rank signalled", "both, 50 ms apart"])
def test_a_stop_signal_stops_every_rank_at_the_same_step_with_a_checkpoint(
    tmp_path: Path, both: bool
) -> None:
    """SIGTERM (a preemption) reaching one rank, or the ranks at different moments: the
    ranks agree at the next step's combine, all stop after that step, and the checkpoint
    holds it; no rank takes a late signal for a second one."""
    from art_hydra.runs.run_folder import checkpoint_folders, verify

    procs = _two_ranks(
        tmp_path,
        "trainer.per_device_train_batch_size=32",
        "trainer.max_steps=5000",
        "checkpoint.every_steps=0",
        "hydra.run.dir=run",
    )
    wait_for_steps(tmp_path / "run", 3, procs[0])
    procs[0].send_signal(signal.SIGTERM)
    if both:
        time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], errs
    steps = len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    for err in errs:
        assert f"after step {steps} of 5000" in err and "Traceback" not in err, err
        assert "second interrupt" not in err
    assert "torchrun --nproc_per_node=2" in errs[0]
    if not both:
        assert "stopped by a stop signal on another rank" in errs[1]
    newest = checkpoint_folders(tmp_path / "run" / "checkpoints")[-1]
    assert newest.name == f"step-{steps:06d}" and verify(newest) is None


def test_a_killed_rank_stops_the_other_with_its_name_within_the_bound(tmp_path: Path) -> None:
    """Two ranks started by hand (no torchrun agent to clean up): rank 1 is killed, and
    rank 0 ends on its own, naming rank 1, well within distributed.timeout_s."""
    procs = _two_ranks(
        tmp_path,
        "trainer.per_device_train_batch_size=32",
        "trainer.max_steps=5000",
        "distributed.timeout_s=30",
        "hydra.run.dir=run",
    )
    wait_for_steps(tmp_path / "run", 3, procs[0])
    victim = json.loads((tmp_path / "run" / ".ranks" / "rank1.json").read_text())["pid"]
    os.kill(victim, signal.SIGKILL)
    _, err = procs[0].communicate(timeout=120)  # a hang guard, not a measure of speed
    procs[1].communicate()
    assert procs[0].returncode == 1
    assert "rank 0 stopped" in err and f"rank 1 (pid {victim}) died without a word" in err, err
    assert "Traceback" not in err


def test_an_unevenly_divisible_config_is_refused_before_any_process_group(tmp_path: Path) -> None:
    proc = _torchrun(
        "-m", "art_hydra", "trainer.per_device_train_batch_size=12", *QUIET, cwd=tmp_path
    )
    out = output_of(proc)
    assert proc.returncode != 0
    assert "each of the 2 ranks samples whole groups of 8" in out
    assert "art_hydra/" not in out  # no traceback of ours (torchrun prints its own summary)
    assert not (tmp_path / "outputs").exists()  # no run folder, no process group


def test_the_ranks_share_the_folder_rank_0_named(tmp_path: Path) -> None:
    """With the default run folder (a timestamp and each process's own mark) every rank
    would name another one; rank 0's reaches the others through Hydra's config, and no
    other folder is made."""
    proc = _torchrun(
        "-m",
        "art_hydra",
        "trainer.per_device_train_batch_size=64",
        "trainer.max_steps=2",
        "backend.cpu_threads=1",
        *QUIET,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, output_of(proc)[-3000:]
    folders = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(folders) == 1, folders
    run = folders[0]
    assert (run / "art_hydra.log").is_file() and (run / "art_hydra_rank1.log").is_file()
    assert [r["step"] for r in _metrics(run)] == [1, 2]
    assert sorted(p.name for p in (run / ".ranks").glob("rank*.json")) == [
        "rank0.json",
        "rank1.json",
    ]


def test_a_tool_using_agent_warm_starts_and_trains_on_two_ranks(tmp_path: Path) -> None:
    """Multi-turn tool rollouts on each rank (its own environments), the SFT warm start
    under DDP (a second wrapper over the same weights, then RL's) on every rank, and the
    agent metrics combined over the ranks."""
    proc = _torchrun(
        "-m",
        "art_hydra",
        "experiment=tool_use",
        "rl.sft_warm_start_steps=20",
        "trainer.per_device_train_batch_size=16",
        "trainer.max_steps=3",
        "checkpoint.every_steps=3",
        "hydra.run.dir=run",
        *QUIET,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, output_of(proc)[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(0 <= r["tool_calls_mean"] <= 2 and "turns_mean" in r for r in rows)
    for log in ("art_hydra.log", "art_hydra_rank1.log"):
        assert "SFT warm start done" in (tmp_path / "run" / log).read_text(), log
