"""A sweep's jobs meet in one place in every tracker: a real two-job sweep (``art-hydra
-m``, joblib's two processes at once, the tiny model) with W&B offline, MLflow's file
store and Trackio's local store, read back with each library's own API: ONE MLflow
experiment in the sweep folder's store, ONE Trackio project in its database, and W&B
runs of one group; each job named by its swept overrides (not the fixed ones), its
swept keys as typed params, tagged with the sweep and its job number; the log says
where each reports. Then a single run with ``logging.trackers_dir=.`` (TRL's ./wandb)
and ``MLFLOW_TRACKING_URI`` (the library's own variable wins)."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import output_of, run_cli

from art_hydra.config.tracker_names import LIBRARIES
from art_hydra.trackers.placement import SweepJob

pytestmark = pytest.mark.slow

MISSING = [m for m, extra in LIBRARIES.values() if extra and importlib.util.find_spec(m) is None]
if MISSING:
    pytest.skip(f"not installed: {MISSING} (art-hydra[trackers])", allow_module_level=True)

QUICK = [
    "trainer.max_steps=1",
    "trainer.per_device_train_batch_size=16",
    "logging.progress_bar=off",
    "logging.plot=false",
    "logging.report_to=[wandb,mlflow,trackio]",
]
PROJECT = "art-hydra-reverse"
NAMES = {"learning_rate=0.0001", "learning_rate=0.0003"}
BIN = Path(sys.executable).parent


def _env(home: Path, **more: str) -> dict[str, str]:
    env = {
        "HOME": str(home),
        "WANDB_MODE": "offline",
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "MLFLOW_TRACKING_URI": "",
        "WANDB_DIR": "",
        "TRACKIO_DIR": "",
        "WANDB_API_KEY": "",
    }
    return {**env, **more}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    """The sweep (its folder, HOME, the working folder, its output), run once."""
    root = tmp_path_factory.mktemp("sweep_trackers")
    home, cwd, folder = root / "home", root / "cwd", root / "sweep"
    home.mkdir()
    cwd.mkdir()
    proc = run_cli(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "trainer.learning_rate=1e-4,3e-4",
        "seed=1",  # fixed: in no job's name
        *QUICK,
        f"hydra.sweep.dir={folder}",
        cwd=cwd,
        env=_env(home),
        timeout=600,
    )
    assert proc.returncode == 0, output_of(proc)
    return folder, home, cwd, output_of(proc)


def _mlflow(uri: str) -> Any:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_both_jobs_land_in_one_mlflow_experiment_named_and_tagged(sweep) -> None:
    folder = sweep[0]
    store = folder / "trackers" / "mlflow" / "mlruns"
    client = _mlflow(store.as_uri())
    experiments = [e for e in client.search_experiments() if e.name != "Default"]
    assert [e.name for e in experiments] == [PROJECT]
    runs = client.search_runs([experiments[0].experiment_id])
    assert {r.info.run_name for r in runs} == NAMES
    for run in runs:
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert tags["sweep"] == f"{folder.parent.name}/{folder.name}"
        assert tags["sweep_dir"] == str(folder) and tags["swept"] == "trainer.learning_rate"
        job = int(tags["job"])
        assert (folder / str(job) / "trackers" / "mlflow.id").read_text() == run.info.run_id
        rate = float(run.data.params["trainer.learning_rate"])
        assert run.info.run_name == f"learning_rate={rate}" and run.data.params["seed"] == "1"
    # The docs' read-back with the skinny package's own CLI (no UI there).
    listed = subprocess.run(
        [str(BIN / "mlflow"), "runs", "list", "--experiment-id", experiments[0].experiment_id],
        env={**os.environ, "MLFLOW_TRACKING_URI": str(store), "MLFLOW_ALLOW_FILE_STORE": "true"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert all(name in listed.stdout for name in NAMES), listed.stdout


def test_both_jobs_land_in_one_trackio_project_of_the_sweeps_group(sweep) -> None:
    folder = sweep[0]
    store = folder / "trackers" / "trackio"
    assert sorted(p.name for p in store.glob("*.db")) == [f"{PROJECT}.db"]
    code = (
        "import json, sys\n"
        "from trackio.sqlite_storage import SQLiteStorage as S\n"
        "p = sys.argv[1]\n"
        "print(json.dumps({r: S.get_run_config(p, r) for r in S.get_runs(p)}, default=str))\n"
    )
    env = {**os.environ, "TRACKIO_DIR": str(store)}
    out = subprocess.run(
        [sys.executable, "-c", code, PROJECT], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    configs = json.loads(out.stdout.strip().splitlines()[-1])
    # Named by the job and the sweep's id: unique across sweeps sharing one database.
    sweep_id = SweepJob(folder.resolve(), None).sweep_id
    assert set(configs) == {
        f"learning_rate=0.0001 #0 @{sweep_id}",
        f"learning_rate=0.0003 #1 @{sweep_id}",
    }
    for name, config in configs.items():
        assert config["trainer.learning_rate"] == float(name.split("=")[1].split()[0])
        assert config["sweep"] == f"{folder.parent.name}/{folder.name}"
        assert f"#{config['job']} " in name and config["seed"] == 1
    # The docs' command that lists the project's runs (trackio show opens the same).
    listed = subprocess.run(
        [str(BIN / "trackio"), "list", "runs", "--project", PROJECT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert all(name in listed.stdout for name in configs), listed.stdout


def _wandb_run(path: Path) -> Any:
    """The run record of an offline ``.wandb`` file (LevelDB-log blocks of protobuf
    records, read with wandb's own message type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf, pos = buf + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or a record's last piece
            record = pb.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "run":
                return record.run
            buf = b""
    raise AssertionError(f"no run record in {path}")


def test_wandb_offline_runs_share_the_sweeps_group_and_sync_with_one_command(sweep) -> None:
    folder, home = sweep[0], sweep[1]
    files = sorted(folder.glob("*/trackers/wandb/wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 2
    runs = [_wandb_run(f) for f in files]
    assert {r.run_group for r in runs} == {f"{folder.parent.name}/{folder.name}"}
    assert {r.display_name for r in runs} == NAMES
    for run in runs:
        config = {u.key: json.loads(u.value_json) for u in run.config.update}
        assert run.project == PROJECT and list(run.tags) == [f"job-{config['sweep']['job']}"]
        rate = config["trainer"]["learning_rate"]
        assert config["sweep"]["swept"] == {"trainer.learning_rate": rate}
        assert run.display_name == f"learning_rate={rate}"
    # The docs' upload command for the whole sweep, dry-run (no account, no network).
    synced = subprocess.run(
        f"{BIN / 'wandb'} sync --dry-run {folder}/*/trackers/wandb/wandb/offline-run-*",
        shell=True,
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert synced.returncode == 0 and "Would sync 2 run(s)" in synced.stdout + synced.stderr


def test_the_log_says_where_and_nothing_lands_outside_the_sweep(sweep) -> None:
    folder, home, cwd, out = sweep
    store = folder / "trackers"
    for job in (0, 1):
        log = (folder / str(job) / "art_hydra.log").read_text()
        assert f"mlflow: reporting to {store / 'mlflow' / 'mlruns'}, experiment {PROJECT}" in log
        assert f"trackio: reporting to {store / 'trackio'}, project {PROJECT}" in log
        assert "wandb: reporting to trackers/wandb/wandb, project" in log
        assert f"group {folder.parent.name}/{folder.name}" in log
    assert sorted(os.listdir(cwd)) == [], "written into the working directory"
    written = {p.name for p in home.rglob("*")}
    assert not written & {"wandb", "mlflow", "trackio", "huggingface", "mlruns"}, written
    # The shared stores are the sweep's, not a job: the summary still counts 2 jobs.
    assert "Sweep " in out and "2 job folder(s)" in out


def test_trackers_dir_gives_trls_folders_and_the_librarys_variable_wins(
    tmp_path: Path,
) -> None:
    home, cwd, theirs = tmp_path / "home", tmp_path / "cwd", tmp_path / "theirs"
    for path in (home, cwd):
        path.mkdir()
    uri = (theirs / "mlruns").as_uri()
    proc = run_cli(
        *QUICK,
        "logging.trackers_dir=.",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=cwd,
        env=_env(home, MLFLOW_TRACKING_URI=uri, MLFLOW_ALLOW_FILE_STORE="true"),
        timeout=300,
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    # W&B and Trackio where TRL's libraries would write in the working folder...
    assert sorted(os.listdir(cwd)) == ["trackio", "wandb"]
    assert len(list((cwd / "wandb").glob("offline-run-*"))) == 1
    assert (cwd / "trackio" / f"{PROJECT}.db").is_file()
    assert f"wandb: reporting to {cwd / 'wandb'}, project" in out
    assert f"trackio: reporting to {cwd / 'trackio'}, project" in out
    # ... and MLflow where its own variable says, as the log says.
    assert f"mlflow: reporting to {uri}, experiment {PROJECT}" in out
    run_id = (tmp_path / "run" / "trackers" / "mlflow.id").read_text()
    assert _mlflow(uri).get_run(run_id).info.run_name == "run"
    assert not (tmp_path / "run" / "trackers" / "mlflow").exists()
