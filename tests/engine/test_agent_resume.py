"""A multi-turn agent run resumes bit-exactly (a whole run, trained in this process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_multi_turn import QUICK

from art_hydra.config.composition import compose

pytestmark = pytest.mark.slow


def turns_taken(completions: list, **kwargs: object) -> list[float]:
    """More turns, more reward: trajectories of a group differ, so every step trains."""
    return [float(len(c)) for c in completions]


@pytest.fixture
def every_turn_calls() -> Iterator[str]:
    """Every stopped turn calls ``lookup``: a random model rolls out several turns."""
    from art_hydra.engine.envs import parsers

    @parsers.register_tool_parser("test_resume_every_turn")
    def calls(text: str) -> parsers.ParsedTurn:
        return parsers.ParsedTurn(text, (parsers.ToolCall("lookup", {"key": "ab"}),))

    yield "test_resume_every_turn"
    parsers._PARSERS.pop("test_resume_every_turn")


def test_a_resumed_agent_run_continues_exactly(every_turn_calls: str, tmp_path: Path) -> None:
    """Multi-turn rollouts resume bit-exactly: the sampling stream, the data position and
    any mini-batch still to train (its masks with it) are in the checkpoint, and each
    rollout's environment is made afresh, so steps 3-4 after a resume at step 2 equal an
    uninterrupted run's."""
    from glob import glob

    import torch
    from safetensors.torch import load_file

    from art_hydra.run import train

    common = [
        *QUICK,
        f"task.tool_parser={every_turn_calls}",
        "task.reward._target_=test_agent_resume.turns_taken",  # rewards that differ
        "trainer.lr_scheduler_type=constant",
        "rl.steps_per_generation=2",  # a mini-batch left over at the checkpoint
        "checkpoint.every_steps=2",
        "trainer.max_steps=4",
        "logging.progress_bar=off",
    ]
    train(compose(common), run_dir=tmp_path / "whole")
    train(compose([*common, "trainer.max_steps=3"]), run_dir=tmp_path / "stopped")
    train(compose([*common, "resume=true"]), run_dir=tmp_path / "stopped")
    found = [
        load_file(glob(str(tmp_path / run / "checkpoints" / "step-000004" / "*.safetensors"))[0])
        for run in ("whole", "stopped")
    ]
    assert all(torch.equal(found[0][k], found[1][k]) for k in found[0])
    lines = [
        (tmp_path / run / "metrics.jsonl").read_text().splitlines()[-1]
        for run in ("whole", "stopped")
    ]
    whole, resumed = (json.loads(line) for line in lines)
    assert whole["loss"] == resumed["loss"] and whole["grad_norm"] == resumed["grad_norm"] > 0
