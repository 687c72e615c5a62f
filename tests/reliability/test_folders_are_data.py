"""A run folder or a sweep folder is data, never code (issue 32).

``art-hydra generate RUN``, ``art-hydra export RUN OUT``, ``generate --task``,
``art-hydra summarize SWEEP`` and a sweep's ``resume=auto`` read folders anyone may
have written. What those folders say can never run code: the model's own code
(``auto_map``) runs only with the command's ``--trust-remote-code``, however the
folder's ``run_config.yaml`` sets ``model.trust_remote_code``; the task ``--task``
builds names only marked rewards and generators, as a config file does. Their records
are read within bounds: an alias bomb, a ``range`` of twenty million points or a FIFO
ends in a message, not a hang. Each attack carries a payload that would create a
marker file, and each test asserts the marker does not exist; the legitimate paths
(the flag on the command line, a marked generator named by the folder) still work.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import string
import time
from pathlib import Path

import pytest
from conftest import output_of, run_cli
from omegaconf import OmegaConf

from art_hydra import compose
from art_hydra.commands.trained import UsageError, build_folder_task
from art_hydra.config.run_files import RUN_CONFIG, checkpoint_name
from art_hydra.preflight import sweep_folder_problems
from art_hydra.runs.run_folder import write_manifest
from art_hydra.sweeps.summary import MAX_POINTS, SweepTooLarge, grid_size, summarize

#: Nine levels of ten aliases: a few hundred bytes that expand to a billion values.
BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)
)
#: Seconds a refusal may take (a bomb read whole would not end at all).
QUICK_S = 60


@functools.cache
def _default_config() -> dict:
    return OmegaConf.to_container(compose([]), resolve=True)  # type: ignore[return-value]


def _tokenizer(folder: Path) -> None:
    """A character tokenizer, written without torch."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *string.printable])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**special, "tokenizer_class": "PreTrainedTokenizerFast"})
    )


def _auto_map(checkpoint: Path, marker: Path) -> None:
    """The checkpoint's config.json names Python in the folder, which creates ``marker``
    when imported (and then behaves as a Llama, so a trusted load still works)."""
    config = checkpoint / "config.json"
    # A type transformers does not know: only the folder's own code could load it.
    content = json.loads(config.read_text()) if config.is_file() else {"model_type": "folder"}
    content["auto_map"] = {
        "AutoConfig": "evil.EvilConfig",
        "AutoModelForCausalLM": "evil.EvilModel",
    }
    config.write_text(json.dumps(content))
    (checkpoint / "evil.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n\n\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'llama'\n\n\n"
        "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n"
    )
    write_manifest(checkpoint, int(checkpoint.name.rpartition("-")[2]))


def _run_folder(root: Path, **changes: object) -> Path:
    """A run folder as far as the commands look before loading weights: the default
    run's config (with ``changes``, dotted keys) and a checkpoint with a tokenizer."""
    folder = root / "run"
    folder.mkdir()
    cfg = OmegaConf.create(_default_config())
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    (folder / RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg))
    step = folder / "checkpoints" / checkpoint_name(3)
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"not loaded by these tests")
    _tokenizer(step)
    write_manifest(step, 3)
    return folder


def _one_line_refusal(proc) -> str:
    out = output_of(proc)
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


# ---- the model's own code: only the command line's flag ------------------------------


@pytest.mark.fast
@pytest.mark.parametrize("command", ["generate", "export"])
def test_a_run_folder_cannot_turn_on_the_models_own_code(tmp_path: Path, command: str) -> None:
    marker = tmp_path / "pwned"
    run = _run_folder(tmp_path, **{"model.trust_remote_code": True})
    _auto_map(run / "checkpoints" / checkpoint_name(3), marker)
    args = [str(run), "-p", "abc="] if command == "generate" else [str(run), str(tmp_path / "out")]
    err = _one_line_refusal(run_cli(command, *args, cwd=tmp_path))
    assert "model.trust_remote_code=true" in err and str(run / RUN_CONFIG) in err
    assert "--trust-remote-code" in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.fast
def test_a_checkpoints_auto_map_is_refused_without_the_flag(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    run = _run_folder(tmp_path)
    _auto_map(run / "checkpoints" / checkpoint_name(3), marker)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    for command, args in (("generate", ["-p", "abc="]), ("export", [str(tmp_path / "out")])):
        proc = run_cli(command, str(run), *args, cwd=tmp_path, env=env)
        assert proc.returncode == 2 and "Traceback" not in output_of(proc), output_of(proc)
        last = proc.stderr.strip().splitlines()[-1]  # after transformers' own warning
        assert last.startswith(f"art-hydra {command}: ") and "--trust-remote-code" in last
        assert not marker.exists()


# ---- the task --task builds: the rules of a config file ------------------------------

UNMARKED = """
import pathlib


def examples(rng, num_examples, **params):
    pathlib.Path({marker!r}).write_text("generator ran")
    return []


def score(prompt, completion, answer=None):
    pathlib.Path({marker!r}).write_text("reward ran")
    return 1.0
"""

MARKED = """
from art_hydra import generator
from art_hydra.tasks.examples import Example


@generator
def examples(rng, num_examples, **params):
    return [Example(prompt="ab=", answer="ba") for _ in range(num_examples)]
"""


@pytest.mark.fast
@pytest.mark.parametrize(
    ("key", "target"),
    [
        ("task.generator", "folder_code.examples"),
        ("task.generator", "numpy.save"),
        ("task.generator", "shutil.copyfile"),
        ("task.generator", "art_hydra.runs.run_folder.write_atomic"),
        ("task.reward._target_", "folder_code.score"),
    ],
)
def test_a_run_folder_names_no_unmarked_or_library_task_code(
    tmp_path: Path, key: str, target: str
) -> None:
    marker = tmp_path / "pwned"
    code = tmp_path / "code"
    code.mkdir()
    (code / "folder_code.py").write_text(UNMARKED.format(marker=str(marker)))
    # The folder's allowed_modules would allow the module: a file cannot widen that list.
    run = _run_folder(tmp_path, **{key: target, "task.allowed_modules": ["folder_code"]})
    proc = run_cli("generate", str(run), "--task", cwd=tmp_path, env={"PYTHONPATH": str(code)})
    err = _one_line_refusal(proc)
    assert f"{key}={target}" in err and str(run / RUN_CONFIG) in err
    assert not marker.exists()


@pytest.mark.fast
def test_a_marked_generator_named_by_a_run_folder_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "folder_marked.py").write_text(MARKED)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = compose(["task.generator=folder_marked.examples", "task.num_examples=4"])
    task = build_folder_task(cfg, tmp_path / RUN_CONFIG)
    assert [ex.prompt for ex in task.examples] == ["ab="] * 4
    built_in = build_folder_task(compose([]), tmp_path / RUN_CONFIG)  # art_hydra's own
    assert built_in.examples
    edited = compose([])
    edited.task.generator = "numpy.save"
    with pytest.raises(UsageError, match=r"task\.generator=numpy\.save"):
        build_folder_task(edited, tmp_path / RUN_CONFIG)


# ---- a run folder's records are read within bounds -----------------------------------


@pytest.mark.fast
@pytest.mark.parametrize("command", ["generate", "export"])
def test_an_alias_bomb_run_config_is_refused_at_once(tmp_path: Path, command: str) -> None:
    run = _run_folder(tmp_path)
    (run / RUN_CONFIG).write_text(BOMB)
    args = ["--task"] if command == "generate" else [str(tmp_path / "out")]
    started = time.monotonic()
    err = _one_line_refusal(run_cli(command, str(run), *args, cwd=tmp_path, timeout=QUICK_S))
    assert time.monotonic() - started < QUICK_S
    assert str(run / RUN_CONFIG) in err and "aliases" in err


@pytest.mark.fast
@pytest.mark.parametrize("expression", ["${model.name}", "${oc.decode:'[1, 2]'}"])
def test_an_edited_interpolation_in_a_run_config_is_refused(
    tmp_path: Path, expression: str
) -> None:
    """A run saves its config resolved, but for what it read from the environment."""
    run = _run_folder(tmp_path, **{"task.system_prompt": expression})
    proc = run_cli("export", str(run), str(tmp_path / "out"), cwd=tmp_path)
    err = _one_line_refusal(proc)
    assert "task.system_prompt" in err and "interpolation" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.fast
@pytest.mark.parametrize("command", ["generate", "export"])
def test_a_run_config_cannot_choose_the_model_through_your_environment(
    tmp_path: Path, command: str
) -> None:
    """A hub id is a request to a host: a folder naming the model from a variable would
    send its value there."""
    run = _run_folder(tmp_path, **{"model.name": "${oc.env:ART_HYDRA_TEST_SECRET}"})
    args = ["-p", "x"] if command == "generate" else [str(tmp_path / "out")]
    proc = run_cli(
        command, str(run), *args, cwd=tmp_path, env={"ART_HYDRA_TEST_SECRET": "s3cr3t-marker"}
    )
    err = _one_line_refusal(proc)
    assert "model.name" in err and "environment" in err
    assert "s3cr3t-marker" not in proc.stdout + proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.fast
def test_a_run_config_cannot_send_the_commands_to_checkpoints_elsewhere(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, **{"checkpoint.dir": "../.."})
    err = _one_line_refusal(run_cli("generate", str(run), "-p", "x", cwd=tmp_path))
    assert "checkpoint.dir=../.." in err


# ---- a sweep folder's records are read within bounds ---------------------------------


def _sweep(root: Path, multirun: str) -> Path:
    sweep = root / "sweep"
    (sweep / "0").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(multirun)
    record = {"status": "done", "job_num": 0, "overrides": ["seed=0"]}
    (sweep / "0" / "result.json").write_text(json.dumps(record))
    return sweep


@pytest.mark.fast
@pytest.mark.parametrize(
    ("multirun", "named"),
    [
        (BOMB, "aliases"),
        ("hydra:\n  overrides:\n    task:\n    - seed=range(0,20000000)\n", "100,000"),
        ("hydra:\n  overrides:\n    task:\n    - lr=range(0.0,1.0,0.0)\n", "never ends"),
    ],
)
def test_summarize_reads_a_hostile_multirun_record_within_bounds(
    tmp_path: Path, multirun: str, named: str
) -> None:
    sweep = _sweep(tmp_path, multirun)
    started = time.monotonic()
    proc = run_cli("summarize", str(sweep), cwd=tmp_path, timeout=QUICK_S)
    assert proc.returncode == 0, output_of(proc)
    assert time.monotonic() - started < QUICK_S
    note = next(line for line in proc.stdout.splitlines() if line.startswith("Note:"))
    assert str(sweep / "multirun.yaml") in note and named in note
    assert "1 done" in proc.stdout  # the jobs are still summarised
    assert named in (sweep / "summary.md").read_text()


@pytest.mark.fast
def test_a_sweep_grid_is_counted_without_being_expanded() -> None:
    assert grid_size(["seed=range(0,20000)", "lr=0.1,0.2", "x=1"], "m.yaml") == 40_000
    assert grid_size(["lr=range(0.1,1.0,0.2)"], "m.yaml") == 5
    with pytest.raises(SweepTooLarge, match=r"m\.yaml.*b=range\(0,1000\).*100,000"):
        grid_size(["a=range(0,1000)", "b=range(0,1000)"], "m.yaml")
    assert MAX_POINTS == 100_000


@pytest.mark.fast
def test_a_result_record_that_is_a_fifo_does_not_block_the_summary(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, "hydra: {}\n")
    (sweep / "1").mkdir()
    os.mkfifo(sweep / "1" / "result.json")
    summary = summarize(sweep)
    assert {j.job_num: j.status for j in summary.jobs} == {0: "done", 1: "no record"}


@pytest.mark.fast
def test_resume_auto_refuses_an_alias_bomb_multirun_record_at_once(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, BOMB)
    master = compose(["seed=1"])
    (problem,) = sweep_folder_problems(sweep, master, resume_mode="auto")
    assert problem.key == "hydra.sweep.dir" and "aliases" in problem.reason
    started = time.monotonic()
    proc = run_cli(
        "-m", "seed=1,2", "resume=auto", f"hydra.sweep.dir={sweep}", "dry_run=true",
        cwd=tmp_path, timeout=QUICK_S,
    )  # fmt: skip
    assert time.monotonic() - started < QUICK_S
    assert proc.returncode == 1 and "Traceback" not in output_of(proc)
    assert "multirun.yaml" in proc.stderr + proc.stdout


# ---- the legitimate paths, on a trained run -------------------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny run of one step (a full fine-tune: the checkpoint holds the whole model)."""
    from art_hydra import train

    folder = tmp_path_factory.mktemp("trained") / "run"
    cfg = compose(
        [
            "trainer.max_steps=1",
            "trainer.per_device_train_batch_size=16",
            "model.finetune=full",
            "backend.device=cpu",
            "backend.cpu_threads=1",
            "logging.tensorboard=false",
            "logging.plot=false",
            "logging.progress_bar=off",
        ]
    )
    train(cfg, run_dir=folder)
    return folder


@pytest.mark.slow
def test_the_flag_on_the_command_line_still_allows_a_folders_model_code(
    trained_run: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    saved = OmegaConf.load(run / RUN_CONFIG)
    saved.model.trust_remote_code = True
    (run / RUN_CONFIG).write_text(OmegaConf.to_yaml(saved))
    (checkpoint,) = sorted((run / "checkpoints").glob("step-*"))
    _auto_map(checkpoint, marker)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    refused = run_cli("generate", str(run), "-p", "abc=", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and not marker.exists(), output_of(refused)
    args = ["-p", "abc=", "--max-new-tokens", "2", "--trust-remote-code"]
    allowed = run_cli("generate", str(run), *args, cwd=tmp_path, env=env)
    assert allowed.returncode == 0, output_of(allowed)
    assert marker.read_text() == "ran"  # the user's own choice, on the command line


@pytest.mark.slow
def test_generate_task_still_builds_the_runs_own_generator(trained_run: Path) -> None:
    args = ["--task", "--max-new-tokens", "2", "--json"]
    proc = run_cli("generate", str(trained_run), *args, cwd=trained_run.parent)
    assert proc.returncode == 0, output_of(proc)
    assert "right (reward 1)" in proc.stdout.splitlines()[-1]


@pytest.mark.slow
def test_a_value_a_run_folder_reads_from_the_environment_is_in_no_export_file(
    trained_run: Path, tmp_path: Path
) -> None:
    secret = "folder-secret-value-7c1e9a"
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    saved = OmegaConf.load(run / RUN_CONFIG)
    saved.task.name = "${oc.env:FOLDER_SECRET}"
    saved.task.system_prompt = "${oc.env:FOLDER_SECRET}"
    (run / RUN_CONFIG).write_text(OmegaConf.to_yaml(saved))
    out = tmp_path / "out"
    proc = run_cli("export", str(run), str(out), cwd=tmp_path, env={"FOLDER_SECRET": secret})
    assert proc.returncode == 0, output_of(proc)
    assert secret not in output_of(proc)
    holding = [p.name for p in out.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert holding == []
