"""Sharding (art_hydra/engine/sharding.py) on tiny random-weight models of real families,
saved to a folder and loaded as a user's: the blocks FSDP2 shards are the family's
decoder layers (its ``_no_split_modules``), the sharded root's training logprobs and
gradients equal the unsharded model's, and the whole copy (what each rank samples
from), the gathered state (what a checkpoint writes) and the loading hook (what a
resume reads) keep every parameter, buffer and tie. One process on a one-rank gloo
mesh: the same code paths as several ranks, without their launch
(tests/distributed/test_sharded.py runs two ranks end to end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from family_models import FAMILIES, HYBRIDS, load_family, save_family
from safetensors.torch import save_file

from art_hydra.config.schema import FSDPConfig
from art_hydra.engine.distributed import World
from art_hydra.engine.packing import Sequence, pack
from art_hydra.engine.rl.logprobs import PolicyLogprobs
from art_hydra.engine.rl.sampling import SamplingSettings
from art_hydra.engine.sharding import (
    blocks,
    full,
    gathered_state,
    is_sharded,
    parameter_target,
    place_on_load,
    read_placed,
    shard,
    whole_copy,
)

pytestmark = pytest.mark.model

#: Families whose structure sharding depends on: plain, tied head, soft-capped logits
#: and sliding windows, a padded layout, experts, a hybrid with state-space layers.
CASES = {
    "llama": FAMILIES["llama"][:2],
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "gemma2-eager": FAMILIES["gemma2-eager"][:2],
    "mistral-window4": FAMILIES["mistral-window4"][:2],
    "qwen3_moe": FAMILIES["qwen3_moe"][:2],
    "falcon_h1": HYBRIDS["falcon_h1"],
}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A one-rank gloo process group for the module (destroyed after it)."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("group") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield World(rank=0, size=1, strategy="fsdp", fsdp=FSDPConfig())
    dist.destroy_process_group()


def _batch(loaded: Any) -> Any:
    vocab = loaded.model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(5)
    sequences = [
        Sequence(torch.randint(4, vocab, (4 + i + 5,), generator=gen).tolist(), 4 + i, 1.0)
        for i in range(3)
    ]
    batch = pack(sequences, 64, loaded.tokenizer.pad_token_id, loaded.layout)
    batch.step_loss_tokens = batch.loss_tokens
    return batch


def _logprobs(policy: Any, batch: Any) -> torch.Tensor:
    mask = batch.attention_mask(torch.float32)
    found, _ = policy(
        batch.input_ids,
        mask,
        batch.position_ids,
        batch.loss_mask,
        batch.targets,
        SamplingSettings(),
    )
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_family_shards_by_its_blocks_and_keeps_its_weights_whole_where_needed(
    tmp_path: Path, one_rank: World, case: str
) -> None:
    model_type, extra = CASES[case]
    _, loaded = load_family(save_family(tmp_path / case, model_type, extra))
    model = loaded.model
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    assert tied or case != "qwen2-tied"  # Gemma ties its head by default too
    before = {k: v.clone() for k, v in model.state_dict().items()}
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    batch = _batch(loaded)
    plain = PolicyLogprobs(model)
    expected = _logprobs(plain, batch)
    (expected * batch.loss_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    layers = blocks(model)
    assert len(layers) == model.config.num_hidden_layers, [type(b).__name__ for b in layers]
    sharding = shard(plain, model, one_rank, one_rank.fsdp, loaded.device)
    place_on_load(model)
    loaded.sharding = sharding
    assert sharding.units == len(layers)
    found = _logprobs(sharding.root, batch)
    assert torch.allclose(found, expected, atol=1e-6, rtol=0)
    (found * batch.loss_mask).sum().backward()
    for name, param in model.named_parameters():
        if name in grads:
            assert torch.allclose(full(param.grad), grads[name], atol=1e-6, rtol=1e-5), name

    copy = whole_copy(sharding, model, loaded.device)
    assert (copy.lm_head.weight is copy.get_input_embeddings().weight) == tied
    assert copy.state_dict().keys() == before.keys()
    assert all(torch.equal(copy.state_dict()[k], v) for k, v in before.items())
    assert all(torch.equal(dict(copy.named_buffers())[k], v) for k, v in buffers.items())
    with torch.no_grad():
        ids = batch.input_ids[:1, :6]
        assert torch.allclose(copy(input_ids=ids).logits, _whole(before, copy)(ids), atol=1e-6)

    whole = gathered_state(model, main=True)
    assert whole.keys() == before.keys()
    assert all(torch.equal(whole[k], v) for k, v in before.items())
    if tied:
        assert whole["lm_head.weight"] is whole["model.embed_tokens.weight"]
    saved = tmp_path / "whole.safetensors"
    save_file(
        {k: v.contiguous() for k, v in whole.items() if k != "lm_head.weight" or not tied}, saved
    )
    read = read_placed(saved, parameter_target(model))
    names = dict(model.named_parameters())
    for name, value in read.items():
        assert is_sharded(value) == (name in names), name  # shards, never whole parameters
        assert torch.equal(full(value), before[name]), name
    moved = {k: v + 1.0 if v.is_floating_point() else v for k, v in before.items()}
    model.load_state_dict(moved)  # whole tensors, cut to the shards by the hook
    again = gathered_state(model, main=True)
    assert all(
        torch.equal(again[k], moved[k]) for k in before if k in dict(model.named_parameters())
    )


def _whole(state: dict[str, torch.Tensor], like: Any) -> Any:
    """A forward of an unsharded model holding ``state`` (the loaded weights)."""
    import copy

    twin = copy.deepcopy(like)
    twin.load_state_dict(state)
    return lambda ids: twin(input_ids=ids).logits
