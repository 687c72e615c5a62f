"""A reward object and rewards that apply to nothing, in a real run on the tiny model:
the instance scores every step, and the run warns once of completions no reward applies
to (the pre-flight already said so), not at every step."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import output_of, run_cli

MODULE = """
from art_hydra import reward


@reward
class Never:
    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, completions, **kwargs):
        self.calls += 1
        return [None] * len(completions)


@reward
class Length:
    def __call__(self, prompt, completion, answer=None):
        return len(completion) / 8
"""

NONE_WARNING = "had no reward that applies (every reward returned None)"


def test_reward_objects_score_and_the_none_warning_comes_once(tmp_path: Path) -> None:
    (tmp_path / "objects.py").write_text(MODULE)
    proc = run_cli(
        "task.rewards=[{_target_: objects.Never}]",
        "trainer.max_steps=3",
        "trainer.per_device_train_batch_size=8",
        "logging.progress_bar=off",
        "logging.plot=false",
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "returned None for 4 of them" in out  # the pre-flight's warning
    log = (tmp_path / "run" / "art_hydra.log").read_text()
    assert log.count(NONE_WARNING) == 1, log
    proc = run_cli(
        "task.rewards=[{_target_: objects.Length, name: length}]",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=8",
        "logging.progress_bar=off",
        "logging.plot=false",
        "hydra.run.dir=run2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, output_of(proc)
    lines = (tmp_path / "run2" / "metrics.jsonl").read_text().splitlines()
    assert all("reward/length/mean" in json.loads(line) for line in lines)
