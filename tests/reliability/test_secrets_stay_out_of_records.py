"""A token the config reads from the environment (``${oc.env:MY_API_TOKEN}``) reaches the
run that needs it and no record of it: an experiment file from elsewhere (or the command
line) naming the token, even as the task's label, leaves its value in no file of the run
folder (``run_config.yaml``, ``.hydra``, the log, ``result.json``, the metrics, the
TensorBoard event files, an MLflow store) and not in the command's output. The saved
config keeps the expression, so a resume with the same or a rotated token resumes, and a
key whose name looks like a secret's is ``***`` in the log and the trackers even when
its value was written out. Real CLI runs of the tiny default model, two steps."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
from conftest import output_of, run_cli

pytestmark = pytest.mark.slow

TOKEN = "sk-unique-marker-XYZ-31f9c2"
ROTATED = "sk-rotated-marker-QRS-8d07e1"
LITERAL = "literal-session-secret-5b2e"
EXPRESSION = "${oc.env:MY_API_TOKEN}"

#: A generator that needs the token: it refuses to make examples without the real value
#: (the run itself must still resolve the expression).
GENERATOR = """
import os

from art_hydra.tasks.markers import generator
from art_hydra.tasks.toy import reverse_examples


@generator
def examples(rng, num_examples, api_key, **extra):
    if api_key != os.environ["MY_API_TOKEN"]:
        raise ValueError("the generator did not get the token's value")
    yield from reverse_examples(rng, num_examples)
"""

#: An experiment from elsewhere that reads the token into the task's label too (every
#: log line and tracker project naming the task would carry it) and a setting with a
#: default that the run must still resolve.
EXPERIMENT = """# @package _global_
task:
  name: ${oc.env:MY_API_TOKEN}
  generator: keyed_tasks.examples
  num_examples: 40
  params:
    api_key: ${oc.env:MY_API_TOKEN}
trainer:
  max_steps: ${oc.env:ART_HYDRA_UNSET_STEPS,2}
"""

QUICK = [
    "trainer.per_device_train_batch_size=16",
    "logging.progress_bar=off",
    "logging.plot=false",
    "task.allowed_modules=[keyed_tasks]",
    "hydra.run.dir=run",
]


def _setup(root: Path) -> None:
    (root / "keyed_tasks.py").write_text(GENERATOR)
    (root / "conf" / "experiment").mkdir(parents=True)
    (root / "conf" / "experiment" / "keyed.yaml").write_text(EXPERIMENT)


def _env(root: Path, token: str) -> dict[str, str]:
    return {
        "MY_API_TOKEN": token,
        "PYTHONPATH": str(root),
        "HOME": str(root / "home"),
        "MLFLOW_TRACKING_URI": "",
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }


def _run(root: Path, token: str, *args: str) -> subprocess.CompletedProcess:
    conf = ("--config-dir", str(root / "conf"))
    return run_cli(*conf, *QUICK, *args, cwd=root, env=_env(root, token), timeout=300)


def _holding(folder: Path, secret: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Every file under ``folder`` (binary ones too: the TensorBoard event files, an
    MLflow store) whose bytes hold ``secret``."""
    found = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if (
            path.is_file()
            and not relative.startswith(skip)
            and secret.encode() in path.read_bytes()
        ):
            found.append(relative)
    return found


def _assert_nowhere(root: Path, proc: subprocess.CompletedProcess, *secrets: str) -> None:
    assert proc.returncode == 0, output_of(proc)
    for secret in secrets:
        assert secret not in output_of(proc)
        assert _holding(root / "run", secret) == []


def test_a_token_an_experiment_reads_is_in_no_record_and_the_run_resumes(tmp_path: Path) -> None:
    _setup(tmp_path)
    first = _run(tmp_path, TOKEN, "experiment=keyed")
    _assert_nowhere(tmp_path, first, TOKEN)
    run = tmp_path / "run"
    saved = (run / "run_config.yaml").read_text()
    assert f"name: {EXPRESSION}" in saved and f"api_key: {EXPRESSION}" in saved
    assert "${oc.env:ART_HYDRA_UNSET_STEPS,2}" in saved  # resolved to 2 for the run itself
    assert '"step": 2' in (run / "metrics.jsonl").read_text()
    assert "shown as their expression or ***" in (run / "art_hydra.log").read_text()
    assert EXPRESSION in (run / ".hydra" / "config.yaml").read_text()
    # generate --task builds the run's task from run_config.yaml: the generator gets the
    # token's value again, read from the environment now.
    generated = run_cli(
        "generate",
        "run",
        "--task",
        "--max-new-tokens",
        "2",
        cwd=tmp_path,
        env=_env(tmp_path, TOKEN),
    )
    assert generated.returncode == 0 and "right (reward 1)" in generated.stdout, output_of(
        generated
    )
    assert TOKEN not in output_of(generated)
    # The same token, then a rotated one: the expression is the run's, so both resume.
    again = _run(
        tmp_path,
        TOKEN,
        "experiment=keyed",
        "resume=true",
        "trainer.max_steps=3",
    )
    _assert_nowhere(tmp_path, again, TOKEN)
    assert "resumed from" in (run / "art_hydra.log").read_text()
    rotated = _run(
        tmp_path,
        ROTATED,
        "experiment=keyed",
        "resume=true",
        "trainer.max_steps=4",
    )
    _assert_nowhere(tmp_path, rotated, TOKEN, ROTATED)
    assert '"step": 4' in (run / "metrics.jsonl").read_text()


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow not installed")
def test_a_token_and_a_secret_key_given_by_hand_stay_out_of_the_trackers(tmp_path: Path) -> None:
    _setup(tmp_path)
    proc = _run(
        tmp_path,
        TOKEN,
        "task.generator=keyed_tasks.examples",
        f"+task.params.api_key={EXPRESSION}",
        f"+task.params.session_token={LITERAL}",
        f"logging.project={EXPRESSION}",
        "trainer.max_steps=2",
        "logging.report_to=[tensorboard,mlflow]",
    )
    _assert_nowhere(tmp_path, proc, TOKEN)
    run = tmp_path / "run"
    assert _holding(run, "session_token") != []  # the key is recorded, by name
    # Written out by hand, the value stays in the config the run is resumed from (and
    # Hydra's record of the command line); every other record shows ***.
    assert _holding(run, LITERAL, skip=("run_config.yaml", ".hydra/")) == []
    assert LITERAL in (run / "run_config.yaml").read_text()
    assert _holding(run / "trackers" / "mlflow", "art-hydra-run") != []  # the project
