"""Weights & Biases through ``wandb``: ``wandb.init`` with its folder inside the run
folder (unless WANDB_DIR or ``logging.trackers_dir`` says otherwise) and the resolved
config; a sweep's job in the sweep's group (``group=``), named by its swept overrides,
tagged with its job number, the swept keys and ``sweep.*`` in its config; ``run.log``
for metrics, a ``wandb.Table`` per logged step's completions, the objective in the run's
summary. The run id is kept in the run folder, so a resume continues the same W&B run.
``WANDB_MODE=offline`` works with no account (``wandb sync`` uploads the folder later)."""

from __future__ import annotations

import os
from typing import Any

from art_hydra.trackers.base import Tracker, register_tracker, sample_rows, table
from art_hydra.trackers.placement import DEFAULT, Place, set_ours, users

#: wandb's own folders, each pointed inside the run folder (its defaults are in the home
#: directory and the working directory).
DIRS = {
    "WANDB_DIR": "",
    "WANDB_CACHE_DIR": "cache",
    "WANDB_CONFIG_DIR": "config",
    "WANDB_DATA_DIR": "data",
    "WANDB_ARTIFACT_DIR": "artifacts",
}


def point_dirs(where: Place) -> None:
    """Send every folder wandb writes to into ``where.folder`` (``wandb/`` below it holds
    the runs); a variable of the user's stays as it is. Under a folder the user chose
    (``logging.trackers_dir``, WANDB_DIR) the cache, config, data and artifact folders go
    inside wandb's own ``wandb/``, so ``.`` gives TRL's ``./wandb`` and nothing else."""
    base = where.folder if where.chosen_by == DEFAULT else where.folder / "wandb"
    for var, sub in DIRS.items():
        if users(var):
            continue
        path = base / sub if sub else where.folder
        path.mkdir(parents=True, exist_ok=True)
        set_ours(var, str(path))


def new_id() -> str:
    """A W&B run id: eight characters of [a-z0-9], as wandb makes its own."""
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


@register_tracker("wandb")
class WandbTracker(Tracker):
    def start(
        self,
        where: Place,
        config: dict[str, Any],
        run_name: str,
        project: str,
        resume_id: str | None,
    ) -> str | None:
        point_dirs(where)
        import wandb

        self.wandb = wandb
        run_id = resume_id or new_id()
        sweep = self.sweep
        if sweep is not None:  # the swept keys' values by name, the sweep and job number
            config = {**config, "sweep": sweep.record()}
        self.run = wandb.init(
            project=project,
            name=run_name,
            id=run_id,
            resume="allow",
            dir=os.environ.get("WANDB_DIR") or str(where.folder),
            config=config,
            group=sweep.name if sweep is not None else None,
            tags=[f"job-{sweep.job}"] if sweep is not None and sweep.job is not None else None,
            settings=wandb.Settings(silent=True, console="off", save_code=False),
        )
        return run_id

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def track_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        rows = sample_rows(step, kind, samples)
        if rows:
            columns, data = table(rows)
            self.run.log(
                {f"samples/{kind}": self.wandb.Table(columns=columns, data=data)}, step=step
            )

    def summary(self, hparams: dict[str, Any], values: dict[str, float]) -> None:
        self.run.summary.update({**values, "status": hparams.get("status")})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "done" else 1)
