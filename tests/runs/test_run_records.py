"""What a run says, decided without a run: the progress lines' cadence and text, the
busy-CPU decision and its warning, the start summary's lines, the row layout's reason,
and which keys a metric line holds per algorithm (readers skip its ``time``)."""

from __future__ import annotations

import logging
import re
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from art_hydra import compose
from art_hydra.config.objective import (
    NOT_IN_SFT,
    STEP_METRICS,
    logged_metrics,
    resolve,
)
from art_hydra.config.schema import AlgorithmName
from art_hydra.engine.cpu_load import MEASURED_SLOWDOWN, busy_message, cpu_is_busy, warn_if_busy
from art_hydra.engine.metrics import metric_line, plot_curve
from art_hydra.engine.result import objective_value, windowed_metrics
from art_hydra.runs.progress import clock, progress_due, progress_line

# ---- progress lines --------------------------------------------------------------------


def _due(step: int, since: float | None, every_steps: int = 0, every_s: float = 30.0) -> bool:
    return progress_due(
        step,
        first_step=1,
        max_steps=100,
        every_steps=every_steps,
        every_s=every_s,
        since_last_s=since,
    )


def test_a_progress_line_comes_at_the_first_and_last_step_and_by_time() -> None:
    assert _due(1, None)  # the run has started
    assert _due(100, 0.0)  # and it ended
    assert not _due(2, 1.0) and not _due(50, 29.9)  # by time only (every_steps=0)
    assert _due(50, 30.0)


def test_a_progress_line_comes_every_n_steps_or_s_seconds_whichever_first() -> None:
    assert _due(10, 0.5, every_steps=10) and not _due(11, 0.5, every_steps=10)
    assert _due(11, 31.0, every_steps=10)  # the seconds came first
    assert not _due(5, 4.0, every_steps=10, every_s=5.0) and _due(5, 5.0, every_s=5.0)


def test_a_resumed_run_reports_its_first_step() -> None:
    common = {"max_steps": 30, "every_steps": 0, "every_s": 30.0, "since_last_s": None}
    assert progress_due(21, first_step=21, **common)


def test_the_progress_line_says_step_reward_loss_speed_elapsed_and_eta() -> None:
    record = {"step": 10, "reward_mean": 0.4375, "loss": 0.012345, "tokens_per_s": 2450.4}
    line = progress_line(record, 40, elapsed_s=20.0, steps_done=10)
    assert line == (
        "progress: step 10/40 | reward 0.438 | loss 0.01235 | 2,450 tok/s | elapsed 0:20 | ETA 1:00"
    )


def test_an_sft_progress_line_has_no_reward_and_a_resumed_eta_counts_its_own_steps() -> None:
    line = progress_line({"step": 25, "loss": 1.5, "tokens_per_s": 100.0}, 30, 50.0, 5)
    assert "reward" not in line and "loss 1.5" in line and "ETA 0:50" in line


def test_clock() -> None:
    assert clock(0) == "0:00" and clock(61.4) == "1:01" and clock(3725) == "1:02:05"


# ---- busy CPU --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("load", "cores", "threads", "device", "busy"),
    [
        (1.0, 2, None, "cpu", True),  # half the cores
        (0.99, 2, None, "cpu", False),
        (12.0, 16, None, "cpu", True),
        (7.9, 16, None, "cpu", False),
        (8.0, 2, 1, "cpu", False),  # the user chose the threads
        (8.0, 2, 2, "cpu", False),
        (8.0, 2, None, "cuda", False),  # the GPU computes
    ],
)
def test_the_busy_decision(load: float, cores: int, threads: int | None, device: str, busy: bool):
    assert cpu_is_busy(load, cores, threads, device) is busy


def test_the_warning_names_the_load_the_fix_and_its_cost(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="art_hydra.cpu_load"):
        message = warn_if_busy("cpu", None, load=3.5, cores=2)
    assert message is not None and message == busy_message(3.5, 2)
    (record,) = [r for r in caplog.records if r.name == "art_hydra.cpu_load"]
    text = record.getMessage()
    assert "load average 3.50 on 2 usable core(s)" in text
    assert "backend.cpu_threads=1" in text and f"{MEASURED_SLOWDOWN}x slower" in text
    assert "not bit-identical" in text and "resume must keep the same value" in text
    assert "Warning" not in text  # the quiet-run test's word for a library warning


def test_no_warning_where_the_check_does_not_apply(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="art_hydra.cpu_load"):
        assert warn_if_busy("cpu", None, load=0.1, cores=2) is None
        assert warn_if_busy("cpu", 1, load=9.0, cores=2) is None
        assert warn_if_busy("cuda", None, load=9.0, cores=2) is None
    assert not caplog.records


# ---- metric lines ----------------------------------------------------------------------

RECORD = {
    "step": 3,
    **{name: 0.5 for name in STEP_METRICS},
    "reward_mean": None,
    "reward/char_overlap/mean": 0.5,
}


def test_an_sft_line_drops_the_rl_keys_and_an_rl_line_keeps_every_key() -> None:
    sft = metric_line(dict(RECORD), AlgorithmName.sft)
    assert not NOT_IN_SFT & sft.keys()
    assert set(sft) == {"step", "time", *(m for m in STEP_METRICS if m not in NOT_IN_SFT)} | {
        "reward/char_overlap/mean"
    }
    rl = metric_line(dict(RECORD), AlgorithmName.rl)
    assert set(rl) == {"time", *RECORD}
    assert list(rl)[:2] == ["step", "time"]


def test_a_line_carries_its_wall_clock_as_iso_8601_utc() -> None:
    stamp = metric_line({"step": 1, "loss": 1.0})["time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
    assert datetime.fromisoformat(stamp.replace("Z", "+00:00")).utcoffset().total_seconds() == 0


def test_the_sft_catalogue_and_the_sft_line_agree() -> None:
    """The objective's list of SFT metrics and the writer drop the same keys."""
    assert not NOT_IN_SFT & set(logged_metrics(AlgorithmName.sft))
    assert set(logged_metrics(AlgorithmName.rl)) >= NOT_IN_SFT


def test_readers_skip_the_time(tmp_path: Path) -> None:
    rows = [metric_line({"step": s, "loss": 1.0 / s, "reward_mean": 0.1 * s}) for s in (1, 2)]
    spec = resolve(compose(["objective.window=2", "objective.reduce=mean"]).objective, "rl")
    assert objective_value(spec, rows) == pytest.approx(0.15)
    assert "time" not in windowed_metrics(spec, rows)
    import json

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_curve(tmp_path, "loss", "loss.png") is not None


# ---- the start summary and the row layout ---------------------------------------------


def _loaded(reason: str) -> SimpleNamespace:
    """A loaded model as the summary reads it (no torch on the fast tier)."""
    weight = SimpleNamespace(dtype="torch.float32")
    model = SimpleNamespace(config=SimpleNamespace(model_type="llama"), parameters=lambda: [weight])
    layout = SimpleNamespace(reason=reason)
    return SimpleNamespace(model=model, device="cpu", autocast=None, layout=layout)


def test_the_start_summary_says_model_device_data_batch_and_layout() -> None:
    from art_hydra.runs.start_summary import summary_lines

    cfg = compose(["trainer.per_device_train_batch_size=16", "trainer.max_steps=7"])
    task = SimpleNamespace(
        name="reverse",
        examples=[SimpleNamespace(prompt=p) for p in ("ab=", "ab=", "ba=")],
    )
    lines = summary_lines(cfg, _loaded("packed: ..."), task, "model tiny: 6 trainable", 1, 2)
    assert lines == [
        "model tiny: 6 trainable; family llama",
        "device cpu, 2 torch thread(s): float32 weights, computing in float32 (model.dtype=auto)",
        "data: task reverse, 3 examples, 2 distinct prompts",
        "batch: RL, 16 completions per optimizer step (2 prompt group(s) x 8 completions); 7 steps",
        "row layout: packed: ...",
    ]
    sft = compose(["algorithm=sft", "trainer.gradient_accumulation_steps=2"])
    (batch,) = [line for line in summary_lines(sft, _loaded("x"), task, "m", 2) if "batch" in line]
    assert "x 2 accumulation step(s)" in batch and "on each of 2 ranks" in batch


def test_the_row_layout_says_what_it_is_and_why() -> None:
    from art_hydra.engine.backends.layout import row_layout

    packed = SimpleNamespace(model_type="llama", _attn_implementation="sdpa")
    assert row_layout(packed, 64).reason == (
        "packed: several sequences share each row, kept apart by a block-diagonal boolean "
        "mask, because packing is proven for the llama family and its attention "
        "implementation (sdpa) honours such a mask"
    )
    unknown = SimpleNamespace(model_type="bert2", _attn_implementation="sdpa")
    assert row_layout(unknown, 64).reason == (
        "one sequence per row, right-padded (no packing), because packing is not proven "
        "for the 'bert2' family"
    )


# ---- art_hydra.log holds a refusal -----------------------------------------------------


def _file_log(path: Path) -> logging.FileHandler:
    handler = logging.FileHandler(path)
    logging.getLogger().addHandler(handler)
    return handler


@pytest.mark.parametrize(
    ("key", "saved", "logged"),
    [("trainer.max_steps", False, True), ("hydra.run.dir", False, False), ("seed", True, False)],
)
def test_a_refused_job_says_why_in_its_log_file(
    tmp_path: Path, key: str, saved: bool, logged: bool
) -> None:
    """A job refused by its own checks writes the report to its log file, unless a
    problem is about the folder or the folder holds a run (a refused resume changes no
    file of it)."""
    from art_hydra.config.problems import ConfigValidationError, Problem
    from art_hydra.run import _refusal_in_log

    if saved:
        (tmp_path / "run_config.yaml").write_text("seed: 1\n")
    handler = _file_log(tmp_path / "art_hydra.log")
    try:
        _refusal_in_log(
            tmp_path, ConfigValidationError([Problem(key, 3, "it cannot work", f"{key}=4")])
        )
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    text = (tmp_path / "art_hydra.log").read_text()
    assert ("the run was refused" in text and "it cannot work" in text) is logged
    assert bool(text) is logged
