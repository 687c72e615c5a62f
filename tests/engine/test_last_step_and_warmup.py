"""No silent settings at run time: the last step is always recorded, warmup works with
every schedule (constant included), and the run says at start what it trains."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import output_of

from art_hydra import compose
from art_hydra.engine.metrics import read_metrics
from art_hydra.engine.trainer import build_optimizer, scheduler_name

SHORT = [
    "trainer.max_steps=3",
    "trainer.per_device_train_batch_size=16",
    "logging.progress_bar=off",
    "hydra.run.dir=run",
]
PARAMETERS = re.compile(r"(\d[\d,]*) trainable of (\d[\d,]*) parameters")


def _lrs(overrides: list[str], steps: int) -> list[float]:
    """The learning rate of each step, from the run's own optimizer builder."""
    trainer_cfg = compose(overrides).trainer
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = build_optimizer(model, trainer_cfg)
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


def test_warmup_works_under_a_constant_schedule() -> None:
    base = ["trainer.lr_scheduler_type=constant", "trainer.learning_rate=1e-3"]
    assert _lrs([*base, "trainer.warmup_steps=2"], 4) == pytest.approx([0, 5e-4, 1e-3, 1e-3])
    assert _lrs(base, 3) == [1e-3] * 3  # no warmup: the schedule runs as it always did


@pytest.mark.parametrize("kind", ["constant_with_warmup", "linear", "cosine"])
def test_every_other_schedule_keeps_its_name(kind: str) -> None:
    assert scheduler_name(kind, 5) == kind and scheduler_name(kind, 0) == kind
    assert scheduler_name("constant", 0) == "constant"


def _logged_steps(run: Path) -> list[int]:
    return [m["step"] for m in read_metrics(run)]


@pytest.mark.slow
def test_a_last_step_between_multiples_is_recorded_and_warmup_applies(cli, tmp_path: Path) -> None:
    proc = cli(
        *SHORT,
        "logging.every_steps=2",
        "trainer.lr_scheduler_type=constant",
        "trainer.warmup_steps=2",
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    run = tmp_path / "run"
    assert _logged_steps(run) == [2, 3]
    # Step 2 trains at half the rate (warmup), step 3 at the full rate (constant after it).
    rates = [m["learning_rate"] for m in read_metrics(run)]
    assert rates == pytest.approx([5e-4, 1e-3])
    # The start-up line: every weight of the tiny model trains (finetune=full).
    log = (run / "art_hydra.log").read_text()
    trainable, total = PARAMETERS.search(log).groups()  # type: ignore[union-attr]
    assert trainable == total and int(total.replace(",", "")) > 0
    assert PARAMETERS.search(out)


@pytest.mark.slow
def test_a_run_shorter_than_the_logging_interval_records_its_last_step(cli, tmp_path: Path) -> None:
    proc = cli(*SHORT, "logging.every_steps=10", "model.finetune=lora")
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "logging.every_steps = 10" in out and "only the last step" in out  # the warning
    run = tmp_path / "run"
    assert _logged_steps(run) == [3]
    assert (run / "reward.png").is_file()
    # LoRA trains the adapters (and the tiny model's head), not every weight.
    trainable, total = PARAMETERS.search((run / "art_hydra.log").read_text()).groups()  # type: ignore[union-attr]
    assert 0 < int(trainable.replace(",", "")) < int(total.replace(",", ""))
