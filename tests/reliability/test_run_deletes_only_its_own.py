"""A run deletes only what it created (issue 32).

A run lists what it makes in its folder in ``run_manifest.json``; every path that
deletes inside the folder (``resume=auto`` starting afresh, a stop before the first
checkpoint) removes only entries that manifest lists, never through a link. Another
program's file under the name of a record the run writes (its ``metrics.jsonl``, its
``tensorboard/``) is refused with a fresh folder as the fix, and left as it was; any
other file (a shell redirect's log, ``slurm-<id>.out``, ``nohup.out``, a README) is
named in a notice and left alone. A run that trained all its steps while its stdout's
reader went away (``| head -1``) is ``done``. Assertions are on the victims' bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ART_HYDRA, output_of, report_entries

from art_hydra import Severity, compose
from art_hydra.config.run_files import RUN_MANIFEST
from art_hydra.engine.result import write_refused_result
from art_hydra.preflight import world_problems
from art_hydra.runs import run_identity
from art_hydra.runs.progress import stdout_reader_may_go
from art_hydra.runs.run_folder import (
    claim,
    clear_unsaved_run,
    foreign_records,
    listed_entries,
    remove_records,
    settle_records,
    write_manifest,
    write_run_config,
)

#: A short run of the tiny model that writes no TensorBoard, plot or progress bar.
SHORT = [
    "trainer.max_steps=2",
    "trainer.per_device_train_batch_size=16",
    "checkpoint.every_steps=1",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]
#: What another tool, a shell redirect, SLURM and nohup leave in a folder.
OTHER_TOOLS = {
    "metrics.jsonl": '{"loss": 0.5, "tool": "another trainer"}\n',
    "tensorboard/events.out.tfevents.1": "another trainer's events\n",
    "train.log": "another trainer's log\n",
}
LAUNCHERS = {
    "log.txt": "a shell redirect's output\n",
    "slurm-123.out": "SLURM's output\n",
    "nohup.out": "nohup's output\n",
    "README.md": "what this folder is\n",
}


def _plant(folder: Path, files: dict[str, str]) -> dict[str, bytes]:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return _snapshot(folder, files)


def _snapshot(folder: Path, files: dict[str, str]) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in files}


def _own_run(run: Path, overrides: list[str]) -> None:
    """The records of a run that ended before its first checkpoint, listed as its own."""
    run.mkdir(parents=True, exist_ok=True)
    write_run_config(run, compose(overrides))
    run_identity.record(compose(overrides), run)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    claim(run, ["run_config.yaml", "run_identity.json", "metrics.jsonl", "run.lock"])


# ---- another program's records: refused, never touched --------------------------------


@pytest.mark.parametrize("resume", ["auto", "false", "true"])
def test_another_tools_records_are_refused_and_kept_whatever_resume_says(
    cli, tmp_path: Path, resume: str
) -> None:
    run = tmp_path / "run"
    before = _plant(run, OTHER_TOOLS)
    proc = cli(f"hydra.run.dir={run}", f"resume={resume}", *SHORT)
    out = output_of(proc)
    assert proc.returncode == 1, out
    ((key, _, fixed),) = report_entries(out)
    assert key == "hydra.run.dir" and fixed.startswith("hydra.run.dir=<a new folder>")
    assert "holds metrics.jsonl, tensorboard, which no run of art_hydra made there" in out
    for word in ("delete ", "remove ", "rm "):  # the fix never asks to delete their files
        assert word not in fixed.lower()
    assert _snapshot(run, OTHER_TOOLS) == before
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "tensorboard", "train.log"]


def test_restart_and_stop_remove_only_what_the_manifest_lists(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _own_run(run, [])
    (run / "completions.jsonl").write_text("not listed: not the run's\n")
    before = _plant(run, LAUNCHERS)
    removed = ["metrics.jsonl", "run_config.yaml", "run_identity.json"]
    assert sorted(clear_unsaved_run(run)) == removed
    assert (run / "completions.jsonl").read_text() == "not listed: not the run's\n"
    assert _snapshot(run, LAUNCHERS) == before
    settle_records(run)  # as the run ends: what it removed and did not make again goes
    assert listed_entries(run) == set()  # run.lock was listed, never made
    assert remove_records(run, ["completions.jsonl", "log.txt"]) == []


def test_a_planted_manifest_cannot_make_a_run_delete_other_files(tmp_path: Path) -> None:
    """The manifest is data: it may name a record of the run, never another file, a path
    outside the folder, or a link's target."""
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own data\n")
    before = _plant(run, LAUNCHERS)
    (run / "metrics.jsonl").symlink_to(victim)
    names = ["log.txt", "README.md", "../victim.txt", str(victim), "metrics.jsonl", "."]
    (run / RUN_MANIFEST).write_text(json.dumps({"entries": names}))
    removed = clear_unsaved_run(run)
    assert removed == ["metrics.jsonl"]  # the link itself, unlinked, never followed
    assert victim.read_text() == "the victim's own data\n"
    assert _snapshot(run, LAUNCHERS) == before


def test_a_manifest_planted_as_a_link_is_refused(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own data\n")
    (run / RUN_MANIFEST).symlink_to(victim)
    proc = cli(f"hydra.run.dir={run}", "dry_run=true")
    assert proc.returncode == 1 and "run_manifest.json as a symbolic link" in output_of(proc)
    assert victim.read_text() == "the victim's own data\n"


# ---- other files: a notice, not a refusal ---------------------------------------------


def test_a_shell_redirect_slurm_and_nohup_output_are_a_notice_not_a_refusal(
    cli, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    before = _plant(run, LAUNCHERS)
    proc = cli(f"hydra.run.dir={run}", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "holds README.md, log.txt, nohup.out, slurm-123.out, which no run writes" in out
    assert "leaves them alone" in out
    assert _snapshot(run, LAUNCHERS) == before


def test_a_resumable_run_with_launcher_output_beside_it_resumes_with_a_notice(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    _own_run(run, ["trainer.max_steps=4"])
    step = run / "checkpoints" / "step-000002"
    (step / "trainer_state").mkdir(parents=True)
    (step / "trainer_state" / "state.json").write_text("{}")
    write_manifest(step, 2)
    claim(run, ["checkpoints"])
    _plant(run, {"nohup.out": "nohup's output\n", "slurm-9.out": "SLURM's output\n"})
    for resume in ("auto", "true"):
        (notice,) = world_problems(compose(["trainer.max_steps=4", f"resume={resume}"]), run)
        assert (notice.key, notice.severity) == ("hydra.run.dir", Severity.warning)
        assert "nohup.out, slurm-9.out" in notice.reason


def test_a_project_or_a_crowded_folder_is_still_refused(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "notes.txt").write_text("mine\n")
    (refused,) = world_problems(compose([]), project)
    assert refused.severity == Severity.error and "looks like a project" in refused.reason
    crowded = tmp_path / "downloads"
    crowded.mkdir()
    for n in range(40):
        (crowded / f"file{n}.bin").write_text("x")
    (refused,) = world_problems(compose([]), crowded)
    assert refused.severity == Severity.error and "folder of other things" in refused.reason
    assert len(list(crowded.iterdir())) == 40


def test_a_refused_sweep_jobs_record_is_its_own_and_a_pre_manifest_run_still_resumes(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    write_refused_result(job, ["seed=1"], "refused for a test", 0)
    assert listed_entries(job) == {"result.json"} and foreign_records(job, "checkpoints") == []
    legacy = tmp_path / "legacy"  # a run folder written before run folders had a manifest
    legacy.mkdir()
    write_run_config(legacy, compose(["trainer.max_steps=4"]))
    (legacy / "metrics.jsonl").write_text('{"step": 1}\n')
    assert foreign_records(legacy, "checkpoints") == []
    assert world_problems(compose(["trainer.max_steps=4", "resume=auto"]), legacy) == []


# ---- a broken pipe is not a failure ---------------------------------------------------


def test_writes_to_a_stdout_whose_reader_went_away_raise_nothing(monkeypatch) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = open(write_end, "w", buffering=1)  # noqa: SIM115 (closed below)
    monkeypatch.setattr(sys, "stdout", stream)
    with stdout_reader_may_go():
        print("x" * 200_000)
        print("the result line", flush=True)
    assert sys.stdout is stream
    stream.close()  # the descriptor now points at /dev/null: closing flushes nothing back


# ---- training (tiny model, 2 steps) ---------------------------------------------------


@pytest.mark.slow
def test_resume_auto_restarts_a_run_and_keeps_everything_it_did_not_write(
    cli, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    _own_run(run, SHORT)  # a run killed before its first checkpoint
    before = _plant(run, LAUNCHERS)
    proc = cli(f"hydra.run.dir={run}", "resume=auto", *SHORT)
    assert proc.returncode == 0, output_of(proc)
    assert "leaves them alone" in output_of(proc)
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()] == [1, 2]
    assert _snapshot(run, LAUNCHERS) == before
    listed = listed_entries(run) or set()
    assert {"metrics.jsonl", "run_config.yaml", "checkpoints", "result.json"} <= listed
    assert not listed & set(LAUNCHERS)


@pytest.mark.slow
def test_a_run_that_finished_behind_a_broken_pipe_is_done(tmp_path: Path) -> None:
    """``art-hydra ... | head -1``: the reader goes after the first line."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(
        [ART_HYDRA, "hydra.run.dir=run", *SHORT],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    record = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (record["status"], record["steps"], record["reason"]) == ("done", 2, None)
    assert "Broken pipe" not in err and "Traceback" not in err
