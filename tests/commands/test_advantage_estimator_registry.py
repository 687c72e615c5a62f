"""Advantage estimators come from a registry: a user's launcher script that imports its
own module (one decorated function) trains with ``rl.advantage_estimator=<that name>``,
and the advantages its run records are that function's; the default stays GRPO's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import output_of, report_entries
from plugin_packages import run_launcher

from art_hydra.config.advantage_estimators import advantage_estimators
from art_hydra.config.fields import default
from art_hydra.engine.rl.advantages import group_advantages

ROOT = Path(__file__).resolve().parents[2]

#: The user's module: RLOO's leave-one-out baseline, one function, one decorator.
USER_ESTIMATOR = '''
from art_hydra.engine.rl.advantages import register_advantage_estimator


@register_advantage_estimator("acme_leave_one_out")
def leave_one_out(group, scale, eps):
    """RLOO: each reward minus the mean of the others in its group."""
    n = len(group)
    return [r - (sum(group) - r) / (n - 1) for r in group]
'''


def _launch(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The user's launcher: import the module that registers, then art_hydra's own CLI."""
    return run_launcher(tmp_path, "acme_advantages", USER_ESTIMATOR, *overrides)


@pytest.mark.slow
def test_a_launcher_script_trains_with_the_estimator_its_module_registers(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    proc = _launch(
        tmp_path,
        "rl.advantage_estimator=acme_leave_one_out",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=8",
        "checkpoint.every_steps=0",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        "logging.plot=false",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, output_of(proc)
    lines = [json.loads(x) for x in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for group in (g for line in lines for g in line["samples"]):
        rewards = [c["reward"] for c in group["completions"]]
        n = len(rewards)
        expected = [r - (sum(rewards) - r) / (n - 1) for r in rewards]  # unscaled: RLOO's
        assert [c["advantage"] for c in group["completions"]] == pytest.approx(expected)


def test_the_launcher_s_estimator_is_known_to_validation(tmp_path: Path) -> None:
    ok = _launch(tmp_path, "rl.advantage_estimator=acme_leave_one_out", "dry_run=true")
    assert ok.returncode == 0, output_of(ok)
    bad = _launch(tmp_path, "rl.advantage_estimator=acme_leave_one_ot", "dry_run=true")
    assert bad.returncode == 1
    entries = report_entries(output_of(bad))
    fixed = "rl.advantage_estimator=acme_leave_one_out"
    assert ("rl.advantage_estimator", "acme_leave_one_ot", fixed) in entries


def test_the_default_is_grpo_s_group_relative_estimator() -> None:
    assert default("rl.advantage_estimator") == "group_relative"
    assert next(iter(advantage_estimators())) == "group_relative"
    rewards = [1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2]
    advantages, zero = group_advantages(rewards, group_size=4, scale=True)
    named, _ = group_advantages(rewards, group_size=4, scale=True, estimator="group_relative")
    assert advantages == named and zero == [False, True]
    assert advantages[4:] == [0.0] * 4  # a group without spread: exactly 0
    row = next(
        line
        for line in (ROOT / "docs" / "config-keys.md").read_text().splitlines()
        if line.startswith("| `rl.advantage_estimator` |")
    )
    assert "a registered advantage estimator (group_relative" in row
