"""A model folder whose tokenizer names no EOS and no pad token: the pre-flight says which
ones the run derives, and the torch backend derives exactly those (RL and SFT crashed
with a TypeError on the missing pad id)."""

from __future__ import annotations

from pathlib import Path

import pytest
from family_models import save_family

from art_hydra import compose, train
from art_hydra.engine.backends.torch_backend import load_base
from art_hydra.preflight import world_problems


def _bare_tokenizer_folder(root: Path) -> Path:
    """A llama folder (config eos_token_id=2) whose tokenizer has BOS and UNK only."""
    from transformers import PreTrainedTokenizerFast

    from art_hydra.engine.backends.tiny import build_tokenizer

    folder = save_family(root / "llama", "llama", {})
    for path in folder.glob("tokenizer*"):
        path.unlink()
    core = build_tokenizer().backend_tokenizer
    PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", unk_token="<unk>"
    ).save_pretrained(folder)
    return folder


def _overrides(folder: Path, *extra: str) -> list[str]:
    return [
        "model.source=pretrained",
        f"model.name={folder}",
        "model.finetune=full",
        "model.max_seq_length=32",
        "rl.max_prompt_length=8",
        "rl.max_completion_length=4",
        "sft.max_length=16",
        "backend.device=cpu",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=8",
        "checkpoint.every_steps=0",
        "logging.tensorboard=false",
        "logging.plot=false",
        "logging.progress_bar=off",
        *extra,
    ]


def test_the_backend_derives_eos_and_pad_as_the_preflight_says(tmp_path: Path) -> None:
    folder = _bare_tokenizer_folder(tmp_path)
    cfg = compose(_overrides(folder))
    (said,) = world_problems(cfg, None)
    assert "takes '<eos>' from generation_config.json eos_token_id=2" in said.reason
    assert "as the pad token" in said.reason
    _, tokenizer = load_base(cfg.model, seed=0)
    assert tokenizer.eos_token == "<eos>" and tokenizer.pad_token == "<eos>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 2


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["rl", "sft"])
def test_rl_and_sft_train_on_a_tokenizer_without_eos_or_pad(tmp_path: Path, algorithm: str) -> None:
    folder = _bare_tokenizer_folder(tmp_path)
    cfg = compose(_overrides(folder, f"algorithm={algorithm}"))
    summary = train(cfg, run_dir=tmp_path / "run")
    assert summary["steps"] == 2


def test_a_checkpoint_missing_weights_is_refused_at_load(tmp_path: Path) -> None:
    """A truncated re-save (a norm and a projection gone) would train a partly random
    model: the load refuses it, naming the tensors; the complete folder loads."""
    from model_folders import chatml_model
    from omegaconf import OmegaConf
    from safetensors.torch import load_file, save_file

    from art_hydra.config.schema import ModelConfig, ModelSource
    from art_hydra.engine.backends.torch_backend import MissingWeightsError, load_base

    folder = chatml_model(tmp_path / "qwen2")
    model_cfg = OmegaConf.structured(ModelConfig(name=str(folder), source=ModelSource.pretrained))
    load_base(model_cfg, seed=0)  # complete: loads (the tied head is not "missing")
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    gone = [k for k in tensors if k.endswith("norm.weight")][:1]
    gone += [k for k in tensors if k.endswith("v_proj.weight")][:1]
    save_file({k: v for k, v in tensors.items() if k not in gone}, weights, {"format": "pt"})
    with pytest.raises(MissingWeightsError) as raised:
        load_base(model_cfg, seed=0)
    assert all(name in str(raised.value) for name in gone)
