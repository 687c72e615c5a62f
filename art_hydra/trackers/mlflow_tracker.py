"""MLflow through ``MlflowClient``: a file store inside the run folder unless
``MLFLOW_TRACKING_URI`` names a server or store of the user's; the resolved config as
flattened params and as ``config.yaml``, metrics per step, each logged step's
completions as a table (``log_table``: ``samples/<kind>/step-NNNNNN.json``). The run id is
kept in the run folder, so a resume continues the same MLflow run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from art_hydra.trackers.base import (
    Tracker,
    flat_config,
    register_tracker,
    sample_rows,
    table,
)

#: MLflow's param values are cut at this length by the store (longer ones are refused).
_PARAM_CHARS = 6000
#: The status MLflow records for each of the run's outcomes.
_STATUS = {"done": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


def tracking_uri(folder: Path) -> str:
    """The user's ``MLFLOW_TRACKING_URI``, else a file store in ``folder``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (folder / "mlruns").resolve().as_uri()


@register_tracker("mlflow")
class MlflowTracker(Tracker):
    def start(
        self,
        folder: Path,
        config: dict[str, Any],
        run_name: str,
        project: str,
        resume_id: str | None,
    ) -> str | None:
        # The file store is in maintenance mode in MLflow 3 and refused unless allowed;
        # telemetry would write an id into ~/.config/mlflow and call home.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        # log_table looks for an existing table to append to: no download bar on stdout.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri(folder))
        if resume_id:
            self.run_id = resume_id
            self.client.update_run(resume_id, status="RUNNING")
            return resume_id
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(project)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        from mlflow.entities import Param

        params = [
            Param(key, str(value)[:_PARAM_CHARS]) for key, value in flat_config(config).items()
        ]
        for start in range(0, len(params), 100):  # the store's batch limit
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        import yaml

        self.client.log_text(self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        return self.run_id

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def track_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        rows = sample_rows(step, kind, samples)
        if rows:
            columns, data = table(rows)
            frame = {c: [row[i] for row in data] for i, c in enumerate(columns)}
            # A table per step: log_table appends to an existing file by reading it whole,
            # which grows with the run; a file per step costs the same at every step.
            self.client.log_table(self.run_id, frame, f"samples/{kind}/step-{step:06d}.json")

    def summary(self, hparams: dict[str, Any], values: dict[str, float]) -> None:
        self.client.set_tag(self.run_id, "status", str(hparams.get("status")))

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, _STATUS.get(status, "FAILED"))
