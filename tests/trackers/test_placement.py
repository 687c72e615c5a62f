"""Where each tracker reports, without training: the library's own variable wins over
``logging.trackers_dir``, which wins over art_hydra's folders (a sweep's shared stores in
its sweep folder, W&B's per job); a variable art_hydra set for an earlier run in the same
process is not taken for the user's; a tracking URI's password or token never reaches
the log; a job's name is its swept overrides, shortened where unambiguous."""

from __future__ import annotations

from pathlib import Path

import pytest

from art_hydra.trackers import placement
from art_hydra.trackers.placement import SweepJob, place, set_ours, shown_uri

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in placement.LIBRARY_VARIABLES.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(placement, "_OURS", {})


def test_a_sweeps_jobs_share_its_stores_and_keep_their_own_wandb(tmp_path: Path) -> None:
    run = tmp_path / "sweep" / "3"
    job = SweepJob(tmp_path / "sweep", 3, {"trainer.learning_rate": 1e-4})
    assert place("mlflow", run, None, job, False).folder == tmp_path / "sweep/trackers/mlflow"
    assert place("trackio", run, None, job, False).folder == tmp_path / "sweep/trackers/trackio"
    assert place("wandb", run, None, job, False).folder == run / "trackers/wandb"
    # A single run keeps today's folders, shown relative to the run folder.
    single = place("mlflow", run, None, None, False)
    assert single.shown == "trackers/mlflow/mlruns"
    assert single.uri == (run / "trackers/mlflow/mlruns").resolve().as_uri()
    # A job of a sweep begun before stores were shared resumes into its own store.
    (run / "trackers/mlflow/mlruns").mkdir(parents=True)
    assert place("mlflow", run, None, job, True).folder == run / "trackers/mlflow"


def test_the_librarys_variable_wins_then_trackers_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    given = place("wandb", run, str(tmp_path / "d"), None, False)
    assert given.folder == tmp_path / "d" and given.shown == str(tmp_path / "d" / "wandb")
    assert place("mlflow", run, str(tmp_path / "d"), None, False).shown == str(
        tmp_path / "d" / "mlruns"
    )
    assert place("trackio", run, str(tmp_path / "d"), None, False).folder == tmp_path / "d/trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "mine"))
    mine = place("trackio", run, str(tmp_path / "d"), None, False)
    assert mine.folder == tmp_path / "mine" and mine.users
    # A value art_hydra set itself (an earlier job in this process) is not the user's.
    set_ours("TRACKIO_DIR", str(tmp_path / "earlier"))
    assert place("trackio", run, None, None, False).folder == run / "trackers/trackio"


def test_a_tracking_uris_secrets_are_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://me:hunter22@mlflow.example:5000/x?token=abc")
    where = place("mlflow", Path("/tmp/run"), None, None, False)
    assert where.shown == "https://***@mlflow.example:5000/x?token=***"
    assert "hunter22" not in where.shown and where.uri.endswith("token=abc")
    assert shown_uri("databricks") == "databricks"
    assert shown_uri("http://mlflow:5000?experiment=a") == "http://mlflow:5000?experiment=a"


def test_a_jobs_name_is_its_swept_overrides_shortened_where_unambiguous() -> None:
    folder = Path("/out/multirun/2026-01-01/12-00-00-ab12")
    texts = ("trainer.learning_rate=0.0001", "seed=1", "rl.beta=0.1", "sft.beta=0.2")
    job = SweepJob(folder, 4, {}, texts)
    assert job.run_name == "learning_rate=0.0001,seed=1,rl.beta=0.1,sft.beta=0.2"
    assert job.unique_name == f"{job.run_name} #4 @{job.sweep_id}"
    assert job.name == "2026-01-01/12-00-00-ab12"
    assert SweepJob(folder, 2).run_name == "job 2"
    long = SweepJob(folder, 0, {}, ("task.path=" + "x" * 80,)).run_name
    assert long == "path=" + "x" * 31 + "…"


def test_a_relative_trackers_dir_is_the_launch_folders_and_tilde_is_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = tmp_path / "elsewhere" / "run"
    assert place("trackio", run, "td", None, False).folder == tmp_path / "td/trackio"
    assert place("mlflow", run, ".", None, False).uri == (tmp_path / "mlruns").as_uri()
    assert place("wandb", run, "~/t", None, False).folder == tmp_path / "home/t"


_APP = """
import json, sys
from pathlib import Path
import hydra
from art_hydra.trackers.placement import place, sweep_job

@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg) -> None:
    job = sweep_job()
    where = place("trackio", Path.cwd(), "td", job, False)
    print("JOB " + json.dumps([str(job.folder), job.run_name, str(where.folder), job.swept]))

main()
"""
_APP_CONFIG = """
x: 0
seed: 0
hydra:
  sweeper:
    params:
      seed: 1
      x: 1,2
"""


def test_a_chdir_sweeps_jobs_share_one_place_named_by_what_they_sweep(tmp_path: Path) -> None:
    """hydra.job.chdir=true runs each job in its own folder: the sweep folder and a
    relative trackers_dir are still the launch folder's, and a value fixed in
    hydra.sweeper.params names no job (real Hydra CLI, no training)."""
    import json
    import subprocess
    import sys

    (tmp_path / "app.py").write_text(_APP)
    (tmp_path / "app.yaml").write_text(_APP_CONFIG)
    proc = subprocess.run(
        [sys.executable, "app.py", "-m", "hydra.job.chdir=true", "hydra.sweep.dir=sw"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    jobs = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("JOB ")]
    assert [(j[0], j[2]) for j in jobs] == [
        (str(tmp_path / "sw"), str(tmp_path / "td/trackio"))
    ] * 2
    assert [j[1] for j in jobs] == ["x=1", "x=2"] and [j[3] for j in jobs] == [{"x": 1}, {"x": 2}]


def test_trackio_names_are_unique_across_sweeps_sharing_a_database() -> None:
    """Trackio resumes the latest run of a name: two sweeps whose folders end alike
    (hydra.sweep.dir=sweeps/lr in two projects) must not share one."""
    a = SweepJob(Path("/p1/sweeps/lr"), 0, {}, ("learning_rate=0.0001",))
    b = SweepJob(Path("/p2/sweeps/lr"), 0, {}, ("learning_rate=0.0001",))
    assert a.name == b.name and a.run_name == b.run_name
    assert a.unique_name != b.unique_name
    assert a.unique_name.startswith("learning_rate=0.0001 #0 @")


@pytest.mark.parametrize(
    "query",
    [
        "sig=s3cr3tv4l",
        "X-Amz-Signature=s3cr3tv4l&X-Amz-Credential=s3cr3tv4l",
        "signature=s3cr3tv4l",
        "access_token=s3cr3tv4l",
        "api_key=s3cr3tv4l",
        "password=s3cr3tv4l",
        "client_secret=s3cr3tv4l",
        "credential=s3cr3tv4l",
        "sas=s3cr3tv4l",
    ],
)
def test_signed_urls_signatures_and_keys_are_hidden(query: str) -> None:
    shown = shown_uri(f"https://store.example/mlflow?sv=2024&{query}")
    assert "s3cr3tv4l" not in shown and "sv=2024" in shown


def test_a_resume_whose_mlflow_store_moved_starts_a_new_run_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """logging.trackers_dir (or MLFLOW_TRACKING_URI) may change on resume: the run the id
    names is in the old store, so a new one starts in the new store, with a warning
    (never MLflow's "Run ... not found" traceback)."""
    from art_hydra.trackers.mlflow_tracker import MlflowTracker

    places = [place("mlflow", tmp_path / "run", str(tmp_path / d), None, False) for d in "ab"]
    for where in places:
        where.folder.mkdir(parents=True)
    first = MlflowTracker()
    old = first.start(places[0], {"a": 1}, "run", "proj", None)
    first.close("interrupted")
    again = MlflowTracker()
    assert again.start(places[0], {"a": 1}, "run", "proj", old) == old  # the same store
    again.close("done")
    moved = MlflowTracker()
    with caplog.at_level("WARNING"):
        new = moved.start(places[1], {"a": 1}, "run", "proj", old)
    moved.log_metrics(3, {"loss": 1.0})
    moved.close("done")
    assert new and new != old
    assert moved.client.get_run(new).info.status == "FINISHED"
    assert f"run {old}" in caplog.text and "stay in the store it started in" in caplog.text


@pytest.mark.parametrize(
    ("sweeper", "fixed"),
    [
        ("", {"a": "1"}),  # no sweeper section (the joblib launcher's sweeps)
        ("  sweeper:\n    params: null\n", {"a": "1"}),
        ("  sweeper:\n    params:\n      seed: 1\n      x: 1,2\n", {"seed": "1", "a": "1"}),
    ],
)
def test_a_sweeps_fixed_overrides_are_its_command_lines_and_sweeper_params(
    tmp_path: Path, sweeper: str, fixed: dict[str, str]
) -> None:
    task = "hydra:\n  overrides:\n    task:\n    - a=1\n    - b=1,2\n"
    (tmp_path / "multirun.yaml").write_text(task + sweeper)
    assert placement._fixed_in_sweep(tmp_path) == fixed
