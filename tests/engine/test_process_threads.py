"""A run sizes torch's threads for itself only: ``train(cfg)`` from Python leaves the
caller's thread count as it was (the count orders float sums, so a later run in the same
process would otherwise differ from the same run alone)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from art_hydra import compose, train

pytestmark = pytest.mark.slow


def test_a_run_with_its_own_thread_count_gives_the_callers_back(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    wanted = 1 if before > 1 else 2
    overrides = ["trainer.max_steps=1", f"backend.cpu_threads={wanted}", "logging.plot=false"]
    train(compose(overrides), run_dir=tmp_path / "run")
    assert torch.get_num_threads() == before
