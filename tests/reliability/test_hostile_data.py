"""Hostile data files and paths: one huge line is refused with its file:line before
anything is parsed or tokenised; every kind of bad line is named where it is (a lone
surrogate, nesting too deep to parse); a path that is not a regular file, or that no
file can have, is refused by the pre-flight, promptly, by its key. All dry runs (no
training) except the 50 MB line, which takes a while to write and stream."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import output_of, run_cli
from omegaconf import OmegaConf

from art_hydra import compose
from art_hydra.engine.metrics import read_metrics
from art_hydra.preflight import world_problems
from art_hydra.runs.run_folder import write_manifest
from art_hydra.safe_json import JsonRefused, read

BUDGETS = ["rl.max_prompt_length=32", "rl.max_completion_length=32"]
#: A dry run is refused in seconds; one that blocks on a FIFO would hit this instead.
PROMPT_S = 60


@pytest.mark.slow
def test_a_50_mb_line_is_refused_with_its_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    with open(data, "w") as handle:
        handle.write('{"prompt": "ab=", "answer": "ba"}\n{"prompt": "')
        handle.write("x" * (50 << 20))
        handle.write('", "answer": "y"}\n')
    proc = run_cli("task=jsonl", f"task.path={data}", *BUDGETS, "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1
    assert f"{data}:2: the line has 52,428,8" in out
    assert "rl.max_prompt_length=32" in out and "Traceback" not in out


def test_every_bad_line_of_a_file_is_named_in_one_report(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(
        b'{"prompt": "ab=", "answer": "ba"}\n'
        b'{"prompt": "a\xff", "answer": "b"}\n'
        b'{"prompt": "cd=", "prompt": "dc="}\n'
        b'{"prompt": 7}\n'
        b"not json\n"
        b'{"prompt": "ef="}\n'
    )
    proc = run_cli("task=jsonl", f"task.path={data}", *BUDGETS, "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1
    for line, words in [
        (2, "not valid UTF-8"),
        (3, "not valid JSON for a task: the key 'prompt' appears twice"),
        (4, "needs a non-empty string 'prompt'"),
        (5, "not valid JSON"),
        (6, "has no 'answer', which the reward art_hydra.tasks.rewards.exact_match needs"),
    ]:
        assert f"{data}:{line}: {words}" in out, out


def test_a_lone_surrogate_and_deep_nesting_are_named_with_file_and_line(tmp_path: Path) -> None:
    """``"\\ud800"`` parses to a str no tokenizer can encode, and 30,000 brackets (far
    under the line limit) made the parser recurse until RecursionError."""
    data = tmp_path / "data.jsonl"
    data.write_text(
        '{"prompt": "ab=", "answer": "ba"}\n'
        '{"prompt": "a\\ud800b", "answer": "b"}\n'
        '{"prompt": "cd=", "answer": "dc", "meta": ' + "[" * 30_000 + "]" * 30_000 + "}\n"
        '{"prompt": "\\ud83d\\ude00=", "answer": "x"}\n'  # a surrogate pair: one real character
    )
    proc = run_cli(
        "task=jsonl", f"task.path={data}", *BUDGETS, "dry_run=true", cwd=tmp_path, timeout=PROMPT_S
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert f"{data}:2: the string 'prompt' holds \\ud800 (character 2), a lone UTF-16" in out
    assert f"{data}:3: nested deeper than 64 levels" in out
    assert f"{data}:4" not in out and "2 lines cannot be used" in out
    assert "Traceback" not in out and "RecursionError" not in out


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_task_data_that_is_not_a_regular_file_is_refused_promptly(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO with no writer blocks ``open`` forever, and ``/dev/zero`` never ends."""
    path = {"fifo": tmp_path / "pipe.jsonl", "device": Path("/dev/zero"), "directory": tmp_path}
    if kind == "fifo":
        os.mkfifo(path[kind])
    proc = run_cli(
        "task=jsonl",
        f"task.path={path[kind]}",
        *BUDGETS,
        "dry_run=true",
        cwd=tmp_path,
        timeout=PROMPT_S,  # raises TimeoutExpired if the check blocks
    )
    out = output_of(proc)
    assert proc.returncode == 1
    words = {
        "fifo": "a FIFO (named pipe)",
        "device": "a character device",
        "directory": "a directory",
    }
    assert f"task.path = {path[kind]}" in out
    assert f"is {words[kind]}, not a regular file" in out and "Traceback" not in out


def test_over_long_paths_are_refused_by_their_keys(tmp_path: Path) -> None:
    """A component over 255 bytes made ``os.stat`` raise ENAMETOOLONG tracebacks."""
    long = "x" * 300
    proc = run_cli(
        "task=jsonl",
        f"task.path={tmp_path}/{long}.jsonl",
        "model=qwen2_5_0_5b_instruct",
        f"model.name={tmp_path}/{long}",
        f"hydra.run.dir={tmp_path}/{long}",
        *BUDGETS,
        "dry_run=true",
        cwd=tmp_path,
        timeout=PROMPT_S,
    )
    out = output_of(proc)
    assert proc.returncode == 1
    for key in ("task.path", "model.name", "hydra.run.dir"):
        assert f"{key} = {tmp_path}/{long}" in out, out
    assert out.count("has a component of 30") == 3
    assert "Traceback" not in out and "OSError" not in out
    whole = "/".join(["y" * 200] * 25)  # every component fits, the whole path does not
    proc = run_cli("task=jsonl", f"task.path=/{whole}", *BUDGETS, "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 1 and "bytes long; a path may have at most 4,095" in output_of(proc)


def test_a_nul_byte_in_a_path_is_refused_by_its_key(tmp_path: Path) -> None:
    """No command line holds a NUL, but a config file can (YAML ``"\\0"``)."""
    cfg = compose(["task=jsonl", "task.path=x.jsonl", *BUDGETS, "model=qwen2_5_0_5b_instruct"])
    OmegaConf.set_readonly(cfg, False)
    cfg.task.path = f"{tmp_path}/data\0.jsonl"
    cfg.model.name = f"{tmp_path}/model\0"
    found = {p.key: p.reason for p in world_problems(cfg, Path(f"{tmp_path}/run\0"))}
    for key in ("task.path", "model.name", "hydra.run.dir"):
        assert "contains a NUL byte" in found[key]


def test_a_model_config_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    os.mkfifo(model / "config.json")
    (model / "model.safetensors").write_bytes(b"")
    proc = run_cli(
        "model=qwen2_5_0_5b_instruct",
        f"model.name={model}",
        "dry_run=true",
        cwd=tmp_path,
        timeout=PROMPT_S,
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert "holds a config.json that is a FIFO (named pipe), not a regular file" in out


def _checkpoint(root: Path, step: int) -> Path:
    folder = root / f"step-{step:06d}"
    (folder / "trainer_state").mkdir(parents=True)
    (folder / "trainer_state" / "state.json").write_text(json.dumps({"step": step}))
    write_manifest(folder, step)
    return folder


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        ('{"step": 2, "sha256": ' + "[" * 30_000 + "]" * 30_000 + "}", "nested deeper than 64"),
        ('{"step": 2, "sha256": {"' + "z" * 300 + '": "0"}}', "has a component of 300 bytes"),
        ('{"step": 2, "sha256": {"a\\udc00": "0"}}', "a lone UTF-16 surrogate"),
        ('{"step": 2, "sha256": [1, 2]}', "its 'sha256' is not a JSON object"),
    ],
)
def test_a_tampered_manifest_is_skipped_on_resume_with_its_reason(
    tmp_path: Path, manifest: str, words: str
) -> None:
    """The newest checkpoint's manifest is hostile: the resume check names it and falls
    back to the intact one, instead of a RecursionError or OSError traceback."""
    run = tmp_path / "run"
    _checkpoint(run / "checkpoints", 1)
    (_checkpoint(run / "checkpoints", 2) / "manifest.json").write_text(manifest)
    proc = run_cli("resume=true", f"hydra.run.dir={run}", "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "a checkpoint will be skipped" in out and words in out
    assert "step-000002/manifest.json" in out and "Traceback" not in out


def test_json_files_are_read_only_when_regular_and_within_bounds(tmp_path: Path) -> None:
    """The one reader of run-folder and model JSON (manifests, checkpoint state, a
    model's config.json): every refusal is a ValueError naming the file."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 2000}))
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    for path, words, options in [
        (deep, "nested deeper than 64 levels", {}),
        (big, "is larger than 1,000 bytes", {"max_bytes": 1000}),
        (pipe, "is a FIFO (named pipe), not a regular file", {}),
        (Path("/dev/zero"), "is a character device, not a regular file", {}),
    ]:
        with pytest.raises(JsonRefused, match=re.escape(words)) as info:
            read(path, **options)
        assert str(path) in str(info.value)
    assert read(big) == {"x": "y" * 2000}


def test_a_generated_example_that_is_not_text_is_named_with_the_generator(
    tmp_path: Path,
) -> None:
    """A generator's examples are checked where they are made, like a file's lines."""
    (tmp_path / "odd_task.py").write_text(
        "from art_hydra.tasks import Example\n"
        "def examples(rng, num_examples, **params):\n"
        "    yield Example(prompt='ab=', answer='ba')\n"
        "    yield Example(prompt='a' + chr(0xD800), answer='b')\n"
    )
    proc = run_cli(
        "task.allowed_modules=[odd_task]",
        "task.generator=odd_task.examples",
        "dry_run=true",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
        timeout=PROMPT_S,
    )
    out = output_of(proc)
    assert proc.returncode == 1
    assert "task.generator = odd_task.examples" in out
    assert "an example's prompt holds \\ud800 (character 2), a lone UTF-16 surrogate" in out


@pytest.mark.slow
def test_a_deep_checkpoint_state_is_refused_on_resume_by_name(tmp_path: Path) -> None:
    """A checkpoint tampered consistently (its manifest rewritten to match) passes the
    checksums; its state.json is still read within bounds and refused by name."""
    quick = [
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=16",
        "checkpoint.every_steps=2",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        "logging.plot=false",
        "hydra.run.dir=run",
    ]
    assert run_cli(*quick, cwd=tmp_path).returncode == 0
    folder = tmp_path / "run" / "checkpoints" / "step-000002"
    state = folder / "trainer_state" / "state.json"
    state.write_text("[" * 30_000 + "]" * 30_000)
    write_manifest(folder, 2)
    proc = run_cli(*quick, "trainer.max_steps=3", "resume=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert f"{state} is not usable JSON: nested deeper than 64 levels" in out
    assert "Traceback" not in out and "RecursionError" not in out


def test_a_deep_metrics_line_is_dropped_not_a_recursion_error(tmp_path: Path) -> None:
    """metrics.jsonl is read back on resume; a tampered line is dropped like a torn one."""
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 0.5}\n' + "[" * 30_000 + "]" * 30_000 + '\n{"step": 2, "loss": 0.4}\n'
    )
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2]


def test_a_generator_that_raises_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    """The user's bug is in their generator: the report says where their code raised,
    past the library it called (a stdlib parse), never as a traceback."""
    (tmp_path / "broken_task.py").write_text(
        "import json\n"
        "def examples(rng, num_examples, **params):\n"
        "    yield {'prompt': 'ab=', 'answer': 'ba'}\n"
        "    row = json.loads('{not json')\n"
        "    yield row\n"
    )
    proc = run_cli(
        "task.allowed_modules=[broken_task]",
        "task.generator=broken_task.examples",
        "dry_run=true",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "raised JSONDecodeError: Expecting property name" in out
    assert "(broken_task.py:4, in examples)" in out
    assert "Traceback" not in out
