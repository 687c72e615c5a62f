"""The queue protocol: bounded waits, errors cross threads, nothing left running."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest_model import QUICK

from art_hydra import compose
from art_hydra.engine.queue import DeadlockError, StallError, StepChannel, StepWork, TrainerError
from art_hydra.run import run_validated


def _channel(timeout: float, train_fn: Callable, input_timeout: float | None = None) -> StepChannel:
    """A channel whose step and input waits are bounded by ``timeout`` seconds."""
    cfg = SimpleNamespace(input_timeout_s=input_timeout or timeout, maxsize=1)
    return StepChannel(cfg, train_fn, step_timeout_s=timeout)


def test_one_result_per_step_and_clean_close() -> None:
    channel = _channel(5, lambda item: item * 10)
    for step in range(1, 4):
        channel.put(step)
        assert channel.result(step) == step * 10
    channel.close()
    assert not channel.alive


def test_trainer_exception_reaches_producer_before_the_step_timeout() -> None:
    def explode(item: int) -> None:
        raise ValueError(f"bad input {item}")

    channel = _channel(30, explode)
    channel.put(7)
    # The error itself, not a StallError after the 30 s step timeout.
    with pytest.raises(TrainerError) as info:
        channel.result(1)
    assert "ValueError: bad input 7" in str(info.value)
    assert "in explode" in str(info.value)  # the trainer's traceback comes along
    channel.close()


def test_a_stuck_step_ends_in_a_stall_error_naming_both_sides() -> None:
    release = threading.Event()

    def stuck(item: int) -> int:  # a step that does not finish within the timeout
        release.wait(10)
        return item

    channel = _channel(0.3, stuck)
    channel.put(1)
    # Unbounded, the wait would end after 10 s with the result, not a StallError.
    with pytest.raises(StallError) as info:
        channel.result(1)
    assert not isinstance(info.value, DeadlockError)  # the trainer was busy, not waiting
    message = str(info.value)
    assert "step 1 did not finish within 0.3s (timeouts.step_s)" in message
    assert "the trainer is training on input #1" in message
    release.set()
    assert channel.close()


def test_a_producer_that_never_puts_ends_in_the_trainers_stall_error() -> None:
    channel = _channel(5, lambda item: item, input_timeout=0.2)
    time.sleep(0.5)  # the producer is busy elsewhere for longer than input_timeout_s
    with pytest.raises(StallError, match=r"the trainer waited 0.2s .* for input #1"):
        channel.put(1)
    assert channel.close()


def test_a_step_short_of_its_micro_batches_is_a_deadlock_at_once_naming_both_waits() -> None:
    """The founding deadlock: a trainer that takes two inputs per step (accumulation 2)
    handed a step of one, under the default 600 s timeouts."""

    def train(work: StepWork) -> int:
        work.require(micro_batches=2, step=1)
        return 1

    channel = _channel(600, train)
    channel.put(StepWork(["only micro-batch"]))
    # A DeadlockError (both sides would wait), not the StallError of the 600 s timeout.
    with pytest.raises(DeadlockError) as info:
        channel.result(1)
    message = str(info.value)
    assert "the producer waits for the result of step 1" in message
    assert "the trainer waits for input #2 of that step" in message
    assert "trainer.gradient_accumulation_steps" in message
    assert channel.close()


def test_a_result_never_asked_for_is_a_deadlock_at_once() -> None:
    """The producer waits for a result while nothing is queued or in flight."""
    channel = _channel(600, lambda work: work)
    channel.put(1)
    assert channel.result(1) == 1
    with pytest.raises(DeadlockError) as info:
        channel.result(2)
    message = str(info.value)
    assert "the producer waits for the result of step 2" in message
    assert "the trainer waits for input #2" in message and "no input is queued" in message
    assert channel.close()


def test_a_step_with_more_micro_batches_than_it_takes_is_refused() -> None:
    with pytest.raises(ValueError, match="holds 3 micro-batches; the trainer takes 2"):
        StepWork([1, 2, 3]).require(micro_batches=2, step=1)


def test_no_deadlock_when_the_producer_is_merely_slow() -> None:
    """The trainer waits for the next step's work while the producer is still making it."""
    channel = _channel(600, lambda work: sum(work.micro_batches))
    for step in (1, 2):
        time.sleep(0.2)  # the trainer now waits for the next input; the producer works
        channel.put(StepWork([step, step]))
        assert channel.result(step) == 2 * step
    assert channel.close()


def test_no_deadlock_when_the_trainer_is_merely_slow() -> None:
    channel = _channel(600, lambda item: time.sleep(0.2) or item)
    for step in (1, 2):
        channel.put(step)
        assert channel.result(step) == step  # waits while the trainer is busy
    assert channel.close()


def test_steps_through_a_queue_of_one_wait_for_room() -> None:
    """Two steps put back to back: the second waits for room, then both results come."""
    channel = _channel(600, lambda item: time.sleep(0.05) or item * 10)
    for step in range(1, 6):
        channel.put(2 * step - 1)
        channel.put(2 * step)
        assert channel.result(2 * step - 1) == (2 * step - 1) * 10
        assert channel.result(2 * step) == 2 * step * 10
    assert channel.close()


def test_the_warmup_pass_then_steps() -> None:
    """The warmup pass returns its own result whatever the step's size."""

    def train(work: StepWork) -> str:
        if work.warmup:
            return "warm"
        work.require(micro_batches=2, step=1)
        return "stepped"

    channel = _channel(600, train)
    channel.put(StepWork(["first"], warmup=True))
    assert channel.result(0) == "warm"
    channel.put(StepWork(["first", "second"]))
    assert channel.result(1) == "stepped"
    assert channel.close()


def test_the_deadlock_itself_ends_in_a_stall_error(tmp_path: Path) -> None:
    """RL with accumulation 2, validation bypassed: the seed's hang, under the default
    timeouts, ends as soon as both sides wait (model load included)."""
    cfg = compose(QUICK)
    assert cfg.timeouts.step_s == 1800 and cfg.queue.input_timeout_s == 600
    cfg.trainer.gradient_accumulation_steps = 2  # after validation: the validators would refuse
    before = threading.active_count()
    # A DeadlockError as soon as both sides wait, not a StallError after the timeouts.
    with pytest.raises(DeadlockError) as info:
        run_validated(cfg, run_dir=tmp_path)
    message = str(info.value)
    assert "the producer waits for the result of step" in message
    assert "the trainer waits for input #" in message
    assert threading.active_count() == before  # the trainer thread is gone


def test_producer_work_in_a_declared_phase_does_not_count_against_the_trainer() -> None:
    """A slow rollout, reward or checkpoint write is bounded by its own timeout, not by
    the trainer's wait for the next input (once blamed on the queue)."""
    channel = _channel(5, lambda item: item, input_timeout=0.2)
    channel.put(1)
    assert channel.result(1) == 1
    with channel.producer_phase("writing a checkpoint"):
        time.sleep(0.6)  # three times the trainer's input timeout
    channel.put(2)
    assert channel.result(2) == 2
    assert channel.close()


def test_the_producers_work_runs_on_the_trainers_thread() -> None:
    """One thread runs every torch op of a step (one OpenMP team on the CPU)."""
    threads: dict[str, int] = {}

    def train(item: int) -> int:
        threads["train"] = threading.get_ident()
        return item

    def make() -> int:
        threads["make"] = threading.get_ident()
        return 3

    channel = _channel(5, train)
    item = channel.run_on_trainer_thread(make, "making the inputs of step 1", 5)
    channel.put(item)
    assert channel.result(1) == 3
    assert threads["make"] == threads["train"] != threading.get_ident()
    channel.close()


def test_the_producers_work_raises_in_the_producer_and_the_channel_goes_on() -> None:
    def broken() -> int:
        raise KeyError("no such prompt")

    channel = _channel(5, lambda item: item)
    with pytest.raises(KeyError, match="no such prompt"):
        channel.run_on_trainer_thread(broken, "making the inputs of step 1", 5)
    channel.put(2)  # the trainer thread survived the producer's error
    assert channel.result(1) == 2
    channel.close()


def test_the_producers_work_is_bounded_and_does_not_count_against_the_trainer() -> None:
    """Work longer than the trainer's input wait is no stall of the trainer; work longer
    than its own bound is a StallError naming it."""
    channel = _channel(5, lambda item: item, input_timeout=0.2)
    assert channel.run_on_trainer_thread(lambda: time.sleep(0.5) or 4, "sampling", 5) == 4
    channel.put(4)
    assert channel.result(1) == 4
    release = threading.Event()
    # Unbounded, the work would end after 10 s and return False, not raise.
    with pytest.raises(StallError) as info:
        channel.run_on_trainer_thread(lambda: release.wait(10), "making the inputs of step 2", 0.3)
    assert "making the inputs of step 2 did not finish within 0.3s" in str(info.value)
    release.set()
    channel.close()
