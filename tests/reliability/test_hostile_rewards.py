"""A reward is user code: it may hang, raise, or return something that is not a finite
number. Each stops the run with a message naming the reward, the prompt and the
completion, before any advantage is computed; a hang within ``timeouts.reward_s``,
the conversion of the value included (a ``__float__`` is user code too). The scorer is
tested directly on many values (fast), the run end to end on a few (slow)."""

from __future__ import annotations

import decimal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import output_of, run_cli
from conftest_model import QUICK

from art_hydra import compose, train
from art_hydra.errors import RewardError
from art_hydra.tasks.examples import Example
from art_hydra.tasks.scoring import score_batch

#: Each behaves on the world pre-flight's call (the answer as the completion) and
#: misbehaves on the model's completions: the run's own guard is what is tested here
#: (tests/reliability/test_reward_sets.py tests the pre-flight's).
REWARDS = """
import math, time
def nan(prompt, completion, answer): return 1.0 if completion == answer else math.nan
def inf(prompt, completion, answer): return 1.0 if completion == answer else -math.inf
def huge(prompt, completion, answer): return 1.0 if completion == answer else 1e300
def text(prompt, completion, answer): return 1.0 if completion == answer else "0.75"
def nothing(prompt, completion, answer): return 1.0 if completion == answer else None
def boom(prompt, completion, answer):
    if completion != answer:
        raise KeyError("no score for " + prompt)
    return 1.0
def hang(prompt, completion, answer):
    if completion != answer:
        time.sleep(3600)
    return 1.0
def slow_then_fine(prompt, completion, answer):
    time.sleep(0.5 * (completion != answer))
    return 1.0
class Stuck:
    def __float__(self):
        time.sleep(3600)
        return 1.0
def stuck_float(prompt, completion, answer): return 1.0 if completion == answer else Stuck()
def pair(prompt, completion, answer):
    import numpy
    return 1.0 if completion == answer else numpy.array([0.5, 0.5])
"""


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "hostile_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _reward(name: str) -> list[str]:
    return [
        *QUICK,
        "trainer.max_steps=1",
        "task.allowed_modules=[hostile_rewards]",
        f"task.reward._target_=hostile_rewards.{name}",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("nan", "returned nan, not a finite number"),
        ("inf", "returned -inf, not a finite number"),
        ("huge", "returned 1e+300, beyond what float32 can hold"),
        ("text", "returned '0.75' (str), not a number"),
        ("nothing", "returned None (NoneType), not a number"),
        ("boom", "raised KeyError"),
        ("pair", "returned an array of 2 values (ndarray), not one number"),
    ],
)
def test_bad_reward_values_are_named_before_any_advantage(
    hostile: Path, name: str, words: str
) -> None:
    with pytest.raises(RewardError) as info:
        train(compose(_reward(name)), run_dir=hostile / "run")
    message = str(info.value)
    assert f"the reward hostile_rewards.{name} {words}" in message
    assert "for prompt '" in message and "and completion '" in message


@pytest.mark.slow
def test_a_reward_that_raises_mid_run_shows_where_the_users_code_raised(hostile: Path) -> None:
    """The bug is in the user's reward: the message names its file and line (not a
    traceback on screen), and the run's log file keeps the traceback of their frames."""
    proc = run_cli(
        *_reward("boom"), "hydra.run.dir=run", cwd=hostile, env={"PYTHONPATH": str(hostile)}
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "the reward hostile_rewards.boom raised KeyError: 'no score for " in out
    assert "(hostile_rewards.py:10, in boom)" in out
    assert "Traceback" not in out
    log = (hostile / "run" / "art_hydra.log").read_text()
    assert "Traceback of the user's code (most recent call last):" in log
    assert 'hostile_rewards.py", line 10, in boom' in log
    assert 'raise KeyError("no score for " + prompt)' in log
    assert "art_hydra/tasks/scoring.py" not in log  # the user's frames, not the engine's


@pytest.mark.slow
def test_a_hanging_reward_stops_the_run_within_its_bound(hostile: Path) -> None:
    proc = run_cli(  # its 120 s timeout guards against a hang
        *_reward("hang"),
        "timeouts.reward_s=1",
        cwd=hostile,
        env={"PYTHONPATH": str(hostile)},
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert "did not finish scoring a batch of 16 completions within 1s" in out
    assert "timeouts.reward_s" in out and "hostile_rewards.hang" in out
    assert "Traceback" not in out


@pytest.mark.slow
def test_a_value_whose_conversion_hangs_stops_the_run_within_its_bound(hostile: Path) -> None:
    """The value is converted inside the bounded thread: a ``__float__`` that never
    returns is caught by ``timeouts.reward_s`` like a reward that never returns."""
    proc = run_cli(
        *_reward("stuck_float"),
        "timeouts.reward_s=1",
        cwd=hostile,
        env={"PYTHONPATH": str(hostile)},
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert "the reward hostile_rewards.stuck_float did not finish scoring" in out
    assert "within 1s (timeouts.reward_s); it was converting the value it returned for" in out
    assert "Traceback" not in out


@pytest.mark.slow
def test_a_slow_reward_is_not_blamed_on_the_queue(hostile: Path) -> None:
    """Scoring longer than queue.input_timeout_s is the producer's bounded work, not a
    stalled queue (once a healthy run was killed blaming the producer)."""
    summary = train(
        compose([*_reward("slow_then_fine"), "trainer.max_steps=2", "queue.input_timeout_s=0.2"]),
        run_dir=hostile / "run",
    )
    assert summary["steps"] == 2


# ---- the scorer on its own: every kind of value, no training --------------------------

PAIRS = [(Example("ab=", "ba"), "ba"), (Example("cd=", "dc"), "cx")]


class _Hangs:
    """A value whose ``__float__`` waits until the test releases it (a thread cannot be
    killed; released at teardown so the process does not wait for it at exit)."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def __float__(self) -> float:
        self.release.wait()
        return 0.0


class _Raises:
    def __float__(self) -> float:
        raise RuntimeError("no float here")


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def _score(value: object, timeout_s: float = 30) -> list[float]:
    def reward(prompt: str, completion: str, answer: str | None) -> object:
        return value

    return score_batch(reward, "my_rewards.score", PAIRS, timeout_s)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.float32(0.5), 0.5),
        (np.array([0.5]), 0.5),
        (np.array(0.25), 0.25),
        (np.int64(2), 2.0),
        (torch.tensor([0.5]), 0.5),
        (decimal.Decimal("0.5"), 0.5),
        (True, 1.0),
        (3, 3.0),
    ],
)
def test_scalars_and_one_value_arrays_are_accepted(value: object, expected: float) -> None:
    assert _score(value) == [expected, expected]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (np.array([0.5, 0.5]), "returned an array of 2 values (ndarray), not one number"),
        (torch.zeros(3), "returned an array of 3 values (Tensor), not one number"),
        ([0.5], "returned a list of 1 value, not a number"),
        (decimal.Decimal("sNaN"), "returned Decimal('sNaN') (Decimal), not a finite number"),
        (decimal.Decimal("NaN"), "returned Decimal('NaN') (Decimal), not a finite number"),
        (decimal.Decimal("-Infinity"), "returned Decimal('-Infinity') (Decimal), not a finite"),
        (decimal.Decimal("1e400"), "returned inf (Decimal('1E+400') (Decimal) as a float)"),
        pytest.param(10**400, "returned an integer of 1329 bits, beyond", id="10**400"),
        pytest.param(-(10**5000), "returned an integer of 16610 bits, beyond", id="-10**5000"),
        (np.float64("nan"), "returned nan, not a finite number"),
        (1 + 2j, "returned a value of type complex, not a number"),
        (object(), "returned a value of type object, not a number"),
        (_Raises(), "returned a value that raised RuntimeError: no float here"),
    ],
)
def test_every_bad_value_is_named_with_the_reward_and_the_completion(
    value: object, words: str
) -> None:
    with pytest.raises(RewardError) as info:
        _score(value)
    message = str(info.value)
    assert f"the reward my_rewards.score {words}" in message, message
    assert "for prompt 'ab=' and completion 'ba'" in message


def test_a_conversion_that_hangs_is_caught_by_the_bound(release: threading.Event) -> None:
    with pytest.raises(RewardError) as info:
        _score(_Hangs(release), timeout_s=0.5)
    assert "did not finish scoring a batch of 2 completions within 0.5s" in str(info.value)
    assert "it was converting the value it returned for prompt 'ab='" in str(info.value)
