"""The world pre-flight: what files and the environment decide, before any model loads
and without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_model_files

from art_hydra import ConfigValidationError, Kind, Severity, compose
from art_hydra.preflight import cuda_present, world_problems
from art_hydra.runs import run_identity
from art_hydra.runs.run_folder import write_manifest, write_run_config


def _world(overrides: list[str], run_dir: Path | None = None) -> dict[str, list]:
    found: dict[str, list] = {}
    for p in world_problems(compose(overrides), run_dir):
        found.setdefault(p.key, []).append(p)
    return found


def _jsonl(tmp_path: Path, text: str | bytes, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_the_default_config_passes() -> None:
    assert _world([]) == {}


# ---- code the config names ----------------------------------------------------------


@pytest.mark.parametrize(
    "target", ["os.system", "os.execlp", "subprocess.getoutput", "builtins.exec", "builtins.eval"]
)
def test_standard_library_targets_are_refused_at_composition(target: str) -> None:
    for key in ("task.reward._target_", "task.generator"):
        with pytest.raises(ConfigValidationError) as info:
            compose([f"{key}={target}", f"task.allowed_modules=[{target.split('.')[0]}]"])
        (problem,) = [p for p in info.value.problems if p.key == key]
        assert "standard-library" in problem.reason


def test_modules_outside_the_allowlist_are_refused_until_allowed() -> None:
    with pytest.raises(ConfigValidationError, match="library 'numpy', which is never a reward"):
        compose(["task.reward._target_=numpy.sum"])
    found = _world(
        ["task.reward._target_=acme_rewards.score", "task.allowed_modules=[acme_rewards]"]
    )
    assert "no module named 'acme_rewards'" in found["task.reward._target_"][0].reason


def test_a_reexport_of_a_dangerous_function_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sneaky_rewards.py").write_text("from os import system as score\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = _world(
        ["task.reward._target_=sneaky_rewards.score", "task.allowed_modules=[sneaky_rewards]"]
    )
    assert "not a plain Python function" in found["task.reward._target_"][0].reason


def test_targets_that_do_not_exist_or_are_not_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_constants.py").write_text("LIMIT = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    missing = _world(["task.reward._target_=my_constants.no_such_reward"])
    assert "has no attribute 'no_such_reward'" in missing["task.reward._target_"][0].reason
    constant = _world(["task.reward._target_=my_constants.LIMIT"])
    assert "not a plain Python function" in constant["task.reward._target_"][0].reason
    with pytest.raises(ConfigValidationError, match="not one of art_hydra's own rewards"):
        compose(["task.reward._target_=art_hydra.tasks.rewards.no_such_reward"])


def test_generator_params_it_does_not_accept() -> None:
    """The README once suggested exactly this."""
    found = _world(["task=digit_sum", "+task.params.length=4"])
    (problem,) = found["task.generator"]
    assert "does not accept" in problem.reason and "length" in problem.reason


def test_user_code_runs_only_when_allowed_and_well_formed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_task.py").write_text(
        "from art_hydra.tasks import Example\n"
        "def reward(text, output):\n    return 1.0\n"
        "def examples(rng, num_examples):\n"
        "    return [Example('x=', 'x') for _ in range(num_examples)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    allowed = "task.allowed_modules=[my_task]"
    found = _world([allowed, "task.reward._target_=my_task.reward"])
    assert (
        "reward(prompt=..., completion=..., answer=...)" in found["task.reward._target_"][0].reason
    )
    assert _world([allowed, "task=digit_sum", "task.generator=my_task.examples"]) == {}


# ---- data ---------------------------------------------------------------------------


#: Budgets of a JSONL task on the tiny model (max_seq_length 64).
BUDGETS = ["rl.max_prompt_length=32", "rl.max_completion_length=32", "sft.max_length=64"]


def _jsonl_cfg(path: Path, *extra: str) -> list[str]:
    return ["task=jsonl", f"task.path={path}", *BUDGETS, *extra]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("", "no examples (the file is empty)"),
        ('{"prompt": "a=", "answer": "a"}\n{"prompt": \n', ":2: not valid JSON"),
        ('{"prompt": "a="}\n', ":1: has no 'answer', which the reward"),
        (
            '{"prompt": "a=", "answer": "a", "answer": "b"}\n',
            ":1: not valid JSON for a task: the key 'answer' appears twice",
        ),
        (b'{"prompt": "a\xff=", "answer": "a"}\n', ":1: not valid UTF-8 (byte 0xff"),
        ('{"prompt": 3, "answer": "a"}\n', ":1: needs a non-empty string 'prompt'"),
        ('{"prompt": "a=", "answer": 3}\n', ":1: 'answer' must be a string"),
        ('["a=", "a"]\n', ":1: expected a JSON object"),
    ],
)
def test_bad_data_is_named_with_file_and_line(
    tmp_path: Path, content: str | bytes, words: str
) -> None:
    path = _jsonl(tmp_path, content)
    (problem,) = _world(_jsonl_cfg(path))["task.path"]
    assert problem.kind == Kind.world
    assert words in problem.reason, problem.reason


def test_every_bad_line_is_listed_and_the_rest_counted(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, "".join("not json\n" for _ in range(25)))
    (problem,) = _world(_jsonl_cfg(path))["task.path"]
    assert "25 lines cannot be used" in problem.reason
    assert f"{path}:10:" in problem.reason and "... and 15 more" in problem.reason


def test_answers_are_optional_for_a_reward_that_does_not_need_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "free_reward.py").write_text(
        "def score(prompt: str, completion: str, answer: str | None = None) -> float:\n"
        "    return float(len(completion) < 5)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _jsonl(tmp_path, '{"prompt": "hello"}\n')
    extra = ["task.reward._target_=free_reward.score", "task.allowed_modules=[free_reward]"]
    assert _world(_jsonl_cfg(path, *extra)) == {}
    assert (
        "which SFT needs"
        in _world(_jsonl_cfg(path, *extra, "algorithm=sft"))["task.path"][0].reason
    )


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with open(path, "w") as handle:
        handle.write('{"prompt": "ab=", "answer": "ba"}\n{"prompt": "')
        handle.write("x" * (8 << 20))
        handle.write('", "answer": "y"}\n{"prompt": "cd=", "answer": "dc"}\n')
    (problem,) = _world(_jsonl_cfg(path))["task.path"]
    assert f"{path}:2: the line has 8,388," in problem.reason
    assert "1 line cannot be used" in problem.reason


def test_tiny_model_lengths_are_checked_for_data_and_generated_tasks(tmp_path: Path) -> None:
    long_answer = _world(["task.params.length=12"])
    assert "rl.max_completion_length" in long_answer
    assert long_answer["rl.max_completion_length"][0].fix.overrides() == [
        "rl.max_completion_length=12"
    ]
    path = _jsonl(
        tmp_path,
        '{"prompt": "a=", "answer": "a"}\n' + '{"prompt": "%s=", "answer": "z"}\n' % ("x" * 40),
    )
    prompt = _world(_jsonl_cfg(path))["rl.max_prompt_length"][0]
    assert f"{path}:2" in prompt.reason and "42 tokens" in prompt.reason
    assert "sft.max_length" in _world(["algorithm=sft", "sft.max_length=6"])


def test_top_p_that_keeps_one_token_of_the_vocabulary_is_an_error() -> None:
    (problem,) = _world(["rl.top_p=0.1"])["rl.top_p"]  # vocabulary of 9: abcd= and 4 specials
    assert (problem.kind, problem.severity) == (Kind.world, Severity.error)
    assert problem.fix.overrides() == ["rl.top_p=1.0"]
    assert "rl.top_p" not in _world(["rl.top_p=0.2"])


# ---- the model and the environment ---------------------------------------------------


def _model(name: str) -> list[str]:
    return ["model=qwen2_5_0_5b_instruct", f"model.name={name}"]


def test_local_model_folders_must_hold_a_safetensors_model(tmp_path: Path) -> None:
    missing = _world(_model(str(tmp_path / "nowhere")))["model.name"][0]
    assert "no such folder exists" in missing.reason
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "without config.json" in _world(_model(str(empty)))["model.name"][0].reason
    (empty / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 128}))
    (empty / "pytorch_model.bin").write_bytes(b"pickle")
    pickled = _world(_model(str(empty)))["model.name"][0]
    assert "pickled weights (pytorch_model.bin)" in pickled.reason
    (empty / "model.safetensors").write_bytes(b"")
    assert "too short for a header" in _world(_model(str(empty)))["model.name"][0].reason
    write_model_files(empty, {"model_type": "llama", "vocab_size": 128})
    assert _world(_model(str(empty))) == {}


def test_a_hub_id_must_be_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, or with the hub not answering, the cache decides; HF_HUB_OFFLINE=0 lets
    the run download it, with a warning."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: closed
    for offline in ("1", ""):
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
        (problem,) = _world(_model("acme/tiny-model"))["model.name"]
        assert "not in the Hugging Face cache" in problem.reason
        assert "hf download acme/tiny-model" in problem.fix.render()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    (allowed,) = _world(_model("acme/tiny-model"))["model.name"]
    assert allowed.severity == Severity.warning
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = tmp_path / "hub" / "models--acme--tiny-model" / "snapshots" / "abc"
    write_model_files(snapshot, {"model_type": "qwen2", "vocab_size": 128})
    assert _world(_model("acme/tiny-model")) == {}


@pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("unsloth") is not None, reason="unsloth installed"
)
def test_unsloth_backend_needs_unsloth_installed() -> None:
    (problem,) = _world(["backend=unsloth", "backend.device=auto"])["backend"]
    assert "not installed" in problem.reason and "[unsloth]" in problem.fix.render()


@pytest.mark.skipif(cuda_present(), reason="a GPU is present")
def test_cuda_asked_for_without_a_gpu() -> None:
    (problem,) = _world(["backend.device=cuda"])["backend.device"]
    assert (problem.value, problem.kind, problem.severity) == ("cuda", Kind.world, Severity.error)
    assert problem.fix.overrides() == ["backend.device=auto"]


# ---- the run folder -----------------------------------------------------------------


def _finished_run(run_dir: Path, overrides: list[str]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_config(run_dir, compose(overrides))
    run_identity.record(compose(overrides), run_dir)  # as a run writes it at its start
    state = run_dir / "checkpoints" / "step-000002" / "trainer_state"
    state.mkdir(parents=True)
    (state / "state.json").write_text("{}")
    write_manifest(state.parent, 2)


def test_run_folder_states(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert _world([], run) == {}  # fresh (missing) folder
    (nothing,) = _world(["resume=true"], run)["resume"]  # nothing to resume: name the folder
    assert (nothing.kind, nothing.severity) == (Kind.world, Severity.error)
    assert nothing.fix.has_placeholder and nothing.fix.render().startswith("hydra.run.dir=<")
    run.mkdir()
    (run / ".hydra").mkdir()  # another Hydra app's output folder: its record is not ours
    assert "another program's Hydra record" in _world([], run)["hydra.run.dir"][0].reason
    (run / ".hydra").rmdir()
    (run / ".hydra-pending-1").mkdir()  # Hydra writes this before every job: not a run yet
    assert _world([], run) == {}
    (unfinished,) = _world(["resume=true"], run)["resume"]  # no checkpoint: start over
    assert unfinished.fix.overrides() == ["resume=false"]
    # A run killed before its first checkpoint: its records, nothing resumable.
    write_run_config(run, compose(["trainer.max_steps=2"]))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (early,) = _world(["trainer.max_steps=2"], run)["resume"]
    assert "ended before its first checkpoint" in early.reason
    assert "resume=true" not in early.fix.render() and "hydra.run.dir=" in early.fix.render()
    (run / "metrics.jsonl").unlink()
    _finished_run(run, ["trainer.max_steps=2"])
    again = _world(["trainer.max_steps=2"], run)["resume"][0]
    assert "already holds a run" in again.reason
    assert again.fix.render().startswith("resume=true")


def test_resume_names_every_key_that_differs_and_allows_extending(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _finished_run(run, ["trainer.max_steps=2"])
    assert _world(["trainer.max_steps=50", "resume=true", "logging.progress_bar=off"], run) == {}
    assert _world(["resume=true", "trainer.max_steps=50", "backend.cpu_threads=1"], run) == {}
    found = _world(["resume=true", "rl.temperature=0.7", "seed=3", "algorithm=sft"], run)
    assert {"rl.temperature", "seed", "algorithm.name", "trainer.max_steps"} - {
        "trainer.max_steps"
    } <= set(found)
    assert found["seed"][0].fix.overrides() == ["seed=42"]


def test_more_cpu_threads_than_cores_is_a_warning(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    found = _world([f"backend.cpu_threads={cores + 1}"], tmp_path / "run")
    (problem,) = found["backend.cpu_threads"]
    assert problem.severity == Severity.warning
    assert problem.fix.overrides() == [f"backend.cpu_threads={cores}"]
    assert _world([f"backend.cpu_threads={cores}"], tmp_path / "run") == {}


def test_a_run_saved_before_a_key_existed_resumes_as_it_was_trained(tmp_path: Path) -> None:
    """producer.share_prompts came later; runs before it repeated every prompt."""
    run = tmp_path / "run"
    _finished_run(run, ["trainer.max_steps=2"])
    saved = run / "run_config.yaml"
    text = saved.read_text()
    assert "share_prompts: true" in text
    saved.write_text(text.replace("  share_prompts: true\n", ""))
    found = _world(["trainer.max_steps=4", "resume=true"], run)
    assert set(found) == {"producer.share_prompts"}
    assert found["producer.share_prompts"][0].fix.overrides() == ["producer.share_prompts=false"]
    assert _world(["trainer.max_steps=4", "resume=true", "producer.share_prompts=false"], run) == {}


def test_the_world_preflight_imports_no_torch(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, '{"prompt": "ab=", "answer": "ba"}\n')
    code = (
        "import sys\n"
        "from art_hydra import compose\n"
        "from art_hydra.preflight import world_problems\n"
        f"world_problems(compose({_jsonl_cfg(path)!r}), {str(tmp_path / 'r')!r})\n"
        "world_problems(compose([]), None)\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'unsloth') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
