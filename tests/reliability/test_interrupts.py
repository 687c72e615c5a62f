"""SIGINT, SIGTERM and SIGHUP keep the work: the step in progress finishes, a checkpoint
is written, the metrics are flushed, and the printed command resumes to the very weights
an uninterrupted run reaches, a reward's draws from Python's and NumPy's generators
included. A signal at start-up ends the command with one line and the shell's status; a
stop before the first checkpoint leaves a folder the printed command starts afresh; a
step that fails after a stop request still leaves the last finished step saved (real
processes, real signals)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import ART_HYDRA, run_cli, start_cli, wait_for_steps
from safetensors.torch import load_file

from art_hydra.runs.run_folder import checkpoint_folders, verify

pytestmark = pytest.mark.slow

FAULT = [
    "trainer.max_steps=30",
    "trainer.per_device_train_batch_size=32",
    "checkpoint.every_steps=10",
    "checkpoint.keep_last=5",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]
FINAL = "checkpoints/step-000030/model.safetensors"
#: A hang guard for a whole run (not a measure of speed): a loaded machine running the
#: tiers on two xdist workers took over 120 s for the 30 steps.
WHOLE_RUN = 600


def same_weights(a: Path, b: Path) -> bool:
    left, right = load_file(a), load_file(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("whole")
    proc = run_cli(*FAULT, "hydra.run.dir=run", cwd=cwd, timeout=WHOLE_RUN)
    assert proc.returncode == 0, proc.stderr
    return cwd / "run"


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_a_signal_saves_the_last_step_and_prints_the_resume_command(
    tmp_path: Path, uninterrupted: Path, signum: int, code: int
) -> None:
    run = tmp_path / "run"
    proc = start_cli(*FAULT, f"hydra.run.dir={run}", cwd=tmp_path)
    wait_for_steps(run, 4, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    assert f"stopped by {signal.Signals(signum).name}" in err and f"after step {steps} of 30" in err
    newest = checkpoint_folders(run / "checkpoints")[-1]
    assert newest.name == f"step-{steps:06d}" and verify(newest) is None
    command = shlex.split(err.split("Resume with:")[1].strip().splitlines()[0])
    assert command[0] == "art-hydra" and "resume=true" in command
    resumed = run_cli(*command[1:], cwd=tmp_path, timeout=WHOLE_RUN)
    assert resumed.returncode == 0, resumed.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 30
    assert same_weights(run / FINAL, uninterrupted / FINAL)


def test_sighup_with_the_terminal_gone_still_saves_and_logs_the_resume_command(
    tmp_path: Path,
) -> None:
    """A closed terminal: every write to it fails (the progress bar's included); the run
    still saves its last step, exits 129, and its log file holds the resume command."""
    run = tmp_path / "run"
    proc = start_cli(
        *FAULT,
        "logging.progress_bar=on",
        "checkpoint.every_steps=0",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    wait_for_steps(run, 2, proc)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=60) == 129
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    newest = checkpoint_folders(run / "checkpoints")[-1]
    assert newest.name == f"step-{steps:06d}" and verify(newest) is None
    logged = (run / "art_hydra.log").read_text()
    assert f"stopped by SIGHUP (terminal closed) after step {steps}" in logged
    assert "Resume with:" in logged


def test_a_second_ctrl_c_exits_at_once_leaving_only_whole_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start_cli(*FAULT, "checkpoint.every_steps=1", f"hydra.run.dir={run}", cwd=tmp_path)
    wait_for_steps(run, 3, proc)
    proc.send_signal(signal.SIGINT)
    # Two signals that land before Python runs its handler count as one (CPython keeps
    # one flag per signal), so the second is sent once the first has been taken up.
    assert proc.stderr is not None
    before = ""
    while "received" not in before:
        line = proc.stderr.readline()
        assert line, f"the run ended without taking up the first signal:\n{before}"
        before += line
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=30)  # a hang guard, not a measure of speed
    err = before + rest
    assert proc.returncode == 130
    assert "second interrupt" in err and "Traceback" not in err
    assert all(verify(folder) is None for folder in checkpoint_folders(run / "checkpoints"))


def test_the_resume_command_runs_from_any_directory(tmp_path: Path) -> None:
    """The printed command names the run folder absolutely."""
    run = tmp_path / "run"
    proc = start_cli(*FAULT, "hydra.run.dir=run", cwd=tmp_path)
    wait_for_steps(run, 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    command = err.split("Resume with:")[1].strip().splitlines()[0]
    assert f"hydra.run.dir={run.resolve()}" in command
    assert Path(ART_HYDRA).name == "art-hydra"


# ---- start-up, and a stop before the first checkpoint ---------------------------------

QUICK_RUN = [
    "trainer.max_steps=12",
    "trainer.per_device_train_batch_size=16",
    "checkpoint.every_steps=0",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared:\n{proc.communicate()[1]}")
        time.sleep(0.01)


def _wait_for_own_handlers(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the command has installed its own stop handlers (SIGTERM caught, as
    /proc/PID/status shows), the first thing art_hydra does: a signal before it lands in
    the interpreter's own start, which no program's code can answer. Under load that
    start may outlast any fixed sleep."""
    deadline = time.monotonic() + timeout
    status = Path(f"/proc/{proc.pid}/status")
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            lines = status.read_text().splitlines()
        except OSError:  # it has just ended: poll() says so next time round
            lines = []
        caught = next((line.split()[1] for line in lines if line.startswith("SigCgt")), "0")
        if int(caught, 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.002)
    raise AssertionError(f"the command never installed its stop handlers:\n{proc.communicate()[1]}")


@pytest.mark.parametrize(
    ("signum", "moment"),
    [
        (signal.SIGINT, "imports"),  # the command's own imports (hydra, omegaconf)
        (signal.SIGTERM, "composition"),
        (signal.SIGHUP, "hydra started"),  # the job's log exists: model load, first step
        (signal.SIGINT, "hydra started"),
    ],
)
def test_a_signal_at_start_up_ends_with_one_line_and_no_traceback(
    tmp_path: Path, signum: int, moment: str
) -> None:
    run = tmp_path / "run"
    proc = start_cli(*QUICK_RUN, f"hydra.run.dir={run}", cwd=tmp_path)
    if moment == "imports":
        _wait_for_own_handlers(proc)
    elif moment == "composition":
        time.sleep(0.6)
    else:
        _wait_for(run / "art_hydra.log", proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == 128 + signum, err
    assert signal.Signals(signum).name in err
    # Whatever the moment, a folder without a checkpoint holds no run record: the same
    # command starts it (a loaded machine may let the first step finish and be saved).
    if not checkpoint_folders(run / "checkpoints"):
        assert not (run / "run_config.yaml").exists() and not (run / "metrics.jsonl").exists()


@pytest.mark.parametrize("ending", ["the step then fails", "a second signal"])
def test_a_stop_before_the_first_checkpoint_leaves_a_folder_the_printed_command_restarts(
    tmp_path: Path, ending: str
) -> None:
    """Step 1 is held in its reward (nothing can be saved yet); the stop ends the run
    through the held step failing, or through a second signal."""
    env = _noisy_folder(tmp_path)
    run = tmp_path / "run"
    (tmp_path / "block").touch()
    proc = start_cli(*RNG_RUN, f"hydra.run.dir={run}", cwd=tmp_path, env=env)
    _wait_for(tmp_path / "blocked", proc)
    assert (run / "run_config.yaml").exists()  # the run had begun its record
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)  # the handler runs between the main thread's bytecodes
    if ending == "a second signal":
        proc.send_signal(signal.SIGINT)
    else:
        (tmp_path / "release").touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not checkpoint_folders(run / "checkpoints")
    for record in ("run_config.yaml", "metrics.jsonl", "completions.jsonl", "run_identity.json"):
        assert not (run / record).exists(), record
    command = shlex.split(err.split("starts it afresh:")[1].strip().splitlines()[0])
    assert command[0] == "art-hydra" and "resume=true" not in command
    assert f"hydra.run.dir={run.resolve()}" in command
    if ending == "a second signal":
        return  # the same folder state and command as the other ending, which runs it
    for cue in ("block", "blocked", "release"):
        (tmp_path / cue).unlink(missing_ok=True)
    again = run_cli(*command[1:], cwd=tmp_path, env=env, timeout=WHOLE_RUN)
    assert again.returncode == 0, again.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 6


def test_a_run_started_under_nohup_survives_sighup(tmp_path: Path) -> None:
    """nohup ignores SIGHUP so a run outlives its terminal: it stays ignored."""
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(
        ["nohup", ART_HYDRA, *QUICK_RUN, "trainer.max_steps=6", f"hydra.run.dir={run}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for_steps(run, 2, proc)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 6


# ---- a reward that draws from Python's and NumPy's generators -------------------------

NOISY = """
import os, random, time

import numpy


def noisy(prompt, completion, answer):
    # The test's cue: hold this step, then fail it (on the model's completions, not on the
    # pre-flight's call, which scores each row's own answer).
    if os.path.exists("block") and completion.strip() != (answer or "").strip():
        open("blocked", "w").close()
        while not os.path.exists("release"):
            time.sleep(0.01)
        raise ValueError("the test failed this step on purpose")
    exact = float(completion.strip() == (answer or "").strip())
    return exact + 0.25 * random.random() + 0.25 * float(numpy.random.random())
"""

RNG_RUN = [
    "trainer.max_steps=6",
    "trainer.per_device_train_batch_size=16",
    "checkpoint.every_steps=0",
    "task.allowed_modules=[noisy_reward]",
    "task.reward._target_=noisy_reward.noisy",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]
RNG_FINAL = "checkpoints/step-000006/model.safetensors"


def _noisy_folder(folder: Path) -> dict[str, str]:
    (folder / "noisy_reward.py").write_text(NOISY)
    return {"PYTHONPATH": str(folder)}


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    clocks = ("tokens_per_s", "step_time_s", "time")
    return [{k: v for k, v in r.items() if k not in clocks} for r in rows]


@pytest.fixture(scope="module")
def noisy_whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("noisy_whole")
    proc = run_cli(
        *RNG_RUN, "hydra.run.dir=run", cwd=cwd, env=_noisy_folder(cwd), timeout=WHOLE_RUN
    )
    assert proc.returncode == 0, proc.stderr
    return cwd / "run"


def _resume(err: str, cwd: Path, env: dict[str, str]) -> None:
    command = shlex.split(err.split("Resume with:")[1].strip().splitlines()[0])
    resumed = run_cli(*command[1:], cwd=cwd, env=env, timeout=WHOLE_RUN)
    assert resumed.returncode == 0, resumed.stderr


def test_a_reward_drawing_from_python_and_numpy_resumes_bitwise(
    tmp_path: Path, noisy_whole: Path
) -> None:
    env = _noisy_folder(tmp_path)
    run = tmp_path / "run"
    proc = start_cli(*RNG_RUN, f"hydra.run.dir={run}", cwd=tmp_path, env=env)
    wait_for_steps(run, 3, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    _resume(err, tmp_path, env)
    assert _metrics(run) == _metrics(noisy_whole)
    assert same_weights(run / RNG_FINAL, noisy_whole / RNG_FINAL)


def test_a_step_failing_after_a_stop_request_leaves_the_last_finished_step_saved(
    tmp_path: Path, noisy_whole: Path
) -> None:
    env = _noisy_folder(tmp_path)
    run = tmp_path / "run"
    proc = start_cli(*RNG_RUN, f"hydra.run.dir={run}", cwd=tmp_path, env=env)
    wait_for_steps(run, 3, proc)
    (tmp_path / "block").touch()
    _wait_for(tmp_path / "blocked", proc)  # the next step is scoring, and held
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)  # the handler runs between the main thread's bytecodes
    (tmp_path / "release").touch()  # the held step now fails
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    finished = len((run / "metrics.jsonl").read_text().splitlines())
    assert f"stopped by SIGTERM after step {finished} of 6" in err
    assert "then failed" in err and "ValueError" in err
    newest = checkpoint_folders(run / "checkpoints")[-1]
    assert newest.name == f"step-{finished:06d}" and verify(newest) is None
    # The saved step is the finished one, exactly: resuming reaches the same run.
    for cue in ("block", "blocked", "release"):
        (tmp_path / cue).unlink()
    _resume(err, tmp_path, env)
    assert _metrics(run) == _metrics(noisy_whole)
    assert same_weights(run / RNG_FINAL, noisy_whole / RNG_FINAL)
