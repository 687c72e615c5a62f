"""A reward is user code: it may hang, raise, or return something that is not a finite
number. Each stops the run with a message naming the reward, the prompt and the
completion, before any advantage is computed; a hang within ``timeouts.reward_s``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import output_of, run_cli
from conftest_model import QUICK

from art_hydra import compose, train
from art_hydra.errors import RewardError

pytestmark = pytest.mark.slow

REWARDS = """
import math, time
def nan(prompt, completion, answer): return math.nan
def inf(prompt, completion, answer): return -math.inf
def huge(prompt, completion, answer): return 1e300
def text(prompt, completion, answer): return "0.75"
def nothing(prompt, completion, answer): return None
def boom(prompt, completion, answer): raise KeyError("no score for " + prompt)
def hang(prompt, completion, answer):
    time.sleep(3600)
    return 1.0
def slow_then_fine(prompt, completion, answer):
    time.sleep(0.5)
    return 1.0
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


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("nan", "returned nan, not a finite number"),
        ("inf", "returned -inf, not a finite number"),
        ("huge", "returned 1e+300, beyond what float32 can hold"),
        ("text", "returned '0.75' (str), not a number"),
        ("nothing", "returned None (NoneType), not a number"),
        ("boom", "raised KeyError"),
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


def test_a_hanging_reward_stops_the_run_within_its_bound(hostile: Path) -> None:
    started = time.monotonic()
    proc = run_cli(
        *_reward("hang"),
        "timeouts.reward_s=1",
        cwd=hostile,
        env={"PYTHONPATH": str(hostile)},
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert time.monotonic() - started < 30
    assert "did not finish scoring a batch of 16 completions within 1s" in out
    assert "timeouts.reward_s" in out and "hostile_rewards.hang" in out
    assert "Traceback" not in out


def test_a_slow_reward_is_not_blamed_on_the_queue(hostile: Path) -> None:
    """Scoring longer than queue.input_timeout_s is the producer's bounded work, not a
    stalled queue (once a healthy run was killed blaming the producer)."""
    summary = train(
        compose([*_reward("slow_then_fine"), "trainer.max_steps=2", "queue.input_timeout_s=0.2"]),
        run_dir=hostile / "run",
    )
    assert summary["steps"] == 2
