"""The queue protocol: bounded waits, errors cross threads, nothing left running."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest_model import QUICK

from art_hydra import compose
from art_hydra.queue import StallError, StepChannel, TrainerError
from art_hydra.run import run_validated


def _queue_cfg(timeout: float) -> SimpleNamespace:
    return SimpleNamespace(result_timeout_s=timeout, input_timeout_s=timeout, maxsize=1)


def test_one_result_per_step_and_clean_close() -> None:
    channel = StepChannel(_queue_cfg(5), lambda item: item * 10)
    for step in range(1, 4):
        channel.put(step)
        assert channel.result(step) == step * 10
    channel.close()
    assert not channel.alive


def test_trainer_exception_reaches_producer_within_a_second() -> None:
    def explode(item: int) -> None:
        raise ValueError(f"bad input {item}")

    channel = StepChannel(_queue_cfg(30), explode)
    channel.put(7)
    started = time.monotonic()
    with pytest.raises(TrainerError) as info:
        channel.result(1)
    assert time.monotonic() - started < 1.0
    assert "ValueError: bad input 7" in str(info.value)
    assert "in explode" in str(info.value)  # the trainer's traceback comes along
    channel.close()


def test_stall_names_who_waits_for_what() -> None:
    channel = StepChannel(_queue_cfg(0.3), lambda item: None)  # never emits a result
    channel.put(1)
    started = time.monotonic()
    with pytest.raises(StallError) as info:
        channel.result(1)
    assert time.monotonic() - started < 2.0
    message = str(info.value)
    assert "waited 0.3s" in message and "result of step 1" in message
    assert "the trainer is waiting for input #2" in message or "trainer waited" in message
    channel.close()


def test_the_deadlock_itself_ends_in_a_stall_error(tmp_path: Path) -> None:
    """RL with accumulation 2, validation bypassed: the seed's hang, now bounded."""
    cfg = compose([*QUICK, "queue.result_timeout_s=2", "queue.input_timeout_s=2"])
    cfg.trainer.gradient_accumulation_steps = 2  # after validation: the validators would refuse
    before = threading.active_count()
    started = time.monotonic()
    with pytest.raises(StallError) as info:
        run_validated(cfg, run_dir=tmp_path)
    elapsed = time.monotonic() - started
    assert elapsed < 30, elapsed  # ends instead of hanging (model load included)
    message = str(info.value)
    assert "input #2" in message or "result of step 1" in message
    assert threading.active_count() == before  # the trainer thread is gone
