"""LoRA targets are matched against the loaded model's own module names (the run
moment): a name that matches nothing is one clean report, never peft's traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest_model import QUICK

from art_hydra import ConfigValidationError, Kind, compose, train

pytestmark = pytest.mark.slow


def test_unknown_target_and_saved_modules_are_named_with_the_models_own(tmp_path: Path) -> None:
    cfg = compose(
        [
            *QUICK,
            "model.finetune=lora",
            "model.lora.target_modules=[q_proj,qkv]",
            "model.lora.modules_to_save=[head]",
        ]
    )
    with pytest.raises(ConfigValidationError) as info:
        train(cfg, run_dir=tmp_path / "run")
    problems = {p.key: p for p in info.value.problems}
    assert set(problems) == {"model.lora.target_modules", "model.lora.modules_to_save"}
    target = problems["model.lora.target_modules"]
    assert target.kind == Kind.run
    assert "qkv matches no module of LlamaForCausalLM" in target.reason
    assert "q_proj" in target.reason and "o_proj" in target.reason  # the real names
    assert "lm_head" not in target.reason  # the head is not a LoRA target
    assert target.fix.overrides() == ["model.lora.target_modules=[q_proj]"]
    assert "Traceback" not in str(info.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_lora_trains_only_adapters_and_the_saved_modules(tmp_path: Path) -> None:
    from art_hydra.engine.backends import load_model
    from art_hydra.tasks import build_task

    cfg = compose([*QUICK, "model.finetune=lora", "model.lora.target_modules=[q_proj,v_proj]"])
    loaded = load_model(cfg.model, cfg.backend, cfg.seed, charset=build_task(cfg).charset())
    trained = [n for n, p in loaded.model.named_parameters() if p.requires_grad]
    assert trained and all(("lora_" in n) or ("modules_to_save" in n) for n in trained)
    assert any("lm_head.modules_to_save" in n for n in trained)
    assert not any("k_proj.lora" in n for n in trained)


def test_gpt2_targets_are_its_conv1d_layers_never_the_head(tmp_path: Path) -> None:
    """GPT-2's projections are transformers' Conv1D, which peft wraps: the fix names
    them, not the output head."""
    from model_folders import gpt2_tokenizer, random_model
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from art_hydra.config.schema import LoraConfig
    from art_hydra.engine.backends.adapters import unmatched_names

    folder = tmp_path / "gpt2"
    random_model(folder, "gpt2", gpt2_tokenizer(folder))
    model = AutoModelForCausalLM.from_pretrained(folder)
    (problem,) = unmatched_names(model, OmegaConf.structured(LoraConfig()))
    assert problem.fix.overrides() == ["model.lora.target_modules=[c_attn,c_fc,c_proj]"]
