"""Evaluation while training, on the tiny model: eval/* metrics in the step's line,
eval_completions.jsonl, SFT's eval/loss, held-out prompts never trained on, and an
evaluation that changes nothing of the training (nor of a resumed run)."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import pytest
from conftest_model import QUICK

from art_hydra import compose, train
from art_hydra.config import run_files
from art_hydra.engine.metrics import read_metrics
from art_hydra.runs.checkpoint import Checkpointer

#: These tests train the tiny model.
pytestmark = pytest.mark.slow

DETERMINISTIC = ("reward_mean", "reward_std", "loss", "grad_norm", "learning_rate", "entropy")
EVAL = ["eval.fraction=0.125", "eval.every_steps=2", "eval.log_completions=3"]


def _same_training(a: list[dict], b: list[dict]) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for x, y in zip(a, b, strict=True):
        for key in DETERMINISTIC:
            if x[key] is not None:
                assert x[key] == pytest.approx(y[key], rel=1e-6, abs=1e-9), (x["step"], key)


def test_rl_evaluates_held_out_prompts_and_trains_as_without_evaluating(tmp_path: Path) -> None:
    run = tmp_path / "every2"
    summary = train(compose([*QUICK, *EVAL, "eval.num_samples=2"]), run_dir=run)
    rows = read_metrics(run)
    evaluated = [m for m in rows if "eval/reward" in m]
    assert [m["step"] for m in evaluated] == [2, 4]
    for m in evaluated:
        assert m["eval/examples"] == 8  # 0.125 of the 64 distinct prompts
        assert 0 <= m["eval/reward"] <= 1 and 0 <= m["eval/exact"] <= 1
        assert m["eval/reward_char_overlap"] == m["eval/reward"]  # the one reward
        assert math.isfinite(m["eval/sampled_reward"])
    assert summary["final"]["eval/reward"] == evaluated[-1]["eval/reward"]
    lines = [json.loads(x) for x in (run / run_files.EVAL_COMPLETIONS).read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4]
    sample = lines[0]["samples"][0]
    assert len(lines[0]["samples"]) == 3 and lines[0]["time"].endswith("Z")
    assert {"prompt", "reference", "completion", "reward", "rewards"} <= set(sample)
    # Evaluating every step or every other one trains the same steps: its sampling
    # draws from its own generator, and the process's random states are put back.
    at_end = tmp_path / "at_end"
    train(compose([*QUICK, "eval.fraction=0.125", "eval.every_steps=1"]), run_dir=at_end)
    _same_training(rows, read_metrics(at_end))
    assert sum("eval/reward" in m for m in read_metrics(at_end)) == 4


def test_held_out_prompts_never_reach_the_producer() -> None:
    from art_hydra.engine.recipe import build_run_parts

    cfg = compose([*QUICK, "eval.fraction=0.125"])
    parts = build_run_parts(cfg)
    held = {e.prompt for e in parts.eval_examples}
    assert len(held) == 8
    trained = {e.prompt for e in parts.producer.stream.examples}
    assert trained and not held & trained
    assert parts.eval_rewards == parts.producer.task.rewards  # scored as rollouts are


def test_eval_path_evaluates_a_file_and_trains_as_without_evaluation(tmp_path: Path) -> None:
    data = tmp_path / "eval.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{w}=", "answer": w[::-1]}) + "\n" for w in ("abc", "dda"))
    )
    plain, with_eval = tmp_path / "plain", tmp_path / "with_eval"
    train(compose([*QUICK, "trainer.max_steps=2"]), run_dir=plain)
    train(compose([*QUICK, "trainer.max_steps=2", f"eval.path={data}"]), run_dir=with_eval)
    rows = read_metrics(with_eval)
    _same_training(read_metrics(plain), rows)
    assert rows[-1]["eval/examples"] == 2 and "eval/reward" not in rows[0]


def test_sft_reports_the_loss_on_held_out_answers(tmp_path: Path) -> None:
    overrides = [*QUICK, "algorithm=sft", "trainer.max_steps=2", "eval.fraction=0.125"]
    summary = train(compose(overrides), run_dir=tmp_path)
    final = summary["final"]
    assert final["eval/loss"] > 0 and math.isfinite(final["eval/loss"])
    assert 0 <= final["eval/reward"] <= 1  # the task has a reward: greedy completions too


class _Interrupt(KeyboardInterrupt):
    """Ctrl-C, delivered right after a checkpoint is written."""


def test_a_run_that_evaluates_resumes_bit_exact(tmp_path: Path, monkeypatch) -> None:
    overrides = [*QUICK, *EVAL, "eval.num_samples=1", "checkpoint.every_steps=2"]
    whole = tmp_path / "whole"
    train(compose(overrides), run_dir=whole)
    parts = tmp_path / "parts"
    real_save = Checkpointer.save

    def save_then_interrupt(self, step, *args, **kwargs):  # type: ignore[no-untyped-def]
        path = real_save(self, step, *args, **kwargs)
        if step == 2:
            raise _Interrupt
        return path

    monkeypatch.setattr(Checkpointer, "save", save_then_interrupt)
    threads = threading.active_count()
    with pytest.raises(_Interrupt):
        train(compose(overrides), run_dir=parts)
    assert threading.active_count() == threads
    monkeypatch.setattr(Checkpointer, "save", real_save)
    train(compose([*overrides, "resume=true"]), run_dir=parts)
    a, b = read_metrics(whole), read_metrics(parts)
    _same_training(a, b)
    for x, y in zip(a, b, strict=True):
        assert {k: v for k, v in x.items() if k.startswith("eval/") and k != "eval/time_s"} == {
            k: v for k, v in y.items() if k.startswith("eval/") and k != "eval/time_s"
        }
    steps = [json.loads(x)["step"] for x in (parts / run_files.EVAL_COMPLETIONS).open()]
    assert steps == [2, 4]
