"""One report checks the world once per distinct environment (issue 39): a refused
single run's fixes (``trainer.gradient_accumulation_steps=1 ...``) leave the data, the
model and the devices as they were, so the CLI's report reuses the environment's verdict
for them instead of streaming the data again; a fix that changes a section the checks
read is checked afresh, and the report is the same as without reuse."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.types import RunMode

from art_hydra.config.composition import compose_and_check, make_loader, revealed_by_fixes
from art_hydra.preflight import add_world_problems, runner

pytestmark = pytest.mark.fast


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = runner.environment_problems

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "environment_problems", counted)
    return calls


def _report(overrides: list[str], reuse: dict | None) -> tuple[list, list]:
    loader = make_loader()
    result = compose_and_check(loader, "config", overrides, RunMode.RUN)

    def world(composed: object) -> None:
        add_world_problems(composed, reuse=reuse)  # type: ignore[arg-type]

    world(result)
    return result.problems, revealed_by_fixes(result, loader, "config", overrides, world)


def test_a_refused_runs_fixes_reuse_the_worlds_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = ["trainer.gradient_accumulation_steps=2"]
    calls = _counted(monkeypatch)
    reused = _report(overrides, {})
    assert len(calls) == 1
    fresh = _report(overrides, None)
    assert len(calls) == 1 + 2
    assert reused == fresh and reused[0][0].is_error


def test_a_fix_that_changes_what_the_world_reads_is_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "ab=", "answer": "ba"}\n' * 40)
    overrides = ["task=jsonl", f"task.path={data}", "rl.max_prompt_length=-1"]
    calls = _counted(monkeypatch)
    reused = _report(overrides, {})
    assert len(calls) == 2  # the fix sets rl.max_prompt_length: rl is read by the task check
    assert reused == _report(overrides, None)
