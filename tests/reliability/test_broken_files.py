"""Torn and broken files on disk: a torn metrics line is dropped on resume, a checkpoint
that fails its checksums is skipped for the newest intact one, checkpoints are ordered
by step number, and a half-finished deletion never counts as a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, run_cli
from test_interrupts import FAULT

from art_hydra.runs.run_folder import checkpoint_folders, latest_intact, write_manifest

pytestmark = pytest.mark.slow

SHORT = [*FAULT, "trainer.max_steps=6", "checkpoint.every_steps=2", "checkpoint.keep_last=3"]


def _finished(tmp_path: Path) -> Path:
    proc = run_cli(*SHORT, "hydra.run.dir=run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "run"


def _resume(tmp_path: Path) -> str:
    proc = run_cli(*SHORT, "trainer.max_steps=8", "resume=true", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.returncode == 0, output_of(proc)
    return output_of(proc)


def test_a_torn_last_metrics_line_is_dropped_on_resume(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 7, "loss": 0.1')  # a write cut off by a full disk or a kill
    out = _resume(tmp_path)
    assert "metrics.jsonl:7: dropped a torn line" in out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))


def test_a_flipped_byte_is_caught_and_the_previous_checkpoint_used(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    newest = run / "checkpoints" / "step-000006" / "model.safetensors"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    out = _resume(tmp_path)
    assert f"{newest} does not match its checksum" in out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))  # steps 5 and 6 trained again


def test_a_truncated_checkpoint_file_is_named(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    state = run / "checkpoints" / "step-000006" / "trainer_state" / "trainer.safetensors"
    state.write_bytes(state.read_bytes()[:100])
    path, skipped = latest_intact(run / "checkpoints")
    assert path is not None and path.name == "step-000004"
    assert skipped == [f"{state} does not match its checksum (corrupted or truncated)"]


def test_checkpoints_are_ordered_by_step_and_half_deletions_do_not_count(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for name in ("step-999999", "step-1000000", "step-000002"):
        (root / name).mkdir(parents=True)
        (root / name / "weights").write_text(name)
        write_manifest(root / name, int(name.split("-")[1]))
    (root / ".trash-step-000001-123").mkdir()  # a pruning killed half-way
    (root / "step-000003").mkdir()  # a folder without a manifest: never finished
    assert [p.name for p in checkpoint_folders(root)] == [
        "step-000002",
        "step-999999",
        "step-1000000",
    ]
