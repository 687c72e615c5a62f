"""The real command, end to end on the CPU: the default run learns; SFT runs; artifacts."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from conftest import ART_HYDRA, output_of

from art_hydra.engine.metrics import read_metrics

#: These tests train the tiny model.
pytestmark = pytest.mark.slow


def _run_dir(root: Path) -> Path:
    (found,) = root.glob("outputs/*/*/.hydra")
    return found.parent


def test_default_run_learns_and_leaves_its_artifacts(cli, tmp_path: Path) -> None:
    proc = cli(timeout=600)  # `art-hydra`, no arguments
    out = output_of(proc)
    assert proc.returncode == 0, out
    run = _run_dir(tmp_path)
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == list(range(1, len(metrics) + 1))
    rewards = [m["reward_mean"] for m in metrics]
    assert sum(rewards[:5]) / 5 < 0.3, rewards[:5]  # starts near 0
    assert sum(rewards[-10:]) / 10 >= 0.9, rewards[-10:]  # and climbs past 0.9
    for key in (
        "reward_std",
        "loss",
        "grad_norm",
        "learning_rate",
        "kl",
        "entropy",
        "real_token_share",
        "tokens_per_s",
        "step_time_s",
    ):
        assert key in metrics[-1], key
    assert min(m["real_token_share"] for m in metrics) >= 0.85
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    last = sorted((run / "checkpoints").glob("step-*"))[-1]
    assert (last / "model.safetensors").is_file() and (last / "config.json").is_file()
    assert "final reward" in proc.stdout
    # Not a terminal: no progress bar and no download-style bars.
    assert "it/s" not in out and "step/s" not in out and "%|" not in out


def test_sft_run_lowers_the_loss(cli, tmp_path: Path) -> None:
    proc = cli(
        "experiment=tiny_sft_reverse",
        "trainer.max_steps=40",
        "checkpoint.every_steps=20",
        timeout=600,
    )
    assert proc.returncode == 0, output_of(proc)
    run = _run_dir(tmp_path)
    losses = [m["loss"] for m in read_metrics(run)]
    assert len(losses) == 40 and losses[-1] < 0.5 * losses[0]
    assert (run / "loss.png").is_file()


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(
        [
            ART_HYDRA,
            "trainer.max_steps=3",
            "checkpoint.every_steps=0",
            "trainer.per_device_train_batch_size=16",
        ],
        cwd=tmp_path,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
    )
    os.close(terminal)
    chunks = []
    while True:
        ready, _, _ = select.select([controller], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(controller, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(controller)
    screen = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, screen
    assert "3/3" in screen and "reward=" in screen and "tok/s=" in screen


def test_bad_task_data_names_file_and_line(cli, tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "2+2=", "answer": "4"}\n{"prompt": 5}\n')
    proc = cli("task=jsonl", f"task.path={data}", "model.max_seq_length=600")
    out = output_of(proc)
    assert proc.returncode == 1
    assert f"{data}:2: needs a non-empty string 'prompt'" in out
    assert "Traceback" not in out


def test_import_time_of_the_command_stays_light() -> None:
    # Importing the CLI module must not pull torch: the rejection path depends on it.
    code = "import sys, art_hydra.commands.cli; print('torch' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
