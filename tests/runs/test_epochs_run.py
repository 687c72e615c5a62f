"""A run sized by ``trainer.num_train_epochs`` trains exactly the steps its data makes,
records them, says them at the start, and resumes exactly across an epoch boundary."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from conftest_model import QUICK

from art_hydra import compose, train
from art_hydra.config import run_files
from art_hydra.engine.metrics import read_metrics
from art_hydra.runs.checkpoint import Checkpointer

pytestmark = pytest.mark.slow

DETERMINISTIC = ("reward_mean", "reward_std", "loss", "grad_norm", "learning_rate", "entropy")


def _overrides(tmp_path: Path) -> list[str]:
    """10 prompts in a jsonl file, 2 prompt groups a step (5 steps an epoch): 1.5 epochs
    are 7.5 steps, rounded up to 8."""
    data = tmp_path / "reverse.jsonl"
    words = ["abc", "bca", "cab", "acb", "bac", "cba", "aab", "abb", "bba", "cca"]
    data.write_text(
        "".join(json.dumps({"prompt": f"{w}=", "answer": w[::-1]}) + "\n" for w in words)
    )
    return [
        *QUICK,
        "task=jsonl",
        f"task.path={data}",
        "task.reward._target_=art_hydra.tasks.rewards.char_overlap",
        "rl.max_prompt_length=8",
        "rl.max_completion_length=4",
        "trainer.max_steps=null",
        "trainer.num_train_epochs=1.5",
        "trainer.lr_scheduler_type=linear",
        "checkpoint.every_steps=3",
        "checkpoint.keep_last=5",
    ]


class _Interrupt(KeyboardInterrupt):
    """Ctrl-C, delivered right after the step-6 checkpoint (one step into epoch 2)."""


def test_an_epoch_sized_run_trains_its_count_and_resumes_exactly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    overrides = _overrides(tmp_path)
    whole = tmp_path / "whole"
    with caplog.at_level(logging.INFO, logger="art_hydra"):
        summary = train(compose(overrides), run_dir=whole).summary
    assert summary["steps"] == 8
    assert [m["step"] for m in read_metrics(whole)] == list(range(1, 9))
    saved = yaml.safe_load((whole / run_files.RUN_CONFIG).read_text())
    assert saved["trainer"]["max_steps"] == 8 and saved["trainer"]["num_train_epochs"] == 1.5
    assert json.loads((whole / run_files.RESULT).read_text())["max_steps"] == 8
    assert "; 8 steps = 1.6 epochs of 10 prompts" in caplog.text
    # Finished: resume=auto names the key that sized it, to train further.
    skipped = train(compose([*overrides, "resume=auto"]), run_dir=whole).summary
    assert skipped["skipped"] == "finished"
    assert "resume=true trainer.num_train_epochs=<more than 1.5>" in capsys.readouterr().out

    parts = tmp_path / "parts"
    real_save = Checkpointer.save

    def save_then_interrupt(self, step, *args, **kwargs):  # type: ignore[no-untyped-def]
        path = real_save(self, step, *args, **kwargs)
        if step == 6:
            raise _Interrupt
        return path

    monkeypatch.setattr(Checkpointer, "save", save_then_interrupt)
    with pytest.raises(_Interrupt):
        train(compose(overrides), run_dir=parts)
    monkeypatch.setattr(Checkpointer, "save", real_save)
    train(compose([*overrides, "resume=true"]), run_dir=parts)
    a, b = read_metrics(whole), read_metrics(parts)
    assert [m["step"] for m in b] == list(range(1, 9))
    for x, y in zip(a, b, strict=True):
        for key in DETERMINISTIC:
            assert x[key] == pytest.approx(y[key], rel=1e-6, abs=1e-9), (x["step"], key)
