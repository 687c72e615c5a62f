"""A run piped into a file says what happened: the start summary and plain progress lines
on stdout, all of it and the result in art_hydra.log, grouped samples with their
reference, per-reward scores and advantages in completions.jsonl, and metric lines that
carry the wall clock and only their algorithm's keys."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from conftest import output_of

from art_hydra.config.objective import NOT_IN_SFT

pytestmark = pytest.mark.slow

SHORT = [
    "trainer.max_steps=3",
    "trainer.per_device_train_batch_size=16",
    "backend.cpu_threads=1",
    "checkpoint.every_steps=0",
    "logging.tensorboard=false",
    "logging.plot=false",
    "hydra.run.dir=run",
]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _utc(stamp: str) -> datetime:
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert when.utcoffset() is not None and when.utcoffset().total_seconds() == 0
    return when


def test_a_piped_rl_run_says_what_happened(cli, tmp_path: Path) -> None:
    proc = cli(*SHORT, "logging.progress_every_steps=1", "producer.log_completions=2")
    out = output_of(proc)
    assert proc.returncode == 0, out
    run = tmp_path / "run"
    summary = (
        "trainable of",
        "family llama",
        "device cpu, 1 torch thread(s)",
        "data: task reverse,",
        "batch: RL, 16 completions per optimizer step (2 prompt group(s) x 8 completions)",
        "row layout: packed: several sequences share each row",
    )
    progress = [f"progress: step {s}/3 | reward " for s in (1, 2, 3)]
    for text in (*summary, *progress):
        assert text in proc.stdout, (text, out)
    assert "%|" not in out  # no bar: stdout is no terminal
    log = (run / "art_hydra.log").read_text()
    for text in (*summary, *progress, "art_hydra: 3 steps, final reward", "result.json: done"):
        assert text in log, (text, log)
    assert "the CPU is already busy" not in log  # backend.cpu_threads is set

    metrics = _lines(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    times = [_utc(m["time"]) for m in metrics]
    assert times == sorted(times)
    assert metrics[-1].keys() >= NOT_IN_SFT

    lines = _lines(run / "completions.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3]
    _utc(lines[0]["time"])
    groups = lines[0]["samples"]
    assert len(groups) == 2
    for group in groups:
        assert set(group) == {"prompt", "reference", "completions"}
        assert group["reference"] == group["prompt"].removesuffix("=")[::-1]  # reverse task
        assert len(group["completions"]) == 8  # the whole group
        for completion in group["completions"]:
            assert set(completion) == {"text", "reward", "rewards", "advantage"}
            assert completion["rewards"] == {"char_overlap": completion["reward"]}
        advantages = [c["advantage"] for c in group["completions"]]
        assert sum(advantages) == pytest.approx(0.0, abs=1e-9)  # centred in its group


def test_an_sft_run_writes_samples_and_no_rl_keys(cli, tmp_path: Path) -> None:
    proc = cli("experiment=tiny_sft_reverse", *SHORT, "trainer.max_steps=2")
    out = output_of(proc)
    assert proc.returncode == 0, out
    run = tmp_path / "run"
    assert "batch: SFT," in proc.stdout and "progress: step 2/2 | loss " in proc.stdout
    for line in _lines(run / "metrics.jsonl"):
        assert not NOT_IN_SFT & line.keys(), line
        assert {"loss", "learning_rate", "entropy", "time"} <= line.keys()
    samples = _lines(run / "completions.jsonl")
    assert [s["step"] for s in samples] == [1, 2]
    rows = samples[0]["samples"]
    assert len(rows) == 2  # producer.log_completions' default
    for row in rows:
        assert set(row) == {"prompt", "reference"}
        assert row["reference"] == row["prompt"].removesuffix("=")[::-1]
    assert "art_hydra: 2 steps, final loss" in (run / "art_hydra.log").read_text()


def test_a_failed_run_leaves_its_error_in_the_log(cli, tmp_path: Path) -> None:
    proc = cli(*SHORT, "timeouts.rollout_s=0.001")
    assert proc.returncode == 1, output_of(proc)
    log = (tmp_path / "run" / "art_hydra.log").read_text()
    assert "row layout: " in log  # the summary came first
    assert "art_hydra: the run failed: sampling the generation batch did not finish" in log
    assert "result.json: failed" in log
