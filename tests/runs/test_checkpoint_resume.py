"""Checkpoints load with stock peft/transformers; an interrupted run resumes exactly."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from conftest_model import QUICK
from safetensors.torch import load_file

from art_hydra import ConfigValidationError, compose, train
from art_hydra.engine.metrics import read_metrics
from art_hydra.runs.checkpoint import Checkpointer

#: These tests train the tiny model.
pytestmark = pytest.mark.slow

DETERMINISTIC = ("reward_mean", "reward_std", "loss", "grad_norm", "learning_rate", "entropy")


def test_lora_checkpoint_loads_with_stock_peft(tmp_path: Path) -> None:
    from peft import PeftModel

    from art_hydra.engine.backends.tiny import build_model, build_tokenizer

    cfg = compose([*QUICK, "model.finetune=lora", "model.lora.r=4", "trainer.max_steps=2"])
    summary = train(cfg, run_dir=tmp_path)
    ckpt = tmp_path / "checkpoints" / "step-000002"
    assert (ckpt / "adapter_model.safetensors").is_file()
    assert (ckpt / "adapter_config.json").is_file()
    assert (ckpt / "trainer_state" / "trainer.safetensors").is_file()  # optimizer moments
    assert (ckpt / "manifest.json").is_file()
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))  # atomic: no leftovers
    assert not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.pt"))

    tokenizer = build_tokenizer("".join(sorted(set("abcd="))))
    base = build_model(cfg.model, tokenizer, cfg.seed)
    model = PeftModel.from_pretrained(base, str(ckpt))
    saved = load_file(ckpt / "adapter_model.safetensors")
    lora_a = next(k for k in saved if "lora_A" in k)
    loaded = dict(model.named_parameters())
    match = [
        n
        for n in loaded
        if n.endswith(lora_a.split("base_model.model.")[-1].replace(".weight", ".default.weight"))
    ]
    assert match and torch.equal(loaded[match[0]].detach(), saved[lora_a])
    assert summary["steps"] == 2


def test_full_checkpoint_loads_with_from_pretrained(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train(compose([*QUICK, "trainer.max_steps=2"]), run_dir=tmp_path)
    ckpt = tmp_path / "checkpoints" / "step-000002"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    ids = tokenizer("abc=", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape[-1] == len(tokenizer)


def test_keep_last_prunes_old_checkpoints(tmp_path: Path) -> None:
    train(
        compose(
            [*QUICK, "trainer.max_steps=6", "checkpoint.every_steps=1", "checkpoint.keep_last=2"]
        ),
        run_dir=tmp_path,
    )
    names = [p.name for p in Checkpointer(tmp_path, compose(QUICK).checkpoint, 60).complete()]
    assert names == ["step-000005", "step-000006"]


class _Interrupt(KeyboardInterrupt):
    """Ctrl-C, delivered right after a checkpoint is written."""


def test_interrupted_run_resumes_to_the_same_weights_and_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = [
        *QUICK,
        "trainer.max_steps=6",
        "checkpoint.every_steps=3",
        "trainer.lr_scheduler_type=linear",
        "checkpoint.keep_last=5",
    ]
    whole = tmp_path / "whole"
    train(compose(overrides), run_dir=whole)

    parts = tmp_path / "parts"
    real_save = Checkpointer.save

    def save_then_interrupt(self, step, *args, **kwargs):  # type: ignore[no-untyped-def]
        path = real_save(self, step, *args, **kwargs)
        if step == 3:
            raise _Interrupt
        return path

    monkeypatch.setattr(Checkpointer, "save", save_then_interrupt)
    threads = threading.active_count()
    with pytest.raises(_Interrupt):
        train(compose(overrides), run_dir=parts)
    assert threading.active_count() == threads  # Ctrl-C left no thread behind
    assert [m["step"] for m in read_metrics(parts)] == [1, 2, 3]
    monkeypatch.setattr(Checkpointer, "save", real_save)
    train(compose([*overrides, "resume=true"]), run_dir=parts)

    a, b = read_metrics(whole), read_metrics(parts)
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(a, b, strict=True):
        for key in DETERMINISTIC:
            assert x[key] == pytest.approx(y[key], rel=1e-6, abs=1e-9), (x["step"], key)
    final_a = load_file(whole / "checkpoints" / "step-000006" / "model.safetensors")
    final_b = load_file(parts / "checkpoints" / "step-000006" / "model.safetensors")
    assert final_a.keys() == final_b.keys()
    for name in final_a:
        assert torch.allclose(final_a[name], final_b[name], atol=1e-6), name
    state = json.loads(
        (parts / "checkpoints" / "step-000006" / "trainer_state" / "state.json").read_text()
    )
    assert state["step"] == 6


def test_resume_without_checkpoint_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    with pytest.raises(ConfigValidationError, match="holds no complete checkpoint") as info:
        train(compose([*QUICK, "resume=true"]), run_dir=tmp_path)
    assert [p.key for p in info.value.problems] == ["resume"]
    assert list(tmp_path.iterdir()) == []


def test_a_saved_model_trains_again_as_a_pretrained_model(tmp_path: Path) -> None:
    """The `from_pretrained` path real hub ids take, on a local folder (no hub here)."""
    train(compose([*QUICK, "trainer.max_steps=2"]), run_dir=tmp_path / "first")
    folder = tmp_path / "first" / "checkpoints" / "step-000002"
    summary = train(
        compose(
            [
                *QUICK,
                "trainer.max_steps=2",
                "model.source=pretrained",
                f"model.name={folder}",
                "model.finetune=lora",
                "model.lora.target_modules=[q_proj,v_proj]",
            ]
        ),
        run_dir=tmp_path / "second",
    )
    assert summary["steps"] == 2
    adapter = tmp_path / "second" / "checkpoints" / "step-000002" / "adapter_config.json"
    assert json.loads(adapter.read_text())["base_model_name_or_path"] == str(folder)
