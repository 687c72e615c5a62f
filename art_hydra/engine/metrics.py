"""The run's record: metrics.jsonl, the trackers (TensorBoard, W&B, MLflow, Trackio), a
progress bar (or plain progress lines, :mod:`art_hydra.runs.progress`), the final plot.

Every file here is opened without following a symbolic link and must be a regular file
(:func:`art_hydra.runs.run_folder.open_record`); files rewritten whole go through an
exclusively created temp file and a rename, so a link planted in the run folder never
turns a write into one outside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_hydra import moved, safe_json
from art_hydra.config.run_files import COMPLETIONS, EVAL_COMPLETIONS, METRICS
from art_hydra.config.secrets import scrub_data
from art_hydra.config.tracker_names import TENSORBOARD, chosen_trackers
from art_hydra.runs.run_folder import (
    exclusive_temp,
    open_append,
    read_record,
    write_atomic,
)

if TYPE_CHECKING:
    from art_hydra.config.schema import LoggingConfig

log = moved.logger(__name__)  # the name it logged under before the move


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return _parse_jsonl(path)[0]


def _parse_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of a JSONL log, and the numbers of lines that are not records (a line
    torn by a kill or a full disk)."""
    text = read_record(path)
    if text is None:
        return [], []
    rows, torn = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = safe_json.loads(line)  # bounded depth: a tampered line is dropped
        except ValueError:
            torn.append(number)
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            rows.append(record)
        else:
            torn.append(number)
    return rows, torn


def _truncate_after(path: Path, step: int) -> None:
    """Keep the records up to ``step`` (the resumed run writes the rest again), dropping
    torn lines with a word about each."""
    rows, torn = _parse_jsonl(path)
    if not rows and not torn:
        return
    for number in torn:
        log.warning(
            "%s:%d: dropped a torn line (a write interrupted by a kill or a full disk)",
            path,
            number,
        )
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= step))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return _read_jsonl(Path(run_dir) / METRICS)


def utc_now() -> str:
    """The wall clock as ISO-8601 UTC (``2026-12-05T08:00:00.123Z``): the ``time`` of a
    metric line or a samples line, so a line can be matched to the log and the machine."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def metric_line(record: dict[str, Any], algorithm: Any = None) -> dict[str, Any]:
    """A step's metrics as its metrics.jsonl line: the step, the wall-clock ``time``, then
    only the keys its algorithm has (an SFT line drops the RL keys of
    :data:`~art_hydra.config.objective.NOT_IN_SFT`, which it would hold as null or 0).
    ``algorithm`` None keeps every key. Readers skip ``time``: it is not a number."""
    from art_hydra.config.objective import NOT_IN_SFT

    sft = getattr(algorithm, "name", algorithm) == "sft"
    line: dict[str, Any] = {"step": record["step"], "time": utc_now()}
    for key, value in record.items():
        if key in ("step", "time") or (sft and key in NOT_IN_SFT):
            continue
        line[key] = value
    return line


class MetricsLog:
    """Writes one JSON line per logged step and fans it out to the trackers the run
    chose (``logging.report_to``); reads ``cfg.logging``. ``config``: the run's resolved
    config, given to the trackers (TensorBoard as text, the others as their config)."""

    def __init__(
        self,
        run_dir: Path,
        logging_cfg: LoggingConfig,
        max_steps: int,
        resume_step: int | None = None,
        algorithm: Any = None,
        config: Any = None,
    ) -> None:
        self.cfg = logging_cfg
        #: ``cfg.algorithm.name``: which keys its metric lines hold (None: all).
        self.algorithm = algorithm
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS
        self.max_steps = max_steps
        start = resume_step or 0
        if resume_step is not None:
            # Drop lines written after the checkpoint: the resumed run writes them again.
            for name in (METRICS, COMPLETIONS, EVAL_COMPLETIONS):
                _truncate_after(self.run_dir / name, resume_step)
        self._file = open_append(self.path)  # closed in close()
        self._samples: Any = None
        self._eval_samples: Any = None
        self.trackers: Any = None
        if chosen_trackers(logging_cfg):
            from art_hydra.config.secrets import redacted
            from art_hydra.trackers import open_trackers

            # As a record may show it: expressions and ***, never a secret's value.
            plain = redacted(config) if config is not None else None
            try:
                self.trackers = open_trackers(self.run_dir, logging_cfg, plain, resume_step)
            except BaseException:
                self._file.close()
                raise
        show = {"on": True, "off": False}.get(logging_cfg.progress_bar, sys.stdout.isatty())
        self._bar = None
        if show:
            import shutil

            from tqdm import tqdm

            # shutil falls back to 80 columns where a terminal reports a size of 0.
            width = shutil.get_terminal_size().columns
            self._bar = tqdm(total=max_steps, initial=start, unit="step", ncols=width)
        from art_hydra.runs.progress import PlainProgress

        # Plain lines on stdout where no bar shows; in the log file either way.
        self._progress = PlainProgress(logging_cfg, max_steps, start, print_lines=not show)

    def log(self, record: dict[str, Any]) -> None:
        record = scrub_data(metric_line(record, self.algorithm))  # a name made of a secret
        step = record["step"]
        if self._bar is not None:
            try:
                self._bar.update(1)
                postfix = {
                    "loss": f"{record['loss']:.4f}",
                    "tok/s": f"{record['tokens_per_s']:.0f}",
                }
                if record.get("tool_calls_mean") is not None:
                    postfix = {"tools": f"{record['tool_calls_mean']:.2f}", **postfix}
                if record.get("reward_mean") is not None:
                    postfix = {"reward": f"{record['reward_mean']:.3f}", **postfix}
                self._bar.set_postfix(postfix)
            except OSError:  # the terminal closed (SIGHUP): the record matters, not the bar
                self._bar = None
        self._progress.update(record)
        # A step that evaluated is always written: its eval/* keys are in no other line.
        if not self.due(step) and not any(k.startswith("eval/") for k in record):
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.trackers:
            self.trackers.log_metrics(record)

    def due(self, step: int) -> bool:
        """Every ``logging.every_steps``-th step, and always the run's last one: a run
        shorter than the interval, or one that ends between two multiples, still records
        where it ended (the final metrics, the plot's last point, the sweep's objective)."""
        return step % self.cfg.every_steps == 0 or step == self.max_steps

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """Append a step's example completions to completions.jsonl."""
        if not samples or not self.due(step):
            return
        samples = scrub_data(samples)  # a prompt built from a secret shows *** instead
        if self._samples is None:
            self._samples = open_append(self.run_dir / COMPLETIONS)
        line = {"step": step, "time": utc_now(), "samples": samples}
        self._samples.write(json.dumps(line) + "\n")
        self._samples.flush()
        self.track_samples(step, "train", samples)

    def track_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        """Hand a step's samples (``kind``: train or eval) to every tracker as a table."""
        if self.trackers:
            self.trackers.track_samples(step, kind, samples)

    def log_eval_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """Append an evaluation's completions to eval_completions.jsonl (every
        evaluation's, whatever logging.every_steps)."""
        if not samples:
            return
        samples = scrub_data(samples)
        if self._eval_samples is None:
            self._eval_samples = open_append(self.run_dir / EVAL_COMPLETIONS)
        line = {"step": step, "time": utc_now(), "samples": samples}
        self._eval_samples.write(json.dumps(line) + "\n")
        self._eval_samples.flush()
        self.track_samples(step, "eval", samples)

    def log_hparams(self, hparams: dict[str, Any], metric: str, value: float, step: int) -> None:
        """Hand the job's hyperparameters (its overrides and status) and its objective to
        the trackers: TensorBoard writes them into this run's own event folder, so its
        HParams view lists every job of a sweep side by side (``add_hparams`` would open a
        second run folder per job); the others keep them in their run's summary."""
        if not self.trackers:
            return
        tag = f"objective/{metric}"
        self.trackers.summary(hparams, {tag: value})
        board = self.trackers.get(TENSORBOARD)
        if board is not None:
            board.scalar(tag, value, step)  # type: ignore[attr-defined]

    def close(self, status: str = "done") -> None:
        """Close the record; ``status`` (done, failed, interrupted) ends each tracker's run."""
        if self._samples is not None:
            self._samples.close()
        if self._eval_samples is not None:
            self._eval_samples.close()
        if self._bar is not None:
            with contextlib.suppress(OSError):  # a closed terminal
                self._bar.close()
        if self.trackers is not None:
            self.trackers.close(status)
        self._file.close()


def plot_curve(run_dir: Path, key: str, filename: str) -> Path | None:
    """Draw ``key`` (with its std band when logged) against step into a PNG, atomically."""
    rows = [m for m in read_metrics(run_dir) if isinstance(m.get(key), (int, float))]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in rows]
    values = [m[key] for m in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(steps, values, label=key)
    std_key = key.replace("_mean", "_std")
    if std_key != key and all(std_key in m for m in rows):
        std = [m[std_key] for m in rows]
        low = [v - s for v, s in zip(values, std, strict=True)]
        high = [v + s for v, s in zip(values, std, strict=True)]
        ax.fill_between(steps, low, high, alpha=0.2, label=std_key)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    target = Path(run_dir) / filename
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tmp")
    with os.fdopen(exclusive_temp(tmp), "wb") as handle:
        fig.savefig(handle, format="png")
    plt.close(fig)
    os.replace(tmp, target)
    return target
