"""Resume is the run the user asked for: an extended run follows the schedule of its new
length, a finished run says so, fewer steps than trained is refused, and a stop after
the last step is a finished run."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest_model import QUICK

from art_hydra import ConfigValidationError, compose, train
from art_hydra.config import run_files
from art_hydra.engine.metrics import read_metrics
from art_hydra.runs.checkpoint import Checkpointer

pytestmark = pytest.mark.slow

#: A schedule that reaches 0 at the last step: the saved rate of a finished run is 0.0.
LINEAR = [*QUICK, "trainer.lr_scheduler_type=linear", "trainer.learning_rate=1e-3"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-step linear-schedule run, trained once for the module (copied per test)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train(compose(LINEAR), run_dir=run)
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run, target, symlinks=True)
    return target


def _schedule(max_steps: int) -> list[float]:
    """The rate each step of a fresh ``max_steps``-step run trains at (transformers'
    own linear schedule, as the trainer builds it)."""
    from transformers import get_scheduler

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=1e-3)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=max_steps)
    rates = []
    for _ in range(max_steps):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


def test_an_extended_run_trains_every_new_step_at_the_rate_of_its_new_schedule(
    finished_run: Path, tmp_path: Path
) -> None:
    run = _copy(finished_run, tmp_path)
    train(compose([*LINEAR, "trainer.max_steps=7", "resume=true"]), run_dir=run)
    rows = read_metrics(run)
    assert [m["step"] for m in rows] == [1, 2, 3, 4, 5, 6, 7]
    expected = _schedule(7)
    for row in rows[4:]:
        assert row["learning_rate"] > 0, row
        assert row["learning_rate"] == pytest.approx(expected[row["step"] - 1], rel=1e-9)
    # The steps of the first run keep the rates of its own (4-step) schedule.
    first = _schedule(4)
    assert [m["learning_rate"] for m in rows[:4]] == pytest.approx(first, rel=1e-9)


def test_resuming_a_finished_run_says_so_and_trains_nothing(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(finished_run, tmp_path)
    before = (run / "metrics.jsonl").read_text()
    result = train(compose([*LINEAR, "resume=true"]), run_dir=run)
    out = capsys.readouterr().out
    assert "already finished (4 steps)" in out
    assert "resume=true trainer.max_steps=<more than 4>" in out
    assert result["skipped"] == "finished"
    assert (run / "metrics.jsonl").read_text() == before


def test_resuming_with_fewer_steps_than_trained_is_refused(
    finished_run: Path, tmp_path: Path
) -> None:
    run = _copy(finished_run, tmp_path)
    saved = (run / "run_config.yaml").read_text()
    with pytest.raises(ConfigValidationError, match="already trained 4 steps") as info:
        train(compose([*LINEAR, "trainer.max_steps=2", "resume=true"]), run_dir=run)
    assert "trainer.max_steps=4" in str(info.value)
    assert [p.key for p in info.value.problems] == ["trainer.max_steps"]
    assert (run / "run_config.yaml").read_text() == saved  # not rewritten


def test_a_stop_after_the_last_step_is_a_finished_run_with_its_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save = Checkpointer.save

    def save_then_signal(self, step, *args, **kwargs):  # type: ignore[no-untyped-def]
        path = real_save(self, step, *args, **kwargs)
        if step == 4:  # Ctrl-C once the last step is saved
            signal.raise_signal(signal.SIGINT)
        return path

    monkeypatch.setattr(Checkpointer, "save", save_then_signal)
    result = train(compose([*LINEAR, "logging.plot=true"]), run_dir=tmp_path)
    assert result["status"] == "done" and result["steps"] == 4
    assert (tmp_path / run_files.REWARD_PLOT).is_file()
