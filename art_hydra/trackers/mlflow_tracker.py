"""MLflow through ``MlflowClient``: a file store in the run folder (a sweep's jobs share
one in the sweep folder, one experiment, each run tagged with the sweep and its job)
unless ``MLFLOW_TRACKING_URI`` or ``logging.trackers_dir`` says otherwise; the resolved config as
flattened params and as ``config.yaml``, metrics per step, each logged step's
completions as a table (``log_table``: ``samples/<kind>/step-NNNNNN.json``). The run id is
kept in the run folder, so a resume continues the same MLflow run; a resume whose store
moved (``logging.trackers_dir`` or ``MLFLOW_TRACKING_URI`` changed since the start) finds
no such run there and starts a new one in the new store, with a warning: the steps
logged so far stay in the old store."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from art_hydra.trackers.base import (
    Tracker,
    flat_config,
    register_tracker,
    sample_rows,
    table,
)
from art_hydra.trackers.placement import Place, SweepJob

log = logging.getLogger(__name__)

#: MLflow's param values are cut at this length by the store (longer ones are refused).
_PARAM_CHARS = 6000
#: The status MLflow records for each of the run's outcomes.
_STATUS = {"done": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


@contextlib.contextmanager
def _store_lock(where: Place) -> Iterator[None]:
    """Held while the client is built and a file store's experiment is looked up or
    created: MLflow's file store, built on a fresh folder, writes the default
    experiment's ``0/meta.yaml``, and checks a name before it creates it, so two jobs of
    a sweep starting together would collide on one or make two experiments of one name.
    ``flock`` on the store's parent folder (nothing is written; the kernel releases it
    on any exit). A server or database needs none."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(where.uri or "")
    parent = Path(unquote(parts.path if parts.scheme == "file" else where.uri or "")).parent
    if parts.scheme not in ("", "file") or not parent.is_dir():
        yield
        return
    import fcntl

    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _params(config: dict[str, Any], sweep: SweepJob | None) -> list[Any]:
    """The flattened config as params, and a swept key the config does not hold by its
    name (a group choice: ``task=digit_sum``) beside them."""
    from mlflow.entities import Param

    flat = flat_config(config)
    if sweep is not None:
        flat.update({k: v for k, v in sweep.swept.items() if k not in flat})
    return [Param(key, str(value)[:_PARAM_CHARS]) for key, value in flat.items()]


def _continued(client: Any, run_id: str, where: Place) -> bool:
    """Set run ``run_id`` running again; False, with a warning, where the store has no
    such run (it moved since the run started): a new run is started in it instead."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
        log.warning(
            "mlflow: run %s, which this run reported to before, is not in %s (the store "
            "moved since the run started: logging.trackers_dir or MLFLOW_TRACKING_URI "
            "changed). Its steps so far stay in the store it started in; this resume "
            "reports to a new MLflow run in %s. Resume with the old value to continue "
            "that run instead.",
            run_id,
            where.shown,
            where.shown,
        )
        return False
    client.update_run(run_id, status="RUNNING")
    return True


@register_tracker("mlflow")
class MlflowTracker(Tracker):
    def start(
        self,
        where: Place,
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
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        with _store_lock(where):
            # The client's file store writes the default experiment on a fresh folder.
            self.client = MlflowClient(tracking_uri=where.uri)
            if resume_id and _continued(self.client, resume_id, where):
                self.run_id = resume_id
                return resume_id
            experiment = self.client.get_experiment_by_name(project)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                try:
                    experiment_id = self.client.create_experiment(project)
                except MlflowException:  # another job made it meanwhile (a server)
                    experiment_id = self.client.get_experiment_by_name(project).experiment_id
        tags = self.sweep.tags() if self.sweep is not None else {}
        if self.sweep is not None:
            tags["swept"] = ",".join(sorted(self.sweep.swept))
        run = self.client.create_run(experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        params = _params(config, self.sweep)
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
