"""``rl.loss_aggregation`` (TRL's loss_type normalisations) in real training runs of the
tiny model: every value trains to finite losses, each changes the gradient, and a run
written before the key existed resumes as it trained (its default, ``dapo``, is the
normalisation art_hydra always used). Parity with TRL's own ``_compute_loss`` is in
``test_trl_parity.py``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest_model import QUICK
from safetensors.torch import load_file

from art_hydra import compose, train
from art_hydra.config.policy_losses import LOSS_AGGREGATIONS
from art_hydra.config.problems import ConfigValidationError
from art_hydra.engine.metrics import read_metrics

pytestmark = pytest.mark.slow

#: Two generation batches of two optimizer steps each, reused twice (the ratio moves off
#: 1, so clipping acts), with the KL term: every part the aggregation averages.
RUN = [
    *QUICK,
    "trainer.max_steps=4",
    "rl.steps_per_generation=2",
    "rl.num_iterations=2",
    "rl.beta=0.04",
]


def test_every_aggregation_trains_to_finite_losses(tmp_path: Path) -> None:
    first_steps = {}
    for aggregation in LOSS_AGGREGATIONS:
        run_dir = tmp_path / aggregation
        summary = train(compose([*RUN, f"rl.loss_aggregation={aggregation}"]), run_dir=run_dir)
        rows = read_metrics(run_dir)
        assert summary["steps"] == 4 and len(rows) == 4
        assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
        first_steps[aggregation] = rows[0]["grad_norm"]
    # The same samples (same seed), a different average: each value reaches the gradient.
    assert len(set(first_steps.values())) == len(LOSS_AGGREGATIONS), first_steps


def _strip_key(run_dir: Path) -> None:
    """Make ``run_dir`` look written before rl.loss_aggregation existed: its recorded
    configs lose the key (Hydra's own copy exists only under the CLI)."""
    for name in ("run_config.yaml", ".hydra/config.yaml"):
        path = run_dir / name
        if not path.exists() and name != "run_config.yaml":
            continue
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if not line.strip().startswith("loss_aggregation:")]
        assert len(kept) == len(lines) - 1, name
        path.write_text("".join(kept))


def test_a_run_from_before_the_key_resumes_as_it_trained(tmp_path: Path) -> None:
    """Stopped at step 2, its configs stripped of the key, resumed to 4: the legacy value
    fills it (no change recorded but the steps), a changed aggregation is refused, and
    the weights end bit for bit where one run of 4 steps with rl.loss_aggregation=dapo
    ends."""
    common = [
        *RUN,
        "rl.num_iterations=1",  # step 2 ends a generation batch
        "trainer.lr_scheduler_type=constant",
        "checkpoint.keep_last=5",
    ]
    train(compose([*common, "rl.loss_aggregation=dapo"]), run_dir=tmp_path / "whole")
    parts = tmp_path / "parts"
    train(compose([*common, "trainer.max_steps=2"]), run_dir=parts)
    _strip_key(parts)
    with pytest.raises(ConfigValidationError) as info:
        train(compose([*common, "rl.loss_aggregation=grpo", "resume=true"]), run_dir=parts)
    assert [p.key for p in info.value.problems] == ["rl.loss_aggregation"]
    train(compose([*common, "resume=true"]), run_dir=parts)
    (entry,) = [json.loads(line) for line in (parts / "resumes.jsonl").read_text().splitlines()]
    assert entry["from_step"] == 2 and entry["changed"] == {"trainer.max_steps": [2, 4]}
    final = "checkpoints/step-000004/model.safetensors"
    a, b = load_file(tmp_path / "whole" / final), load_file(parts / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [r["loss"] for r in read_metrics(parts)]
    assert losses == [r["loss"] for r in read_metrics(tmp_path / "whole")]
