"""A sweep's summary from its jobs' result.json files: ranked in the objective's
direction, every state counted (failed with its reason, refused, running, killed), the
CSV and Markdown files written atomically, and ``art-hydra summarize`` on any folder."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ART_HYDRA, output_of, run_cli

from art_hydra.engine.result import write_refused_result
from art_hydra.runs.run_folder import RunLock
from art_hydra.sweeps.summary import finish_sweep, summarize

COUNTS = "{} done / {} failed{} / {} refused / {} running / {} killed or never finished"


def _job(
    sweep: Path,
    num: int,
    status: str,
    value: float | None = None,
    direction: str = "maximize",
    **extra: Any,
) -> Path:
    folder = sweep / str(num)
    folder.mkdir(parents=True)
    record = {
        "schema": 1,
        "status": status,
        "reason": extra.pop("reason", None),
        "job_num": num,
        "overrides": [f"trainer.learning_rate={num}e-4", "trainer.max_steps=3"],
        "objective": {
            "metric": "reward_mean",
            "reduce": "last",
            "window": 1,
            "direction": direction,
            "value": value,
        },
        "final": {"step": 3, "reward_mean": value, "loss": 1.0 + num} if value is not None else {},
        "windowed": {},
        "steps": 3,
        "max_steps": 3,
        "wall_time_s": 1.5,
        "pid": extra.pop("pid", os.getpid()),
        "host": socket.gethostname(),
    }
    (folder / "result.json").write_text(json.dumps(record))
    (folder / "art_hydra.log").write_text("")
    return folder


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(("direction", "order"), [("maximize", [2, 0, 1]), ("minimize", [1, 0, 2])])
def test_done_jobs_are_ranked_in_the_objectives_direction(
    tmp_path: Path, direction: str, order: list[int]
) -> None:
    for num, value in [(0, 0.5), (1, 0.25), (2, 0.75)]:
        _job(tmp_path, num, "done", value, direction)
    summary = summarize(tmp_path)
    assert [j.job_num for j in summary.jobs] == order
    assert [j.rank for j in summary.jobs] == [1, 2, 3]
    assert summary.best is not None and summary.best.job_num == order[0]


def test_every_state_is_counted_and_each_failure_named(tmp_path: Path) -> None:
    _job(tmp_path, 0, "done", 0.5)
    _job(tmp_path, 1, "failed", reason="reward_s: the reward overran its bound\nmore")
    _job(tmp_path, 2, "done", 0.9)
    write_refused_result(
        tmp_path / "3",
        ["trainer.gradient_accumulation_steps=2"],
        "1. trainer.gradient_accumulation_steps = 2\n   RL cannot accumulate gradients",
        3,
    )
    running = _job(tmp_path, 4, "running")
    _job(tmp_path, 5, "running", pid=_dead_pid())  # SIGKILLed: no lock, pid gone
    (tmp_path / "6").mkdir()
    (tmp_path / "6" / "art_hydra.log").write_text("started\n")  # killed before its record
    _job(tmp_path, 7, "interrupted", 0.1, reason="SIGINT")
    _job(tmp_path, 8, "failed", reason="reward_s: the reward overran its bound")
    lock = RunLock(running)
    lock.acquire()
    try:
        summary = summarize(tmp_path)
    finally:
        lock.release()
    statuses = {j.job_num: j.status for j in summary.jobs}
    assert statuses == {
        0: "done",
        1: "failed",
        2: "done",
        3: "refused",
        4: "running",
        5: "killed",
        6: "no record",
        7: "interrupted",
        8: "failed",
    }
    line = summary.counts_line()
    # One entry per reason, naming every job it stopped.
    assert line.startswith("2 done / 2 failed (#1, #8: reward_s: the reward overran its bound) / ")
    assert "1 refused / 1 interrupted / 1 running / 2 killed or never finished" in line
    assert [j.job_num for j in summary.jobs[:2]] == [2, 0]  # only done jobs are ranked
    killed = next(j for j in summary.jobs if j.job_num == 5)
    assert "pid" in (killed.reason or "") and "killed" in (killed.reason or "")
    refused = json.loads((tmp_path / "3" / "result.json").read_text())
    assert refused["status"] == "refused" and refused["job_num"] == 3
    assert refused["overrides"] == ["trainer.gradient_accumulation_steps=2"]
    assert "RL cannot accumulate" in refused["reason"]


def test_the_summary_files_hold_every_job(tmp_path: Path) -> None:
    _job(tmp_path, 0, "done", 0.5)
    _job(tmp_path, 1, "failed", reason="a | pipe")
    _job(tmp_path, 2, "done", 0.75)
    text = finish_sweep(tmp_path)
    assert "2 done / 1 failed (#1: a | pipe) / 0 refused / 0 running" in text
    assert "Best: #2 trainer.learning_rate=2e-4 trainer.max_steps=3" in text
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [(r["rank"], r["job"], r["status"]) for r in rows] == [
        ("1", "2", "done"),
        ("2", "0", "done"),
        ("", "1", "failed"),
    ]
    assert float(rows[0]["objective"]) == 0.75 and rows[0]["final.loss"] == "3.0"
    assert rows[2]["reason"] == "a | pipe"
    md = (tmp_path / "summary.md").read_text()
    assert "| 1 | #2 | done | 0.75 |" in md
    assert "a \\| pipe" in md  # a reason never breaks the table
    assert not list(tmp_path.glob(".summary*.tmp"))


def test_finishing_a_sweep_that_launched_nothing_writes_nothing(tmp_path: Path) -> None:
    assert "no job folder" in finish_sweep(tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_planned_points_without_a_folder_count_as_never_finished(tmp_path: Path) -> None:
    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task:\n    - trainer.max_steps=2,3,4\n    - algorithm=rl,sft\n"
    )
    _job(tmp_path, 0, "done", 0.5)
    summary = summarize(tmp_path)
    assert summary.planned == 6
    assert summary.counts_line().endswith("5 killed or never finished")


def test_a_planted_link_is_replaced_never_written_through(tmp_path: Path) -> None:
    sweep, victim = tmp_path / "sweep", tmp_path / "victim.txt"
    victim.write_text("precious")
    _job(sweep, 0, "done", 0.5)
    (sweep / "summary.md").symlink_to(victim)
    (sweep / "summary.csv").symlink_to(victim)
    finish_sweep(sweep)
    assert victim.read_text() == "precious"
    assert not (sweep / "summary.md").is_symlink()


def test_a_hostile_record_is_reported_not_crashed_on(tmp_path: Path) -> None:
    _job(tmp_path, 0, "done", 0.5)
    bad = tmp_path / "1"
    bad.mkdir()
    (bad / "result.json").write_text("[" * 100_000)
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "result.json").write_text('{"status": "done", "objective": "x"}')
    summary = summarize(tmp_path)
    assert {j.job_num: j.status for j in summary.jobs} == {0: "done", 1: "no record", 2: "done"}
    assert "unreadable" in (summary.jobs[-2].reason or "")


def test_the_summarize_command_on_a_sweep_folder(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _job(sweep, 0, "done", 0.5)
    _job(sweep, 1, "done", 0.6)
    proc = run_cli("summarize", str(sweep), cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "2 done / 0 failed / 0 refused / 0 running / 0 killed or never finished" in out
    assert "Best: #1" in out
    assert (sweep / "summary.csv").is_file() and (sweep / "summary.md").is_file()
    helped = run_cli("summarize", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "SWEEP_DIR" in helped.stdout.upper()
    missing = run_cli("summarize", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode == 1 and "is not a folder" in missing.stderr
    empty = run_cli("summarize", str(tmp_path), cwd=tmp_path / "sweep" / "0")
    assert empty.returncode == 0  # tmp_path holds the sweep below it
    assert "Traceback" not in output_of(missing) + output_of(empty)


def test_summarizing_imports_no_torch(tmp_path: Path) -> None:
    _job(tmp_path, 0, "done", 0.5)
    code = (
        "import sys; from art_hydra.sweeps.summary import finish_sweep; "
        f"finish_sweep({str(tmp_path)!r}); "
        "bad = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]; "
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert Path(ART_HYDRA).exists()


def test_jobs_with_another_objective_are_not_ranked_against_the_others(tmp_path: Path) -> None:
    # algorithm=rl,sft with objective.metric=auto: two RL jobs (reward_mean, maximize)
    # and one SFT job (loss, minimize) whose loss would "beat" a reward.
    _job(tmp_path, 0, "done", 0.1)
    _job(tmp_path, 1, "done", 0.2)
    sft = _job(tmp_path, 2, "done", 2.0, "minimize")
    record = json.loads((sft / "result.json").read_text())
    record["objective"]["metric"] = "loss"
    (sft / "result.json").write_text(json.dumps(record))
    summary = summarize(tmp_path)
    assert [j.job_num for j in summary.jobs if j.ranked] == [1, 0]
    assert summary.best.job_num == 1
    assert [j.job_num for j in summary.unranked] == [2]
    assert "Not ranked: #2 optimise loss (minimize), not reward_mean (maximize)" in (summary.text())
