"""Rewards of a tool-using task, dry-run by the pre-flight as the run will call them: a
TRL reward taking ``environments`` (one made and reset per row) and conversational
``completions`` passes; one that reads completions as text, which the run never gives
it, is refused before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import output_of, run_cli

pytestmark = pytest.mark.fast

REWARDS = '''
def trl_shaped(completions, environments, **kwargs):
    """TRL's shape: the environments, and each completion as its messages."""
    assert all(c[-1]["role"] == "assistant" for c in completions)
    return [float(env.calls == 0) for env in environments]


def per_sample(completion, environment, completion_messages, answer):
    return float(completion == answer and environment.calls == 0 and bool(completion_messages))


def text_only(completions, **kwargs):
    return [float(c.strip() == "1") for c in completions]
'''


@pytest.mark.parametrize(
    ("reward", "refused"),
    [("trl_shaped", False), ("per_sample", False), ("text_only", True)],
)
def test_agent_rewards_are_dry_run_as_the_run_calls_them(
    tmp_path: Path, reward: str, refused: bool
) -> None:
    (tmp_path / "agent_rewards.py").write_text(REWARDS)
    proc = run_cli(
        "experiment=tool_use",
        f"task.reward._target_=agent_rewards.{reward}",
        "task.allowed_modules=[agent_rewards]",
        "dry_run=true",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    out = output_of(proc)
    assert "Traceback" not in out
    if refused:
        assert proc.returncode == 1 and "task.reward._target_" in out and "strip" in out, out
    else:
        assert proc.returncode == 0, out
