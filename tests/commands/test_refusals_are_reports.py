"""Every refusal is a report, at every moment (composition, world pre-flight, run),
never a traceback: the cases practitioners hit (issue 18), each with others of its class.

Each test runs the real CLI and checks the exit status, that no traceback is printed,
and that the report names the key at fault (read from the report's entries).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import output_of, report_entries

from art_hydra.preflight import cuda_present

QUICK = (
    "trainer.max_steps=1",
    "trainer.per_device_train_batch_size=16",
    "logging.plot=false",
    "logging.tensorboard=false",
    "logging.progress_bar=off",
)


def _refused(proc: subprocess.CompletedProcess, key: str) -> str:
    """The output of a refused command, after checking it is a report naming ``key``."""
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    assert key in [k for k, _, _ in report_entries(out)], out
    return out


# ---- values composition refuses, which no later check may read again ------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.name=???", "model.name"),
        ("model.name=", "model.name"),
        ("model.name=${oc.env:ART_HYDRA_UNSET_VARIABLE}/x", "model.name"),
        ("task.reward._target_=???", "task.reward._target_"),
        ("task.reward._target_=${oc.env:ART_HYDRA_UNSET_VARIABLE}", "task.reward._target_"),
        ("task.generator=???", "task.generator"),
        ("task.name=???", "task.name"),
        ("backend.device=???", "backend.device"),
        ("hydra.run.dir=???", "hydra.run.dir"),
        ("hydra.run.dir=${oc.env:ART_HYDRA_UNSET_VARIABLE}", "hydra.run.dir"),
        ("hydra.job.chdir=???", "hydra.job.chdir"),
    ],
)
def test_a_value_composition_refuses_is_reported_once(cli, override: str, key: str) -> None:
    out = _refused(cli(override, "dry_run=true"), key)
    assert [k for k, _, _ in report_entries(out)].count(key) == 1, out


def test_a_value_composition_refuses_under_a_real_model_source(cli) -> None:
    _refused(cli("model.source=pretrained", "model.name=???", "dry_run=true"), "model.name")


def test_a_value_composition_refuses_in_a_sweep(cli) -> None:
    out = output_of(cli("-m", "task.reward._target_=???", "seed=1,2"))
    assert "Traceback" not in out and "task.reward._target_" in out, out
    assert "No job was launched" in out


def test_a_hydra_value_that_cannot_be_read_is_refused_before_a_sweep(cli) -> None:
    _refused(cli("-m", "hydra.sweep.dir=???", "seed=1,2"), "hydra.sweep.dir")


# ---- the run folder: a file, under a file, a place no folder can be made ---------------


def test_a_run_folder_that_cannot_be_created_is_refused(cli, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for folder in ("afile", "afile/sub", "afile/sub/deeper", "/proc/art_hydra_run"):
        _refused(cli(f"hydra.run.dir={folder}", *QUICK), "hydra.run.dir")
    assert not (tmp_path / "outputs").exists()


def test_a_sweep_folder_that_cannot_be_created_is_refused(cli) -> None:
    out = output_of(cli("-m", "hydra.sweep.dir=/proc/art_hydra_sweep", "seed=1,2"))
    assert "Traceback" not in out and "hydra.sweep.dir" in out, out
    assert "No job was launched" in out


# ---- ranks the environment announces --------------------------------------------------


def test_world_size_without_torchrun_is_refused(cli) -> None:
    out = _refused(cli(*QUICK, env={"WORLD_SIZE": "2"}), "distributed.world_size")
    assert "torchrun" in out and "RANK" in out
    place = {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    out = _refused(cli(*QUICK, env=place), "distributed.world_size")
    assert "RANK=2" in out


@pytest.mark.skipif(cuda_present(), reason="NCCL is usable where a CUDA GPU is visible")
def test_nccl_on_a_cpu_is_refused_for_ranks_and_warned_alone(cli) -> None:
    ranks = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    _refused(cli("distributed.backend=nccl", "dry_run=true", env=ranks), "distributed.backend")
    alone = cli("distributed.backend=nccl", "dry_run=true")
    assert alone.returncode == 0 and "distributed.backend" in alone.stderr, output_of(alone)


# ---- LoRA targets peft cannot wrap, or would wrap twice ----------------------------------


def test_lora_lists_naming_one_module_twice_are_refused_at_composition(cli) -> None:
    out = _refused(
        cli("model.finetune=lora", "model.lora.target_modules=[q_proj,lm_head]", "dry_run=true"),
        "model.lora.target_modules",
    )
    assert "model.lora.target_modules=[q_proj]" in out


@pytest.mark.parametrize(
    ("targets", "fixed"),
    [
        ("[mlp]", "model.lora.target_modules=[down_proj,gate_proj,up_proj]"),
        ("[layers.0.self_attn.q_proj,v_proj]", "model.lora.target_modules=[v_proj]"),
    ],
)
def test_lora_targets_are_checked_before_peft_is_called(cli, targets: str, fixed: str) -> None:
    """A block (peft refuses it with a traceback) or a module also trained in full
    (``modules_to_save=[q_proj]`` here), found among the model's own modules."""
    proc = cli(
        "model.finetune=lora",
        f"model.lora.target_modules={targets}",
        "model.lora.modules_to_save=[q_proj]" if "layers.0" in targets else "seed=1",
        *QUICK,
    )
    out = _refused(proc, "model.lora.target_modules")
    assert fixed in out


# ---- paths relative to the launch folder under hydra.job.chdir=true ---------------------


def test_a_relative_path_that_is_not_there_is_refused_under_chdir(cli) -> None:
    _refused(
        cli(
            "task=jsonl",
            "task.path=missing.jsonl",
            "rl.max_prompt_length=16",
            "rl.max_completion_length=16",
            "hydra.job.chdir=true",
            *QUICK,
        ),
        "task.path",
    )


@pytest.mark.slow
def test_a_relative_data_path_is_read_from_the_launch_folder_under_chdir(
    cli, tmp_path: Path
) -> None:
    rows = "".join(f'{{"prompt": "{w}", "answer": "{w[::-1]}"}}\n' for w in ("ab", "ba", "abc"))
    (tmp_path / "data.jsonl").write_text(rows)
    proc = cli(
        "task=jsonl",
        "task.path=data.jsonl",
        "rl.max_prompt_length=16",
        "rl.max_completion_length=16",
        "hydra.job.chdir=true",
        "hydra.run.dir=runs/one",
        *QUICK,
    )
    assert proc.returncode == 0, output_of(proc)
    assert "Traceback" not in output_of(proc)
    assert (tmp_path / "runs" / "one" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_relative_model_folder_is_read_from_the_launch_folder_under_chdir(
    cli, tmp_path: Path
) -> None:
    """model.name is an enum-guarded path key (model.source=pretrained): anchored too."""
    from model_folders import chatml_model

    chatml_model(tmp_path / "models" / "qwen2")
    proc = cli(
        "model=pretrained",
        "model.name=models/qwen2",
        "rl.max_prompt_length=64",
        "rl.max_completion_length=8",
        "hydra.job.chdir=true",
        "hydra.run.dir=runs/one",
        *QUICK,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, output_of(proc)
    assert "Traceback" not in output_of(proc)
    assert (tmp_path / "runs" / "one" / "metrics.jsonl").exists()
