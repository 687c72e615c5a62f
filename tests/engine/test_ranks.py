"""The rank coordinator (art_hydra/engine/ranks.py): a single process's does nothing and calls
no collective; a process group's runs each agreement as one bounded collective, whose
failure names what the ranks were doing. The collectives here are stand-ins for the other
rank (tests/distributed/test_ranks_two_processes.py runs them on two real gloo ranks)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from art_hydra.engine import distributed
from art_hydra.engine.distributed import RankFailure, World
from art_hydra.engine.ranks import ProcessGroup, SingleProcess, coordinator_for

#: No model, no training: the coordinator's arithmetic and wiring only.
pytestmark = pytest.mark.fast

COLLECTIVES = ("all_sum", "all_max", "gather_objects", "barrier", "broadcast_object")


def _result(**stats: float) -> SimpleNamespace:
    return SimpleNamespace(
        info={"completions": 4.0}, loss_tokens=10, trained_tokens=20, stats=dict(stats)
    )


def _last(**extra: Any) -> dict[str, Any]:
    return {
        "reward_mean": 0.5,
        "reward_std": 0.5,
        "zero_std_groups": 1.0,
        "completion_length": 3.0,
        "loss": 2.0,
        "kl": 0.1,
        "entropy": 1.0,
        "clip_fraction": 0.0,
        "real_token_share": 0.5,
        "tokens_per_s": 10.0,
        "step_time_s": 2.0,
        **extra,
    }


class _Stop:
    def __init__(self, requested: bool) -> None:
        self.requested, self.agreed = requested, False


class _Producer:
    def __init__(self) -> None:
        self.asked = 0

    def state_dict(self) -> tuple[dict, dict]:
        self.asked += 1
        return {}, {"position": 3}


def test_a_world_of_one_gets_the_single_process_coordinator() -> None:
    assert isinstance(coordinator_for(World(), 60.0, 10.0, 30.0), SingleProcess)
    two = coordinator_for(World(rank=1, size=2), 60.0, 10.0, 30.0)
    assert isinstance(two, ProcessGroup) and not two.writes_records


def test_the_single_process_coordinator_returns_its_inputs_and_calls_no_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every method does nothing or hands back what it was given; any collective (or
    torch.distributed itself) would fail the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a single process called a collective")

    for name in COLLECTIVES:
        monkeypatch.setattr(distributed, name, refuse)
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed", None)
    ranks = SingleProcess(World())
    assert ranks.writes_records and ranks.keeps_last_step
    inputs = [SimpleNamespace(step_loss_tokens=7.0), SimpleNamespace(step_loss_tokens=7.0)]
    ranks.inputs_barrier("waiting")
    ranks.normalise(inputs)
    assert [i.step_loss_tokens for i in inputs] == [7.0, 7.0]
    last, stop = _last(), _Stop(requested=True)
    assert ranks.combine(_result(), last, stop) is last and last == _last()
    assert ranks.stopping(stop) and not ranks.stopping(_Stop(requested=False))
    producer = _Producer()
    assert ranks.gather_producer_states(producer) is None and producer.asked == 0
    ranks.checkpoint_barrier(3)


def _two_ranks(monkeypatch: pytest.MonkeyPatch, other: dict[str, Any]) -> list[tuple]:
    """Rank 0 of two, whose collectives add the other rank's ``other`` values; returns
    the calls made (name, values or timeout)."""
    calls: list[tuple] = []

    def all_sum(world: World, values: list[float]) -> list[float]:
        calls.append(("all_sum", list(values)))
        return [a + b for a, b in zip(values, other["sum"].pop(0), strict=True)]

    def all_max(world: World, values: list[float]) -> list[float]:
        calls.append(("all_max", list(values)))
        return [max(a, b) for a, b in zip(values, other["max"].pop(0), strict=True)]

    def barrier(world: World, timeout_s: float) -> None:
        calls.append(("barrier", timeout_s))

    def gather_objects(world: World, obj: Any) -> list[Any]:
        calls.append(("gather_objects", obj))
        return [obj, other["state"]]

    for name, fn in [
        ("all_sum", all_sum),
        ("all_max", all_max),
        ("barrier", barrier),
        ("gather_objects", gather_objects),
    ]:
        monkeypatch.setattr(distributed, name, fn)
    return calls


def test_the_process_group_normalises_combines_and_agrees_on_a_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other rank saw 6 completions of mean 1 and std 0 and a stop signal: the
    step's line is the two ranks' weighted means, and both stop at this step."""
    other_line = [6.0, 6.0, 6.0, 0.0, 6.0 * 5.0, 4.0, 30.0, 0.0, 30.0, 3.0, 40.0, 80.0, 1.0]
    other = {
        "sum": [[30.0], other_line, [6.0, 6.0, 6.0], [30.0, 30.0 * 0.2]],
        "max": [[0.9]],
        "state": ({}, {"position": 9}),
    }
    calls = _two_ranks(monkeypatch, other)
    ranks = ProcessGroup(World(rank=0, size=2), timeout_s=60.0, inputs_s=15.0, checkpoint_s=30.0)
    inputs = [SimpleNamespace(step_loss_tokens=10.0), SimpleNamespace(step_loss_tokens=10.0)]
    ranks.inputs_barrier("waiting for the other ranks' inputs of step 1")
    ranks.normalise(inputs)
    assert [i.step_loss_tokens for i in inputs] == [20.0, 20.0]  # (10 + 30) / 2 ranks
    last = _last(**{"reward/r/count": 4.0, "reward/r/mean": 0.5, "reward/r/std": 0.5})
    stop = _Stop(requested=False)
    assert not ranks.stopping(stop)
    line = ranks.combine(_result(ratio=0.5, ratio_max=0.7), last, stop)
    assert stop.agreed and ranks.stopping(stop)  # the other rank's signal stops this one
    assert line["reward_mean"] == pytest.approx((4 * 0.5 + 6 * 1.0) / 10)
    assert line["loss"] == pytest.approx((2.0 + 4.0) / 2)
    assert line["entropy"] == pytest.approx((10 * 1.0 + 30.0) / 40)
    assert line["tokens_per_s"] == pytest.approx((20 + 40) / 2.0)
    assert line["reward/r/count"] == 10.0 and line["reward/r/mean"] == pytest.approx(0.8)
    assert line["ratio"] == pytest.approx((10 * 0.5 + 30 * 0.2) / 40)
    assert line["ratio_max"] == 0.9
    assert last["loss"] == 2.0  # this rank's own line is left as it was
    producer = _Producer()
    assert ranks.gather_producer_states(producer) == [({}, {"position": 3}), other["state"]]
    ranks.checkpoint_barrier(4)
    barriers = [c[1] for c in calls if c[0] == "barrier"]
    assert barriers == [15.0 + 60.0, 30.0 + 60.0]  # each bounded as run.py bounded it


def test_a_failing_collective_names_what_the_ranks_were_doing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def dead(world: World, values: list[float]) -> list[float]:
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(distributed, "all_sum", dead)
    ranks = ProcessGroup(World(rank=0, size=2), timeout_s=45.0, inputs_s=1.0, checkpoint_s=1.0)
    with pytest.raises(RankFailure) as caught:
        ranks.normalise([SimpleNamespace(step_loss_tokens=1.0)])
    message = str(caught.value)
    assert message.startswith(
        "rank 0 stopped: counting the step's tokens failed (RuntimeError: Connection closed"
    )
    assert "distributed.timeout_s=45s" in message
