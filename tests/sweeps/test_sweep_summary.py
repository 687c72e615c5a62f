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
#: A sweep's multirun.yaml as Hydra writes it (only what the summary reads).
MULTIRUN = "hydra:\n  overrides:\n    task:\n    - {}\n    - trainer.max_steps=3\n"


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
        "overrides": extra.pop(
            "overrides", [f"trainer.learning_rate={num}e-4", "trainer.max_steps=3"]
        ),
        "objective": {
            "metric": "reward_mean",
            "reduce": "last",
            "window": 1,
            "direction": direction,
            "value": value,
        },
        "final": extra.pop(
            "final",
            {"step": 3, "reward_mean": value, "loss": 1.0 + num} if value is not None else {},
        ),
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
    assert "Best: #2 (reward_mean = 0.75) in " in text
    assert text.splitlines()[-2].endswith(
        ": art-hydra trainer.learning_rate=2e-4 trainer.max_steps=3"
    )
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


def test_a_grid_sampled_study_plans_no_more_points_than_its_grid(tmp_path: Path) -> None:
    """Hydra's Optuna sweeper caps n_trials at a GridSampler's grid (here 2 x 2)."""
    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    n_trials: 10\n    sampler:\n"
        "      _target_: optuna.samplers.GridSampler\n    params:\n"
        "      trainer.learning_rate: choice(1e-5,1e-4)\n  overrides:\n    task:\n"
        "    - seed=0,1\n    - trainer.max_steps=3\n"
    )
    for num in range(4):
        _job(tmp_path, num, "done", 0.5)
    summary = summarize(tmp_path)
    assert summary.planned == 4
    assert summary.counts_line().endswith("0 killed or never finished")


def test_a_sweeps_shared_tracker_folder_is_not_a_job(tmp_path: Path) -> None:
    (tmp_path / "trackers" / "mlflow" / "mlruns").mkdir(parents=True)
    _job(tmp_path, 0, "done", 0.5)
    assert [job.folder.name for job in summarize(tmp_path).jobs] == ["0"]


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
    (sweep / "multirun.yaml").write_text(MULTIRUN.format("trainer.learning_rate=0e-4,1e-4"))
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


# ---- comparing points: swept columns, every metric, seeds aggregated, the plot ------

#: A grid over the learning rate and the seed, with a reward given as a dict (braces
#: that bash would expand, were they not quoted).
GRID = [
    "trainer.learning_rate=1e-5,1e-4",
    "seed=0,1",
    "+rewards.extra={_target_:my_rewards.length,weight:1.0}",
]


def _grid_sweep(sweep: Path) -> dict[tuple[float, int], float]:
    """Four jobs of ``GRID`` (learning rate x seed), each with its metrics.jsonl (an
    evaluation at step 2, then step 3 without one) and result.json; their objectives."""
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task:\n" + "".join(f"    - '{o}'\n" for o in GRID)
    )
    values = {}
    for num, (lr, seed) in enumerate([(1e-5, 0), (1e-5, 1), (1e-4, 0), (1e-4, 1)]):
        value = 0.1 + (0.4 if lr == 1e-4 else 0.0) + 0.1 * seed + 0.01 * num
        values[(lr, seed)] = value
        final = {
            "step": 3,
            "time": "2026-12-07T00:00:00Z",
            "reward_mean": value,
            "loss": 0.5 - value,
            "tokens_per_s": 900.0 + num,
            "sampling_mismatch_mean": 1e-7,
            "reward/char_overlap/mean": value / 2,
        }
        overrides = [f"trainer.learning_rate={lr}", f"seed={seed}", GRID[2]]
        folder = _job(sweep, num, "done", value, overrides=overrides, final=final)
        rows = [
            {"step": 1, "reward_mean": value - 0.2},
            {"step": 2, "reward_mean": value - 0.1, "eval/reward_mean": value + 0.05},
            final,
        ]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return values


def test_the_summary_has_a_column_per_swept_key_and_every_final_metric(tmp_path: Path) -> None:
    values = _grid_sweep(tmp_path / "sweep")
    finish_sweep(tmp_path / "sweep")
    rows = list(csv.DictReader((tmp_path / "sweep" / "summary.csv").open()))
    columns = list(rows[0])
    # One column per swept key (the dict reward is one too: its value varies in no job,
    # but multirun.yaml does not sweep it either, so it is left in `overrides`).
    assert [c for c in columns if not c.startswith("final.")][6:8] == [
        "trainer.learning_rate",
        "seed",
    ]
    assert "+rewards.extra" not in columns and "rewards.extra" not in columns
    for metric in (
        "reward_mean",
        "loss",
        "tokens_per_s",
        "sampling_mismatch_mean",
        "reward/char_overlap/mean",
        "eval/reward_mean",  # logged at step 2 only: its last value
    ):
        assert f"final.{metric}" in columns, metric
    assert "final.step" not in columns and "final.time" not in columns
    best = rows[0]
    assert (best["trainer.learning_rate"], best["seed"]) == ("0.0001", "1")
    assert float(best["objective"]) == values[(1e-4, 1)]
    assert float(best["final.eval/reward_mean"]) == pytest.approx(values[(1e-4, 1)] + 0.05)
    assert {r["status"] for r in rows} == {"done"} and all(r["folder"] for r in rows)


def test_points_are_aggregated_over_seeds(tmp_path: Path) -> None:
    values = _grid_sweep(tmp_path / "sweep")
    summary = summarize(tmp_path / "sweep")
    assert summary.swept == ["trainer.learning_rate", "seed"]
    assert [p.values for p in summary.points] == [
        {"trainer.learning_rate": 1e-4},
        {"trainer.learning_rate": 1e-5},
    ]
    for point, lr in zip(summary.points, (1e-4, 1e-5), strict=True):
        mean, std, n = point.stats("objective")
        seeds = [values[(lr, 0)], values[(lr, 1)]]
        assert n == 2
        assert mean == pytest.approx(sum(seeds) / 2)
        assert std == pytest.approx(abs(seeds[0] - seeds[1]) / 2**0.5)
    finish_sweep(tmp_path / "sweep")
    grouped = list(csv.DictReader((tmp_path / "sweep" / "summary_grouped.csv").open()))
    assert [(g["trainer.learning_rate"], g["n"], g["seeds"]) for g in grouped] == [
        ("0.0001", "2", "0 1"),
        ("1e-05", "2", "0 1"),
    ]
    assert float(grouped[0]["objective_mean"]) == pytest.approx(
        summary.points[0].stats("objective")[0]
    )
    assert "eval/reward_mean_mean" in grouped[0] and "loss_std" in grouped[0]


def test_summary_md_shows_both_tables_and_the_plot_is_a_png(tmp_path: Path) -> None:
    _grid_sweep(tmp_path / "sweep")
    text = finish_sweep(tmp_path / "sweep")
    md = (tmp_path / "sweep" / "summary.md").read_text()
    assert "## Points (aggregated over seeds: mean ± std, n)" in md
    assert "| point | n | objective | reward_mean | loss | eval/reward_mean |" in md
    assert "| trainer.learning_rate=0.0001 | 2 | 0.575 ± 0.0777817 |" in md
    assert "## Jobs" in md
    assert "| rank | job | status | objective | trainer.learning_rate | seed |" in md
    assert "![objective per point and reward curves of the top jobs](summary.png)" in md
    png = (tmp_path / "sweep" / "summary.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "Points over seeds (mean ± std, n)" in text and "summary.png" in text


def test_the_best_line_pasted_into_bash_gives_the_jobs_overrides(tmp_path: Path) -> None:
    overrides = [
        "+rewards.extra={_target_:my_rewards.length,weight:1.0}",
        "task.system_prompt='be brief; think'",
        "trainer.learning_rate=1e-4",
        "tags=[a,b]",
    ]
    _job(tmp_path / "sweep", 0, "done", 0.5, overrides=overrides)
    text = finish_sweep(tmp_path / "sweep")
    best = next(line for line in text.splitlines() if line.startswith("Best: #0 "))
    command = best.partition(": art-hydra ")[2]
    echoed = subprocess.run(
        ["bash", "-c", f'printf "%s\\n" {command}'], capture_output=True, text=True, check=True
    )
    assert echoed.stdout.splitlines() == overrides
    md = (tmp_path / "sweep" / "summary.md").read_text()
    assert f"```bash\nart-hydra {command}\n```" in md


def test_refused_trials_without_a_job_count_as_refused_points(tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    n_trials: 3\n  overrides:\n    task:\n    - trainer.max_steps=3\n"
    )
    _job(sweep, 0, "done", 0.5)
    _job(sweep, 1, "done", 0.7)
    for k, accumulation in enumerate((2, 4)):
        write_refused_result(
            sweep / "refused" / str(k),
            [f"trainer.gradient_accumulation_steps={accumulation}"],
            "1. trainer.gradient_accumulation_steps\n   RL cannot accumulate gradients",
            None,
        )
    summary = summarize(sweep)
    assert [j.job_num for j in summary.jobs] == [1, 0]  # the trials are not jobs
    assert [j.label for j in summary.refused_points] == ["refused/0", "refused/1"]
    # 3 planned trials, 2 jobs: one never finished; the refused ones are not missing.
    assert summary.counts_line() == (
        "2 done / 0 failed / 2 refused (2 trial(s) without a job, in refused/) / 0 running "
        "/ 1 killed or never finished"
    )
    finish_sweep(sweep)
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [r["job"] for r in rows if r["status"] == "refused"] == ["refused/0", "refused/1"]
    assert rows[-1]["trainer.gradient_accumulation_steps"] == "4"
    assert "- refused/1 (refused): 1. trainer.gradient_accumulation_steps" in (
        (sweep / "summary.md").read_text()
    )


def _run_folder(folder: Path) -> Path:
    """A single run's folder, as ``art-hydra`` without ``-m`` leaves it."""
    _job(folder.parent, int(folder.name), "done", 0.3)
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    return folder


def test_summarize_over_a_parent_keeps_sweeps_apart_and_never_writes_into_runs(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "multirun" / "a", tmp_path / "multirun" / "b"
    for sweep, values in ((first, (0.1, 0.9)), (second, (0.5, 0.2))):
        for num, value in enumerate(values):
            _job(sweep, num, "done", value)
        (sweep / "multirun.yaml").write_text(MULTIRUN.format("trainer.learning_rate=0e-4,1e-4"))
    run = _run_folder(tmp_path / "runs" / "7")
    before = sorted(p.name for p in run.iterdir())
    proc = run_cli("summarize", str(tmp_path), cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert f"2 sweep folders below {tmp_path}; each is summarised on its own." in out
    _, part_a, part_b = out.split("\n=== ")
    assert part_a.startswith(f"{first} ===") and part_b.startswith(f"{second} ===")
    assert f"Best: #1 (reward_mean = 0.9) in {first / '1'}" in part_a
    assert f"Best: #0 (reward_mean = 0.5) in {second / '0'}" in part_b
    for sweep, best in ((first, "1"), (second, "0")):
        rows = list(csv.DictReader((sweep / "summary.csv").open()))
        assert [Path(r["folder"]).parent for r in rows] == [sweep, sweep]  # its own jobs
        assert rows[0]["job"] == best
    assert not list(tmp_path.glob("summary*")) and not list((tmp_path / "runs").rglob("summary*"))
    alone = run_cli("summarize", str(run), cwd=tmp_path)
    assert alone.returncode == 1
    assert f"{run} is a single run's folder (status done; reward_mean = 0.3)" in alone.stderr
    assert "nothing was written" in alone.stderr and "Traceback" not in output_of(alone)
    assert sorted(p.name for p in run.iterdir()) == before


_HOLD = """
import sys, time
from pathlib import Path
from art_hydra.preflight.sweep_folder import claim_sweep_folder
assert claim_sweep_folder(Path(sys.argv[1]), sys.argv[1]) == []
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_sweep_into_a_held_sweep_folder_is_refused_before_any_job(
    tmp_path: Path,
) -> None:
    from art_hydra.preflight.sweep_folder import claim_sweep_folder

    sweep = tmp_path / "shared"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(sweep)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        proc = run_cli(
            "-m",
            "trainer.max_steps=1",
            "trainer.learning_rate=1e-5,1e-4",
            f"hydra.sweep.dir={sweep}",
            cwd=tmp_path,
        )
        out = output_of(proc)
        assert proc.returncode == 1, out
        assert f"is in use by another sweep (process {holder.pid} on host" in out
        assert "hydra.sweep.dir=<a new folder>" in out and "resume=auto" in out
        assert "No job was launched." in out and "Traceback" not in out
        assert sorted(os.listdir(sweep)) == [".sweep.lock"]  # no job, no multirun.yaml
        (sweep / "0").mkdir()  # whatever the folder holds, the live sweep is named first
        again = run_cli("-m", "seed=1,2", "resume=auto", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
        assert again.returncode == 1 and "is in use by another sweep" in output_of(again)
    finally:
        holder.kill()
        holder.wait()
    # The kernel released the lock of the killed holder: the folder is free again.
    assert claim_sweep_folder(sweep, str(sweep)) == []


def test_the_best_command_repeats_the_sweeps_config_choice(tmp_path: Path) -> None:
    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  job:\n    config_name: my_exp\n  runtime:\n    config_sources:\n"
        "    - {path: art_hydra.conf, schema: pkg, provider: main}\n"
        "    - {path: /my configs, schema: file, provider: command-line}\n"
        "  overrides:\n    task:\n    - seed=0,1\n"
    )
    _job(tmp_path, 0, "done", 0.5, overrides=["seed=0"])
    line = summarize(tmp_path).best_line()
    assert line is not None
    assert line.endswith(": art-hydra --config-name my_exp --config-dir '/my configs' seed=0")


def test_a_sweep_lets_its_folder_go_when_it_ends(tmp_path: Path) -> None:
    """Released at the sweep's end, not only at exit: a later sweep of the same process (a
    notebook) or another process may use the folder; one that launched nothing leaves no
    folder."""
    from art_hydra.preflight.sweep_folder import claim_sweep_folder, release_sweep_folder

    sweep = tmp_path / "new" / "sweep"
    assert claim_sweep_folder(sweep, str(sweep)) == []
    release_sweep_folder(sweep)
    assert not (tmp_path / "new").exists()
    release_sweep_folder(sweep)  # a second release does nothing
    assert claim_sweep_folder(sweep, str(sweep)) == []
    (sweep / "0").mkdir()
    release_sweep_folder(sweep)
    other = subprocess.run(
        [sys.executable, "-c", _HOLD.replace("time.sleep(600)", ""), str(sweep)],
        capture_output=True,
        text=True,
    )
    assert other.returncode == 0 and other.stdout == "held\n", other.stderr


def test_a_filesystem_without_flock_warns_and_sweeps_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Lustre without ``-o flock`` answers ENOLCK: the sweep runs unguarded, with a
    warning, rather than dying with a traceback."""
    import errno
    import fcntl

    from art_hydra.preflight import sweep_folder

    def no_locks(fd: int, how: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    sweep = tmp_path / "sweep"
    with caplog.at_level("WARNING"):
        assert sweep_folder.claim_sweep_folder(sweep, str(sweep)) == []
    assert "cannot be locked" in caplog.text
    assert sweep_folder._busy_problems(sweep, str(sweep)) == []


def test_a_refused_sweep_folder_gets_no_lock_file(tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    proc = run_cli("-m", "seed=1,2", f"hydra.sweep.dir={foreign}", cwd=tmp_path)
    assert proc.returncode == 1 and "no multirun.yaml" in output_of(proc)
    assert sorted(os.listdir(foreign)) == ["notes.txt"]


def test_a_sweep_refused_before_launch_leaves_no_folder(tmp_path: Path) -> None:
    sweep = tmp_path / "new" / "sweep"
    proc = run_cli(
        "-m", "trainer.gradient_accumulation_steps=1,2", f"hydra.sweep.dir={sweep}", cwd=tmp_path
    )
    assert proc.returncode == 1 and "No job was launched" in output_of(proc)
    assert not (tmp_path / "new").exists()


#: A real sweep of the default job, two learning rates by two seeds, a step each.
REAL = [
    "-m",
    "trainer.max_steps=2",
    "trainer.per_device_train_batch_size=16",
    "checkpoint.every_steps=0",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "trainer.learning_rate=1e-5,1e-4",
    "seed=0,1",
]


@pytest.mark.slow
def test_a_real_sweep_is_compared_over_seeds_and_continues_with_resume_auto(
    tmp_path: Path,
) -> None:
    sweep = tmp_path / "sweep"
    proc = run_cli(*REAL, f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    out = output_of(proc)
    assert proc.returncode == 0, out
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"done"}
    assert {(r["trainer.learning_rate"], r["seed"]) for r in rows} == {
        ("1e-05", "0"),
        ("1e-05", "1"),
        ("0.0001", "0"),
        ("0.0001", "1"),
    }
    for metric in ("reward_mean", "loss", "tokens_per_s", "sampling_mismatch_mean"):
        assert all(r[f"final.{metric}"] for r in rows), metric
    assert any(c.startswith("final.reward/") and c.endswith("/mean") for c in rows[0])
    grouped = list(csv.DictReader((sweep / "summary_grouped.csv").open()))
    assert sorted((g["trainer.learning_rate"], g["n"]) for g in grouped) == [
        ("0.0001", "2"),
        ("1e-05", "2"),
    ]
    assert (sweep / "summary.png").read_bytes().startswith(b"\x89PNG")
    best = next(line for line in out.splitlines() if line.startswith("Best: #"))
    assert best.partition(": art-hydra ")[2].split()[0] == "trainer.max_steps=2"
    # The same sweep again, continued: its own folder is no other sweep's.
    again = run_cli(*REAL, "resume=auto", f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, output_of(again)
    assert "4 done / 0 failed / 0 refused / 0 running / 0 killed" in again.stdout


def test_run_control_overrides_are_never_swept_keys(tmp_path: Path) -> None:
    """A study continued with ``resume=auto`` has jobs and refused trials carrying
    ``resume=auto`` beside ones without it: ``resume`` (like ``dry_run`` and ``hydra.*``)
    says how a job started, not which point it is, so it is no column and no label."""
    sweep = tmp_path / "study"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(MULTIRUN.format("rl.num_generations=choice(8,16)"))
    _job(sweep, 0, "done", 0.5, overrides=["rl.num_generations=8", "trainer.max_steps=3"])
    _job(
        sweep,
        1,
        "done",
        0.7,
        overrides=[
            "rl.num_generations=16",
            "trainer.max_steps=3",
            "resume=auto",
            "hydra.sweeper.n_trials=4",
        ],
    )
    write_refused_result(
        sweep / "refused" / "0",
        ["rl.num_generations=3", "trainer.max_steps=3", "resume=auto"],
        "1. rl.num_generations\n   does not divide the batch",
        None,
    )
    summary = summarize(sweep)
    assert summary.swept == ["rl.num_generations"]
    assert [j.point_label for j in summary.jobs] == [
        "rl.num_generations=16",
        "rl.num_generations=8",
    ]
    finish_sweep(sweep)
    header = next(csv.reader((sweep / "summary.csv").open()))
    assert "resume" not in header and not any(h.startswith("hydra.") for h in header)
    assert "resume=" not in (sweep / "summary.md").read_text()  # nor in the Best command
