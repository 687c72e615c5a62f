"""TensorBoard through torch's ``SummaryWriter``: the metrics as scalars, the resolved
config and each step's completions as text, the job's overrides and objective through
the HParams plugin (into the run's own event folder, so a sweep's jobs sit side by side
in one HParams view; ``add_hparams`` would open a second folder per job)."""

from __future__ import annotations

import math
from typing import Any

from art_hydra.runs.run_folder import UnsafePath, entry_kind
from art_hydra.trackers.base import Tracker, register_tracker, sample_rows, table
from art_hydra.trackers.placement import Place


def _markdown_cell(value: Any) -> str:
    text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", "<br>")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Rows as a Markdown table (TensorBoard's text plugin renders Markdown)."""
    columns, _ = table(rows)
    columns = [c for c in columns if c not in ("step", "kind")]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_markdown_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


@register_tracker("tensorboard")
class TensorBoardTracker(Tracker):
    def start(
        self,
        where: Place,
        config: dict[str, Any],
        run_name: str,
        project: str,
        resume_id: str | None,
    ) -> str | None:
        folder = where.folder
        if entry_kind(folder) not in (None, "folder"):
            raise UnsafePath(
                f"{folder} is a {entry_kind(folder)}, not the run's own folder: the event "
                "files would be written through it. Remove it, or logging.tensorboard=false."
            )
        from torch.utils.tensorboard import SummaryWriter

        resuming = self.resume_step is not None
        self.writer = SummaryWriter(
            log_dir=str(folder), purge_step=self.resume_step + 1 if resuming else None
        )
        if config and not resuming:
            import yaml

            text = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
            # Indented four spaces: a Markdown code block, shown as written.
            self.writer.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()))
        return None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            # eval/<name> keys keep their own section; the rest are train/<key> as before.
            tag = key if key.startswith("eval/") else f"train/{key}"
            self.writer.add_scalar(tag, value, step)

    def track_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        rows = sample_rows(step, kind, samples)
        if rows:
            self.writer.add_text(f"completions/{kind}", markdown_table(rows), step)

    def summary(self, hparams: dict[str, Any], values: dict[str, float]) -> None:
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        experiment, start, end = hparams_summary(hparams, values)
        for summary in (experiment, start, end):
            self.writer.file_writer.add_summary(summary)
        self.writer.flush()

    def scalar(self, tag: str, value: float, step: int) -> None:
        if math.isfinite(value):
            self.writer.add_scalar(tag, value, step)

    def close(self, status: str) -> None:
        self.writer.close()
