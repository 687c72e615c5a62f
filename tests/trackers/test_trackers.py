"""Trackers through their own libraries, offline, on a real short run and its resume:
W&B offline (the run's .wandb file and its tables), an MLflow file store (read back with
MLflow's client), Trackio's local store (read back with its own storage API) and
TensorBoard (EventAccumulator: scalars, hparams, the config and completions as text).
Every file lands in the run folder: the home folder and the working directory stay empty,
and a resume continues the same tracker runs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import output_of, run_cli

from art_hydra.config.tracker_names import LIBRARIES
from art_hydra.trackers.base import sample_rows

pytestmark = pytest.mark.slow

#: The trackers' libraries that come with an extra (TensorBoard's is a core dependency).
OPTIONAL = [module for module, extra in LIBRARIES.values() if extra]
MISSING = [name for name in OPTIONAL if importlib.util.find_spec(name) is None]
QUICK = [
    "trainer.per_device_train_batch_size=16",
    "checkpoint.every_steps=2",
    "logging.progress_bar=off",
    "logging.plot=false",
]


def _run(tmp_path: Path, run_dir: Path, report_to: list[str], *extra: str) -> str:
    """A run in ``run_dir`` with HOME and the working directory in fresh empty folders
    (checked empty afterwards); its output."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(exist_ok=True)
    cwd.mkdir(exist_ok=True)
    env = {
        "HOME": str(home),
        "WANDB_MODE": "offline",
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    for var in ("MLFLOW_TRACKING_URI", "WANDB_DIR", "TRACKIO_DIR", "WANDB_API_KEY"):
        env[var] = ""  # run_cli keeps the caller's environment; these would send files away
    proc = run_cli(
        *QUICK,
        f"logging.report_to=[{','.join(report_to)}]",
        f"hydra.run.dir={run_dir}",
        *extra,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, output_of(proc)
    assert sorted(os.listdir(home)) == [], "written into HOME"
    assert sorted(os.listdir(cwd)) == [], "written into the working directory"
    return output_of(proc)


def _ids(run_dir: Path) -> dict[str, str]:
    return {p.stem: p.read_text() for p in (run_dir / "trackers").glob("*.id")}


def _trackio_logs(store: Path, project: str, run: str) -> dict:
    """Trackio's own storage API, in a process of its own (trackio reads TRACKIO_DIR at
    import)."""
    code = (
        "import json, sys\n"
        "from trackio.sqlite_storage import SQLiteStorage as S\n"
        "p, r = sys.argv[1], sys.argv[2]\n"
        "print(json.dumps({'runs': S.get_runs(p), 'logs': S.get_logs(p, r),"
        " 'config': S.get_run_config(p, r)}, default=str))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, project, run],
        env={**os.environ, "TRACKIO_DIR": str(store)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(bool(MISSING), reason=f"not installed: {MISSING} (art-hydra[trackers])")
def test_every_tracker_gets_config_metrics_and_samples_and_resume_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    every = ["tensorboard", "wandb", "mlflow", "trackio"]
    out = _run(tmp_path, run_dir, every, "trainer.max_steps=2")
    assert "Trackio" not in out.split("art_hydra: 2 steps")[-1]  # nothing printed after the end
    ids = _ids(run_dir)
    assert sorted(ids) == ["mlflow", "trackio", "wandb"]
    logged = [json.loads(line) for line in (run_dir / "completions.jsonl").open()]
    # One table row per completion, whichever shape completions.jsonl's rows have.
    per_step = len(sample_rows(1, "train", logged[0]["samples"]))
    assert per_step >= 1
    _run(tmp_path, run_dir, every, "trainer.max_steps=3", "resume=true")
    assert _ids(run_dir) == ids, "the resume opened new tracker runs"
    assert sorted(os.listdir(run_dir / "trackers")) == sorted(
        ["mlflow", "trackio", "wandb", "mlflow.id", "trackio.id", "wandb.id"]
    )

    # W&B offline: one offline folder per invocation, both of the same run id.
    wandb_id = ids["wandb"]
    runs = sorted((run_dir / "trackers" / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(f"-{wandb_id}") for r in runs)
    record = b"".join((r / f"run-{wandb_id}.wandb").read_bytes() for r in runs)
    for word in (b"reward_mean", b"learning_rate", b"num_generations", b"art-hydra-reverse"):
        assert word in record, word
    tables = sorted(runs[0].glob("files/media/table/samples/train_*.table.json"))
    assert len(tables) == 2  # steps 1 and 2
    table = json.loads(tables[0].read_text())
    assert {"prompt", "reference", "completion", "reward"} <= set(table["columns"])
    assert len(table["data"]) == per_step

    # MLflow: the file store read back with MLflow's own client.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(
        tracking_uri=(run_dir / "trackers" / "mlflow" / "mlruns").resolve().as_uri()
    )
    found = client.get_run(ids["mlflow"])
    assert found.info.status == "FINISHED"
    assert found.data.params["rl.num_generations"] == "8"
    assert found.data.params["logging.report_to"] == str(every)
    history = client.get_metric_history(ids["mlflow"], "reward_mean")
    assert sorted(m.step for m in history) == [1, 2, 3]
    experiment = client.get_experiment(found.info.experiment_id)
    assert experiment.name == "art-hydra-reverse"
    assert len(client.search_runs([experiment.experiment_id])) == 1
    artifacts = {a.path for a in client.list_artifacts(ids["mlflow"])}
    assert {"config.yaml", "samples"} <= artifacts
    tables = [a.path for a in client.list_artifacts(ids["mlflow"], "samples/train")]
    assert tables == [f"samples/train/step-{n:06d}.json" for n in (1, 2, 3)]
    local = client.download_artifacts(ids["mlflow"], tables[0], str(tmp_path))
    samples = json.loads(Path(local).read_text())
    assert len(samples["data"]) == per_step and "completion" in samples["columns"]

    # Trackio: its local store read back with its storage API.
    stored = _trackio_logs(run_dir / "trackers" / "trackio", "art-hydra-reverse", ids["trackio"])
    assert stored["runs"] == [ids["trackio"]]
    assert stored["config"]["rl.num_generations"] == 8
    steps = sorted({row["step"] for row in stored["logs"] if "reward_mean" in row})
    assert steps == [1, 2, 3]
    tables = [row["samples/train"] for row in stored["logs"] if "samples/train" in row]
    assert len(tables) == 3 and len(tables[0]["_value"]) == per_step

    # TensorBoard: scalars, the config and completions as text, the hparams.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()
    assert "train/reward_mean" in tags["scalars"]
    assert [e.step for e in events.Scalars("train/reward_mean")] == [1, 2, 3]
    assert {"config/text_summary", "completions/train/text_summary"} <= set(tags["tensors"])
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "num_generations: 8" in config_text
    completions = events.Tensors("completions/train/text_summary")
    assert [e.step for e in completions] == [1, 2, 3]
    assert "| group | prompt | reference | completion |" in (
        completions[0].tensor_proto.string_val[0].decode()
    )
    assert events.PluginTagToContent("hparams"), "no hparams summary"


def test_tensorboard_alone_writes_no_trackers_folder_and_none_writes_nothing(
    tmp_path: Path,
) -> None:
    _run(tmp_path, tmp_path / "tb", ["tensorboard"], "trainer.max_steps=1")
    assert (tmp_path / "tb" / "tensorboard").is_dir()
    assert not (tmp_path / "tb" / "trackers").exists()
    _run(tmp_path, tmp_path / "none", ["none"], "trainer.max_steps=1")
    assert not (tmp_path / "none" / "tensorboard").exists()
    assert not (tmp_path / "none" / "trackers").exists()
