"""What never trains is kept in the half type a run asks for: a LoRA base under
``model.dtype=float16`` or ``bfloat16`` lives in it (it was float32 under float16, so the
adapters saved no memory), and the frozen copies of full fine-tuning (the reference
policy for ``rl.beta > 0``, the overlapped sampler) store their linear weights in it
(they were float32 copies of the masters) while computing the very logprobs the policy
computes at the same weights."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from family_models import load_family, save_family

from art_hydra.engine.backends.torch_backend import frozen_copy
from art_hydra.engine.queue import StepWork
from art_hydra.engine.recipe import build_trainer_and_producer
from art_hydra.engine.rl import logprobs
from art_hydra.engine.rl.logprobs import head_matches
from art_hydra.engine.trainer import packed_logprobs

HALF = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: Two families: untied head (Llama), and a head tied to the embeddings (Gemma).
FAMILIES = {"llama": ("llama", {}), "gemma": ("gemma", {})}
#: A small RL job on a family model: 2 groups of 4 completions of up to 8 tokens.
SMALL = [
    "trainer.per_device_train_batch_size=8",
    "rl.num_generations=4",
    "rl.max_completion_length=8",
    "trainer.learning_rate=1e-3",
    "trainer.max_steps=2",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        name: save_family(tmp_path_factory.mktemp(name), model_type, extra)
        for name, (model_type, extra) in FAMILIES.items()
    }


def _bytes(params: Any) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _frozen(model: Any) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if not p.requires_grad]


def _linear_weights(model: Any) -> dict[str, torch.Tensor]:
    return {
        f"{name}.{key}": p
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        for key, p in module.named_parameters(recurse=False)
    }


def _steps(trainer: Any, producer: Any, n: int = 2) -> list[float]:
    losses = []
    for _ in range(n):
        result = trainer.train_step(StepWork(producer.make_inputs()))
        assert result is not None
        losses.append(result.loss)
        if hasattr(producer, "refresh_sampler"):  # RL (SFT samples nothing)
            producer.refresh_sampler()
    return losses


@pytest.mark.parametrize("dtype", sorted(HALF))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_lora_base_is_frozen_in_the_half_type_and_its_adapters_train(
    folders: dict[str, Path], family: str, dtype: str
) -> None:
    lora = ["model.finetune=lora", "algorithm=sft", *SMALL[:1], *SMALL[3:]]  # SFT: a gradient
    _, full = load_family(folders[family], overrides=[*lora, "model.dtype=float32"])
    cfg, loaded = load_family(folders[family], overrides=[*lora, f"model.dtype={dtype}"])
    frozen = _frozen(loaded.model)
    assert frozen and all(p.dtype == HALF[dtype] for p in frozen)
    assert 2 * _bytes(frozen) == _bytes(_frozen(full.model))
    trained = {n: p for n, p in loaded.model.named_parameters() if p.requires_grad}
    assert trained and all(p.dtype == torch.float32 for p in trained.values())
    before = {n: p.detach().clone() for n, p in trained.items()}
    trainer, producer = build_trainer_and_producer(cfg, loaded=loaded)
    assert all(math.isfinite(loss) for loss in _steps(trainer, producer))
    assert any(not torch.equal(p, before[n]) for n, p in trained.items())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_full_tuning_copies_keep_linear_weights_in_the_half_type(
    folders: dict[str, Path], family: str
) -> None:
    """The reference and the overlapped sampler: half the bytes of every linear weight,
    embeddings and norms kept float32, and at the policy's weights the same logprobs
    to the bit under the run's autocast; steps train, the sampler follows the masters
    and the reference does not."""
    overrides = [*SMALL, "model.dtype=bfloat16", "rl.beta=0.1", "rl.overlap_rollouts=true"]
    cfg, loaded = load_family(folders[family], overrides=overrides)
    trainer, producer = build_trainer_and_producer(cfg, loaded=loaded)
    policy = trainer.model
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # the masters
    embedding = policy.get_input_embeddings().weight
    tied = policy.get_output_embeddings().weight is embedding
    assert tied == (family == "gemma")  # a head tied to the embeddings is read by both
    linear = {n: p for n, p in _linear_weights(policy).items() if p is not embedding}
    for copy in (trainer.reference, producer.engine.copy):
        halved = {n: p for n, p in _linear_weights(copy).items() if n in linear}
        assert halved.keys() == linear.keys()
        assert all(p.dtype == torch.bfloat16 for p in halved.values())
        assert 2 * _bytes(halved.values()) == _bytes(linear.values())
        others = [p for p in copy.parameters() if p.dtype != torch.bfloat16]
        assert others and all(p.dtype == torch.float32 for p in others)
        assert copy.get_input_embeddings().weight.dtype == torch.float32
        assert (copy.get_output_embeddings().weight is copy.get_input_embeddings().weight) == tied
        assert _bytes(copy.parameters()) < _bytes(policy.parameters())
        assert not any(p.requires_grad for p in copy.parameters())

    batch = producer.make_inputs()[0]
    batch.to(loaded.device)
    policy.eval()
    with torch.no_grad(), loaded.compute_precision():
        expected = packed_logprobs(policy, batch, trainer.training_loss.sampling)[0]
        for copy in (trainer.reference, producer.engine.copy):
            got = packed_logprobs(copy, batch, trainer.training_loss.sampling)[0]
            assert torch.equal(got, expected)

    masters = {n: p.detach().clone() for n, p in policy.named_parameters()}
    assert all(math.isfinite(loss) for loss in _steps(trainer, producer))
    with torch.no_grad():  # an update of every weight, as a step with signal makes
        for param in policy.parameters():
            param.add_(torch.randn_like(param), alpha=0.01)
    producer.refresh_sampler()
    trained, sampled = (
        dict(policy.named_parameters()),
        dict(producer.engine.copy.named_parameters()),
    )
    reference = dict(trainer.reference.named_parameters())
    for name, master in trained.items():  # rounded as autocast rounds them
        assert torch.equal(sampled[name], master.detach().to(sampled[name].dtype)), name
        assert torch.equal(reference[name], masters[name].to(reference[name].dtype)), name


def test_a_copy_without_mixed_precision_keeps_every_dtype(folders: dict[str, Path]) -> None:
    for dtype in ("float32", "bfloat16"):
        pure = [f"model.dtype={dtype}", "model.master_weights=false"]
        _, loaded = load_family(folders["llama"], overrides=pure if dtype != "float32" else [])
        twin = frozen_copy(loaded.model, loaded.autocast)
        pairs = zip(loaded.model.parameters(), twin.parameters(), strict=True)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in pairs)


def test_the_chunked_head_check_runs_on_models_mixing_half_and_float32(
    folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked once per model class on whichever model comes first (the overlapped
    sampler's copy may): a model holding half weights beside float32 ones computes only
    under autocast, and the check once took it for an unknown head (full logits)."""
    _, masters = load_family(folders["llama"], overrides=["model.dtype=bfloat16"])
    lora = ["model.dtype=bfloat16", "model.finetune=lora", "model.lora.modules_to_save=[lm_head]"]
    _, adapters = load_family(folders["llama"], overrides=lora)
    ids = torch.arange(3, 11).unsqueeze(0)
    for model in (masters.frozen_copy(), adapters.model):
        monkeypatch.setattr(logprobs, "_VERIFIED", {})
        assert head_matches(model, ids)
