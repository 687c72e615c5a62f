"""What loading a model would decide, decided by the pre-flight from its folder's files:
LoRA module names read from the safetensors header and judged by the run's own rules
(the pre-flight and the loaded model agree, family by family), the dtype
``model.dtype=auto`` loads under ``model.master_weights=false``, and ``model.revision``
on a local folder. Tiny real folders, saved with ``save_pretrained``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import output_of, problem_about, report_entries, run_cli
from family_models import FAMILIES, save_family
from model_folders import gpt2_tokenizer, hub_cache_entry, random_model

from art_hydra import Severity, compose
from art_hydra.config.problems import Kind
from art_hydra.preflight import world_problems
from art_hydra.preflight.model_load import model_load_problems

#: Families whose checkpoint names are their modules' names (Llama, Gemma with its tied
#: head, Gemma 2, Mistral, Qwen2, Phi-3, a Mamba-2 hybrid), GPT-2 (Conv1D layers, tied
#: head) built apart, and Mixtral, whose experts transformers fuses as it loads.
NAMES = ["llama", "gemma", "gemma2-eager", "mistral-window4", "qwen2", "phi3", "falcon_h1"]


class Folders:
    """The family folders, each built on first use and kept for the module."""

    def __init__(self, root: Path) -> None:
        self.root, self.built = root, {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.built:
            folder = self.root / name
            if name == "gpt2":
                random_model(folder, "gpt2", gpt2_tokenizer(folder))
            else:
                model_type, extra, *_ = FAMILIES[name]
                save_family(folder, model_type, extra)
            self.built[name] = folder
        return self.built[name]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Folders:
    return Folders(tmp_path_factory.mktemp("load"))


def _overrides(folder: Path, *extra: str) -> list[str]:
    return [
        "model=pretrained",
        f"model.name={folder}",
        "model.finetune=lora",
        "model.lora.modules_to_save=[]",
        "model.max_seq_length=64",
        "rl.max_prompt_length=32",
        "rl.max_completion_length=16",
        *extra,
    ]


def _lora(problems: list[Any]) -> list[Any]:
    return [p for p in problems if p.key.startswith("model.lora.") and p.is_error]


def _listed(names: list[str]) -> str:
    return "[" + ",".join(names) + "]"


# ---- LoRA module names: the pre-flight and the loaded model agree ------------------------


@pytest.mark.model  # loads each family's model
@pytest.mark.parametrize("name", [*NAMES, "gpt2"])
def test_the_preflight_and_the_loaded_model_agree_on_lora_names(
    folders: Folders, name: str
) -> None:
    """Every verdict of the run's check (on the loaded model) is the pre-flight's: the
    layers the run names pass, full and partial paths pass, a block, a norm, a typo, an
    activation and peft's all-linear shorthand are refused by both."""
    from transformers import AutoModelForCausalLM

    from art_hydra.engine.backends.adapters import module_tree, unmatched_names

    model = AutoModelForCausalLM.from_pretrained(folders[name])
    tree = module_tree(model)
    layers = tree.linear
    full = next(n for n, what in tree.modules.items() if not what and n.endswith(layers[0]))
    tails = ".".join(full.split(".")[-2:])
    targets = [layers, [layers[0]], [full], [tails], ["mlp"], ["input_layernorm"], ["qkv"]]
    targets += [["all-linear"], ["act_fn"], [layers[0], "qkv"]]
    saved = [["lm_head"], ["lm_haed"], ["act_fn"], ["mlp"], [full]]
    others = layers[1:] or layers  # target layers other than the one trained in full
    cases = [(t, []) for t in targets] + [(others, s) for s in saved]
    cfg = compose(_overrides(folders[name]))
    for target, trained in cases:
        cfg.model.lora.target_modules, cfg.model.lora.modules_to_save = target, trained
        preflight = [p for p in model_load_problems(cfg) if p.key.startswith("model.lora.")]
        run = unmatched_names(model, cfg.model.lora)
        case = (target, trained)
        assert [p.key for p in preflight] == [p.key for p in run], (case, preflight, run)
        assert [p.fix for p in preflight] == [p.fix for p in run], case
        assert all(p.kind == Kind.world for p in preflight)


@pytest.mark.parametrize("name", NAMES)
def test_the_default_targets_pass_where_the_family_has_them(folders: Folders, name: str) -> None:
    problems = model_load_problems(compose(_overrides(folders[name])))
    if name == "phi3":  # the defaults are Llama's; Phi-3 fuses qkv_proj and gate_up_proj
        assert [p.key for p in problems] == ["model.lora.target_modules"]
    else:
        assert problems == []


def test_gpt2_conv1d_layers_and_its_tied_head(folders: Folders) -> None:
    """GPT-2's projections are Conv1D (transposed weights) and its head has no tensor
    of its own: both are modules LoRA can name."""
    folder = folders["gpt2"]
    assert (
        _lora(
            world_problems(compose(_overrides(folder, "model.lora.target_modules=[c_attn]")), None)
        )
        == []
    )
    tied = _overrides(
        folder, "model.lora.target_modules=[c_attn,c_proj]", "model.lora.modules_to_save=[lm_head]"
    )
    assert _lora(world_problems(compose(tied), None)) == []
    refused = problem_about(
        _lora(world_problems(compose(_overrides(folder)), None)), "model.lora.target_modules"
    )
    assert refused.fix.overrides() == ["model.lora.target_modules=[c_attn,c_fc,c_proj]"]


def test_a_family_renamed_at_load_is_left_to_the_run(folders: Folders) -> None:
    """Mixtral's checkpoint names its experts w1/w2/w3, which transformers fuses as it
    loads: the header's names are not the model's, so only the run judges them."""
    cfg = compose(_overrides(folders["mixtral"], "model.lora.target_modules=[qkv]"))
    assert _lora(world_problems(cfg, None)) == []


def test_a_cached_hub_snapshot_is_read_too(
    folders: Folders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf_home = tmp_path / "hf"
    hub_cache_entry(folders["llama"], hf_home, "someone/tiny-llama")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    cfg = compose(_overrides(Path("someone/tiny-llama"), "model.lora.target_modules=[qkv]"))
    problem = problem_about(_lora(world_problems(cfg, None)), "model.lora.target_modules")
    assert problem.fix.overrides() == [
        "model.lora.target_modules=[down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj]"
    ]


def test_dry_run_refuses_the_targets_the_run_refuses(folders: Folders, tmp_path: Path) -> None:
    """``dry_run=true`` said "valid" for a target only the loaded model refused; the
    real CLI now refuses it before anything loads, with the run's fix."""
    overrides = _overrides(folders["llama"], "model.lora.target_modules=[q_proj,qkv]")
    proc = run_cli(*overrides, "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert report_entries(out) == [
        ("model.lora.target_modules", "['q_proj', 'qkv']", "model.lora.target_modules=[q_proj]")
    ]
    assert "Traceback" not in out and not (tmp_path / "outputs").exists()


# ---- model.master_weights=false under model.dtype=auto ------------------------------------


def _saved_in(folders: Folders, tmp_path: Path, dtype: str, key: str = "dtype") -> Path:
    """The Llama folder with its weights and config.json in ``dtype`` (``key``: the
    config's name for it; None: the config does not say, the weights do)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(shutil.copytree(folders["llama"], tmp_path / dtype))
    model = AutoModelForCausalLM.from_pretrained(folder).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    if key:
        config[key] = dtype
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _pure(folder: Path, *extra: str) -> list[str]:
    return _overrides(folder, "model.finetune=full", "model.master_weights=false", *extra)


@pytest.mark.parametrize("key", ["dtype", "torch_dtype", ""])
def test_a_float16_folder_without_masters_is_refused_before_loading(
    folders: Folders, tmp_path: Path, key: str
) -> None:
    folder = _saved_in(folders, tmp_path, "float16", key)
    problem = problem_about(world_problems(compose(_pure(folder)), None), "model.master_weights")
    assert problem.is_error and "float16" in problem.reason
    assert (f"config.json {key}=float16" if key else "F16") in problem.reason
    assert problem.fix.overrides() == ["model.master_weights=true"]
    assert problem.fix.alt.overrides() == ["model.dtype=bfloat16"]
    for remedy in (problem.fix, problem.fix.alt):
        fixed = compose([*_pure(folder), *remedy.overrides()])
        assert "model.master_weights" not in {p.key for p in world_problems(fixed, None)}


def test_a_bfloat16_folder_trains_pure_and_a_float32_one_is_told_it_does_nothing(
    folders: Folders, tmp_path: Path
) -> None:
    bf16 = _saved_in(folders, tmp_path, "bfloat16")
    assert "model.master_weights" not in {p.key for p in world_problems(compose(_pure(bf16)), None)}
    problem = problem_about(
        world_problems(compose(_pure(folders["llama"])), None), "model.master_weights"
    )
    assert problem.severity == Severity.warning and "does nothing" in problem.reason
    # Under LoRA the validator says it does nothing, whatever the folder holds.
    lora = compose([*_pure(bf16), "model.finetune=lora"])
    assert len([p for p in world_problems(lora, None) if p.key == "model.master_weights"]) == 0


# ---- model.revision on a local folder ------------------------------------------------------


def test_a_revision_on_a_local_folder_is_a_warning_whose_fix_composes(
    folders: Folders,
) -> None:
    overrides = _overrides(folders["llama"], "model.revision=v1.0")
    problem = problem_about(world_problems(compose(overrides), None), "model.revision")
    assert problem.severity == Severity.warning and str(folders["llama"]) in problem.reason
    assert problem.fix.overrides() == ["model.revision=null"]
    fixed = compose([*overrides, *problem.fix.overrides()])
    assert "model.revision" not in {p.key for p in world_problems(fixed, None)}


def test_a_revision_of_a_cached_hub_id_is_no_warning(
    folders: Folders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf_home = tmp_path / "hf"
    hub_cache_entry(folders["llama"], hf_home, "someone/tiny-llama")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    cfg = compose(_overrides(Path("someone/tiny-llama"), "model.revision=0123abcd"))
    assert "model.revision" not in {p.key for p in world_problems(cfg, None)}
