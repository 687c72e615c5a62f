"""A bound for each kind of work, each error naming what overran: sampling
(timeouts.rollout_s), an optimizer step (timeouts.step_s) and a checkpoint write
(timeouts.checkpoint_s); the reward's bound is in test_hostile_rewards. The bounds are
set below what the real work takes, so the work itself overruns them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest_model import QUICK

from art_hydra import compose, train
from art_hydra.errors import StallError
from art_hydra.runs.run_folder import checkpoint_folders

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("bound", "words"),
    [
        ("timeouts.rollout_s=1e-6", "sampling the generation batch did not finish within 1e-06s"),
        ("timeouts.step_s=1e-6", "optimizer step 1 did not finish within 1e-06s"),
        ("timeouts.checkpoint_s=1e-6", "writing checkpoint step-000001 did not finish within"),
    ],
)
def test_work_that_overruns_its_bound_is_named(tmp_path: Path, bound: str, words: str) -> None:
    cfg = compose([*QUICK, "trainer.max_steps=2", "checkpoint.every_steps=1", bound])
    with pytest.raises(StallError) as info:
        train(cfg, run_dir=tmp_path)
    message = str(info.value)
    assert words in message and bound.split("=")[0] in message
    assert not checkpoint_folders(tmp_path / "checkpoints") or "checkpoint" not in bound
