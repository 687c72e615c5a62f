"""A resume continues the same run, all of it: the data file, the reward's source and the
base model the run started on are recorded in ``run_identity.json`` and compared before
a resume; each change is refused by name (no traceback), an unchanged run resumes, and a
folder written before the record resumes with a warning. One short real run; every
check after it is the real CLI's pre-flight (``dry_run=true``), which trains nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import output_of, run_cli

from art_hydra import compose
from art_hydra.runs import run_identity
from art_hydra.runs.run_identity import IDENTITY

pytestmark = pytest.mark.slow

REWARD = """
def helper(text):
    return text.strip()


def score(prompt, completion, answer):
    return float(helper(completion) == helper(answer or ""))
"""


def _data(count: int) -> str:
    return "".join(
        json.dumps({"prompt": f"ab{i}", "answer": f"{i}"[::-1] + "ba"}) + "\n" for i in range(count)
    )


RUN = [
    "task=jsonl",
    "task.path=data.jsonl",
    "task.allowed_modules=[identity_reward]",
    "task.reward._target_=identity_reward.score",
    "rl.max_prompt_length=32",
    "rl.max_completion_length=32",
    "trainer.max_steps=1",
    "trainer.per_device_train_batch_size=16",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
    "hydra.run.dir=run",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-step run (its checkpoint makes the folder resumable)."""
    root = tmp_path_factory.mktemp("identity")
    (root / "data.jsonl").write_text(_data(40))
    (root / "identity_reward.py").write_text(REWARD)
    proc = run_cli(*RUN, cwd=root, env={"PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    assert (root / "run" / IDENTITY).is_file()
    return root


@pytest.fixture
def copy(trained: Path, tmp_path: Path) -> Path:
    """The trained run's folder, data and reward, to change at will."""
    for name in ("data.jsonl", "identity_reward.py"):
        shutil.copy(trained / name, tmp_path / name)
    shutil.copytree(trained / "run", tmp_path / "run")
    return tmp_path


def resume(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_cli(
        *RUN, "resume=true", "dry_run=true", *extra, cwd=folder, env={"PYTHONPATH": str(folder)}
    )


def test_an_unchanged_run_resumes(copy: Path) -> None:
    proc = resume(copy)
    assert proc.returncode == 0, proc.stderr
    assert "dry run: the configuration is valid" in proc.stdout


@pytest.mark.parametrize("change", ["rewritten", "shrunk", "grown"])
def test_a_changed_data_file_is_refused_by_name(copy: Path, change: str) -> None:
    data = copy / "data.jsonl"
    recorded = data.stat().st_size
    if change == "rewritten":  # the same size, other content: only the hash tells
        data.write_text(data.read_text().replace("ab1", "ab7"))
        assert data.stat().st_size == recorded
    elif change == "shrunk":
        data.write_text(_data(20))
    else:
        data.write_text(_data(60))
    proc = resume(copy)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    assert "task.path = data.jsonl" in out
    assert f"recorded {recorded} bytes" in out and f"now has {data.stat().st_size} bytes" in out
    assert "hydra.run.dir=<a new folder>" in out  # the fix


def test_the_data_file_restored_resumes_again(copy: Path) -> None:
    data = copy / "data.jsonl"
    original = data.read_text()
    data.write_text(_data(20))
    assert resume(copy).returncode == 1
    data.write_text(original)
    proc = resume(copy)
    assert proc.returncode == 0, proc.stderr


def test_an_edited_reward_is_refused_by_name(copy: Path) -> None:
    module = copy / "identity_reward.py"
    module.write_text(module.read_text().replace("return float(", "return 0.5 * float("))
    proc = resume(copy)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    assert "task.reward._target_ = identity_reward.score" in out
    assert "source changed since the run started" in out and str(module.resolve()) in out


def test_an_edit_elsewhere_in_the_reward_module_is_a_warning(copy: Path) -> None:
    """The function's own source is unchanged: the resume goes on, with a word."""
    module = copy / "identity_reward.py"
    module.write_text(module.read_text() + "\n\ndef unrelated():\n    return 1\n")
    proc = resume(copy)
    assert proc.returncode == 0, proc.stderr
    assert "function is unchanged, but its file" in output_of(proc)


def test_a_folder_without_the_record_resumes_with_a_warning(copy: Path) -> None:
    (copy / "run" / IDENTITY).unlink()
    proc = resume(copy)
    assert proc.returncode == 0, proc.stderr
    assert f"{IDENTITY} is missing or unreadable" in output_of(proc)


def test_a_changed_local_model_folder_is_refused(tmp_path: Path) -> None:
    """The base model's identity: a local folder's config.json and weight files."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"0" * 64)
    run = tmp_path / "run"
    run.mkdir()
    cfg = compose(["model=qwen2_5_0_5b_instruct", f"model.name={folder}", "resume=true"])
    run_identity.record(cfg, run)
    assert run_identity.resume_problems(cfg, run) == []
    (folder / "model.safetensors").write_bytes(b"0" * 32)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    problems = run_identity.resume_problems(cfg, run)
    assert [p.key for p in problems] == ["model.name"]
    assert "model.safetensors (64 -> 32 bytes)" in problems[0].reason
    assert "config.json (sha256" in problems[0].reason


GENERATOR = """
from art_hydra.tasks import Example


def pairs(rng, num_examples):
    for _ in range(num_examples):
        word = "".join(rng.choice("abc") for _ in range(4))
        yield Example(prompt=word, answer=word[::-1])
"""


def test_an_edited_generator_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "identity_generator.py").write_text(GENERATOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = compose(
        [
            "task.allowed_modules=[identity_generator]",
            "task.generator=identity_generator.pairs",
            "resume=true",
        ]
    )
    run = tmp_path / "run"
    run.mkdir()
    run_identity.record(cfg, run)
    assert run_identity.resume_problems(cfg, run) == []
    source = tmp_path / "identity_generator.py"
    source.write_text(GENERATOR.replace('"abc"', '"abcd"'))
    (problem,) = run_identity.resume_problems(cfg, run)
    assert problem.key == "task.generator" and "source changed" in problem.reason


@pytest.mark.slow
def test_a_rewritten_shard_of_a_dataset_folder_is_refused(tmp_path: Path) -> None:
    """task=dataset over a folder: every file of the split is part of the identity."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train-00000.jsonl").write_text(_data(20))
    (folder / "train-00001.jsonl").write_text(_data(20))
    (tmp_path / "identity_reward.py").write_text(REWARD)
    run = [w for w in RUN if not w.startswith("task")]
    run += [
        "task=dataset",
        "task.path=data",
        "task.allowed_modules=[identity_reward]",
        "task.reward._target_=identity_reward.score",
    ]
    env = {"PYTHONPATH": str(tmp_path)}
    assert run_cli(*run, cwd=tmp_path, env=env).returncode == 0
    again = run_cli(*run, "resume=true", "dry_run=true", cwd=tmp_path, env=env)
    assert again.returncode == 0, output_of(again)
    shard = folder / "train-00001.jsonl"
    shard.write_text(shard.read_text().replace("ab1", "ab7"))  # same size, other rows
    proc = run_cli(*run, "resume=true", "dry_run=true", cwd=tmp_path, env=env)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "task.path = data" in out and "Traceback" not in out


def test_a_changed_evaluation_file_resumes_with_a_warning(tmp_path: Path) -> None:
    """Training does not read ``eval.path``: a resume after it changed trains on, with a
    warning that the eval curve before and after measures different data."""
    (tmp_path / "data.jsonl").write_text(_data(40))
    (tmp_path / "held.jsonl").write_text(_data(8))
    (tmp_path / "identity_reward.py").write_text(REWARD)
    run = [*RUN, "eval.path=held.jsonl"]
    env = {"PYTHONPATH": str(tmp_path)}
    proc = run_cli(*run, cwd=tmp_path, env=env)
    assert proc.returncode == 0, output_of(proc)
    recorded = json.loads((tmp_path / "run" / IDENTITY).read_text())["eval_data"]
    assert recorded["size"] == (tmp_path / "held.jsonl").stat().st_size
    unchanged = run_cli(*run, "resume=true", "dry_run=true", cwd=tmp_path, env=env)
    assert unchanged.returncode == 0 and "eval.path" not in output_of(unchanged)
    (tmp_path / "held.jsonl").write_text(_data(6))
    proc = run_cli(*run, "resume=true", "dry_run=true", cwd=tmp_path, env=env)
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "eval.path = held.jsonl" in out and "eval/* after this resume" in out
    assert "Traceback" not in out
