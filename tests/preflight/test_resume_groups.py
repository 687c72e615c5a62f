"""A resume that forgot a group the run chose (``task=dataset``) is told that choice, as one
pasteable fix read from the run's own record, not one fix per key the option sets."""

from __future__ import annotations

import shlex
from pathlib import Path

from art_hydra import compose
from art_hydra.preflight import world_problems
from art_hydra.runs import run_identity
from art_hydra.runs.run_folder import write_manifest, write_run_config
from tests.conftest import output_of

FITS = ["rl.max_prompt_length=16", "rl.max_completion_length=16"]


def _dataset_run(tmp_path: Path, record: str | None = None) -> tuple[Path, list[str]]:
    """A dataset run stopped at step 2, with Hydra's record of its command line."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "ab", "answer": "ba"}\n' * 4)
    run = tmp_path / "run"
    run.mkdir()
    given = ["task=dataset", f"task.path={data}", *FITS]
    write_run_config(run, compose(given))
    run_identity.record(compose(given), run)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    state = run / "checkpoints" / "step-000002" / "trainer_state"
    state.mkdir(parents=True)
    (state / "state.json").write_text("{}")
    write_manifest(state.parent, 2)
    (run / ".hydra").mkdir()
    text = "".join(f"- {o}\n" for o in given) if record is None else record
    (run / ".hydra" / "overrides.yaml").write_text(text)
    return run, given


def test_a_forgotten_group_is_one_fix_from_the_runs_record(tmp_path: Path) -> None:
    run, given = _dataset_run(tmp_path)
    problems = world_problems(compose(["resume=true", *FITS]), run)
    task = [p for p in problems if p.key == "task"]
    assert len(task) == 1 and task[0].fix.overrides() == ["task=dataset", given[1]]
    assert not [p for p in problems if p.key.startswith("task.")], problems


def test_the_group_fix_pastes_after_the_command(cli, tmp_path: Path) -> None:
    run, _ = _dataset_run(tmp_path)
    line = ["resume=true", f"hydra.run.dir={run}", *FITS]
    refused = cli(*line)
    assert refused.returncode == 1, output_of(refused)
    fixes = [
        shlex.split(line.removeprefix("     fix: "))
        for line in refused.stderr.splitlines()
        if line.startswith("     fix: ")
    ]
    assert len(fixes) <= 2 and fixes[0][0] == "task=dataset", refused.stderr
    pasted = cli(*line, *fixes[0], "dry_run=true")
    assert pasted.returncode == 0, output_of(pasted)


def test_a_record_that_is_not_a_command_line_is_not_offered(tmp_path: Path) -> None:
    """The record is data: an option that is not a plain name, or a file that is not a
    list, gives the per-key fixes as before."""
    for i, record in enumerate(("- task=$(touch x)\n", "task: dataset\n", "- [1, 2\n")):
        (tmp_path / str(i)).mkdir()
        run, _ = _dataset_run(tmp_path / str(i), record)
        problems = world_problems(compose(["resume=true", *FITS]), run)
        assert not [p for p in problems if p.key == "task"], record
        assert [p for p in problems if p.key == "task.path"], record
