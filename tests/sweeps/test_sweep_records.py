"""Real jobs leave their record: result.json (done, failed with its reason, interrupted
with its signal, or still "running" after SIGKILL), TensorBoard hparams, a sweep summary,
and an Optuna study that optimises the returned objective end to end."""

from __future__ import annotations

import csv
import json
import math
import re
import signal
from pathlib import Path

import pytest
from conftest import output_of, start_cli, wait_for_steps

from art_hydra.sweeps.summary import finish_sweep, summarize

pytestmark = pytest.mark.slow

#: Small, quick jobs: a few steps of the tiny model.
SMALL = [
    "trainer.per_device_train_batch_size=16",
    "checkpoint.every_steps=0",
    "logging.progress_bar=off",
    "logging.plot=false",
]


def _result(folder: Path) -> dict:
    return json.loads((folder / "result.json").read_text())


def _hparams(folder: Path) -> tuple[dict, list[float]]:
    """The hparams TensorBoard's HParams view reads from a run's event files, and the
    objective's scalar values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]
    ).experiment
    values = {
        key: value.number_value if value.HasField("number_value") else value.string_value
        for key, value in start.hparams.items()
    }
    tags = [m.name.tag for m in experiment.metric_infos]
    assert tags == ["objective/reward_mean"]
    return values, [s.value for s in events.Scalars(tags[0])]


def test_a_grid_sweep_leaves_a_record_per_job_and_a_ranked_summary(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = cli("-m", "trainer.max_steps=1,2", *SMALL, f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, output_of(proc)
    records = {n: _result(sweep / str(n)) for n in (0, 1)}
    for num, steps in [(0, 1), (1, 2)]:
        record = records[num]
        assert record["status"] == "done" and record["reason"] is None
        assert record["job_num"] == num
        assert f"trainer.max_steps={steps}" in record["overrides"]
        assert (record["steps"], record["max_steps"]) == (steps, steps)
        assert record["final"]["step"] == steps
        assert record["objective"]["metric"] == "reward_mean"
        assert record["objective"]["direction"] == "maximize"
        assert record["objective"]["value"] == record["final"]["reward_mean"]
        assert record["wall_time_s"] > 0 and record["started"] <= record["finished"]
        # TensorBoard's HParams view compares the sweep's jobs: overrides and objective.
        hparams, objective = _hparams(sweep / str(num))
        assert hparams["trainer.max_steps"] == steps and hparams["status"] == "done"
        assert objective == [pytest.approx(record["objective"]["value"])]
    text = finish_sweep(sweep)
    assert "2 done / 0 failed / 0 refused / 0 running / 0 killed or never finished" in text
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    best = max(records.values(), key=lambda r: r["objective"]["value"])
    assert rows[0]["rank"] == "1" and rows[0]["job"] == str(best["job_num"])
    assert (sweep / "summary.md").is_file()


def test_a_failed_run_records_its_reason_and_logs_it(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = cli("timeouts.rollout_s=0.0001", "trainer.max_steps=3", *SMALL, f"hydra.run.dir={run}")
    assert proc.returncode == 1
    record = _result(run)
    assert record["status"] == "failed" and "timeouts.rollout_s" in record["reason"]
    assert record["objective"]["value"] is None and record["steps"] == 0
    assert record["reason"] in (run / "art_hydra.log").read_text()
    assert "Traceback" not in output_of(proc)


def test_sigint_records_interrupted_and_sigkill_leaves_a_killed_job(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    quick = [*SMALL, "trainer.max_steps=200"]
    stopped = start_cli(*quick, f"hydra.run.dir={sweep / '0'}", cwd=tmp_path)
    wait_for_steps(sweep / "0", 2, stopped)
    stopped.send_signal(signal.SIGINT)
    stopped.communicate(timeout=120)
    assert stopped.returncode == 130
    record = _result(sweep / "0")
    assert (record["status"], record["reason"]) == ("interrupted", "SIGINT")
    assert record["steps"] >= 2 and record["objective"]["value"] is not None
    killed = start_cli(*quick, f"hydra.run.dir={sweep / '1'}", cwd=tmp_path)
    wait_for_steps(sweep / "1", 1, killed)
    assert _result(sweep / "1")["status"] == "running"
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    summary = summarize(sweep)
    assert {j.folder.name: j.status for j in summary.jobs} == {"0": "interrupted", "1": "killed"}
    assert summary.counts_line().endswith("1 interrupted / 0 running / 1 killed or never finished")


def test_an_optuna_study_optimises_the_returned_objective(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "study"
    proc = cli(
        "-m",
        "hydra/sweeper=optuna",  # its own sampler's _target_ comes with it, trusted
        "hydra.sweeper.sampler.seed=1",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.direction=maximize",
        "trainer.max_steps=3",
        *SMALL,
        "trainer.learning_rate=tag(log,interval(1e-4,1e-2))",
        "rl.temperature=interval(0.7,1.2)",
        f"hydra.sweep.dir={sweep}",
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "Return value must be float-castable" not in out and "Traceback" not in out
    values = []
    for num in range(3):
        record = _result(sweep / str(num))
        assert record["status"] == "done", record
        assert any(o.startswith("trainer.learning_rate=") for o in record["overrides"])
        values.append(record["objective"]["value"])
    assert all(isinstance(v, float) and math.isfinite(v) for v in values)
    best = float(re.search(r"Best value: (\S+)", out).group(1))
    assert best == max(values)
    assert finish_sweep(sweep).splitlines()[-2].startswith(f"Best: #{values.index(best)} ")


KILLER = '''
import os, signal

from art_hydra import reward


@reward
def dies(prompt, completion, answer):
    """Ends its own process, as the OOM killer would: on the model's completions, not on
    the pre-flight's call (which scores each row's own answer)."""
    if completion.strip() != (answer or "").strip():
        os.kill(os.getpid(), signal.SIGKILL)
    return 0.0
'''


@pytest.mark.slow
def test_a_killed_worker_is_named_and_the_points_it_never_started_still_run(
    cli, tmp_path: Path
) -> None:
    (tmp_path / "killer.py").write_text(KILLER)
    sweep = tmp_path / "sweep"
    exact = "art_hydra.tasks.rewards.exact_match"
    proc = cli(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",  # loky worker processes (1 would run jobs in this one)
        "trainer.max_steps=1",
        *SMALL,
        f"task.reward._target_={exact},killer.dies,{exact},{exact}",
        f"hydra.sweep.dir={sweep}",
        env={"PYTHONPATH": str(tmp_path)},
        timeout=300,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "TerminatedWorkerError" not in out and "Traceback" not in out
    found = re.search(r"Job\(s\) it was running: ([^;]*);.*launching them again: ([^.]*)\.", out)
    assert found, out
    running = set(re.findall(r"#(\d+)", found.group(1)))
    assert "1" in running
    for num in range(4):  # every point either ran to the end or is named as killed
        status = _result(sweep / str(num))["status"] if (sweep / str(num)).is_dir() else None
        assert status == "done" or str(num) in running, (num, status, out)
    # loky ends the whole pool when one worker dies, so a job that shared it may be
    # named too: the last line names exactly the jobs reported as running.
    unfinished = re.search(r"job\(s\) of the sweep did not finish: ([^.]*)\.", out)
    assert unfinished, out
    assert set(re.findall(r"#(\d+)", unfinished.group(1))) == running, out
