"""Weights & Biases through ``wandb``: ``wandb.init`` with its folder inside the run
folder and the resolved config, ``run.log`` for metrics, a ``wandb.Table`` per logged
step's completions, the objective in the run's summary. The run id is kept in the run
folder, so a resume continues the same W&B run. ``WANDB_MODE=offline`` works with no
account (``wandb sync`` uploads the folder later)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from art_hydra.trackers.base import Tracker, register_tracker, sample_rows, table

#: wandb's own folders, each pointed inside the run folder (its defaults are in the home
#: directory and the working directory).
DIRS = {
    "WANDB_DIR": "",
    "WANDB_CACHE_DIR": "cache",
    "WANDB_CONFIG_DIR": "config",
    "WANDB_DATA_DIR": "data",
    "WANDB_ARTIFACT_DIR": "artifacts",
}


def point_dirs(folder: Path) -> None:
    """Send every folder wandb writes to into ``folder``."""
    for var, sub in DIRS.items():
        path = folder / sub if sub else folder
        path.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(path)


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
        folder: Path,
        config: dict[str, Any],
        run_name: str,
        project: str,
        resume_id: str | None,
    ) -> str | None:
        point_dirs(folder)
        import wandb

        self.wandb = wandb
        run_id = resume_id or new_id()
        self.run = wandb.init(
            project=project,
            name=run_name,
            id=run_id,
            resume="allow",
            dir=str(folder),
            config=config,
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
