"""Every model family trains and samples the same logprobs as running each sequence alone.

Tiny random-weight models of real families are saved to folders and loaded the way a
user's model is (``model.source=pretrained``). For each, the layout the backend picks
must make three numbers agree: the training forward over several sequences of
different lengths (packed where the layout packs), each sequence run alone without
padding, and the logprob the sampler records for each token it draws (prompts of
different lengths, so left padding or grouping by length is exercised).

Each run trains a sample of the families that holds every behaviour class
(tests/family_matrix.py); ``make test-full`` (``ART_HYDRA_FULL_MATRIX=1``) trains them all.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from family_models import CAPACITY, FAMILIES, family_folder, family_params, load_family

from art_hydra.engine.backends.layout import PROVEN_FAMILIES, row_layout
from art_hydra.engine.backends.tiny import SPECIALS
from art_hydra.engine.backends.torch_backend import LoadedModel
from art_hydra.engine.packing import Layout, MaskForm, Sequence, pack
from art_hydra.engine.rl.sampling import SamplingSettings, sample, suppressed_ids, token_logprobs
from art_hydra.engine.trainer import packed_logprobs

ATOL = 1e-4


def _random_sequences(loaded: LoadedModel, lengths: list[int], seed: int) -> list[Sequence]:
    gen = torch.Generator().manual_seed(seed)
    tok = loaded.tokenizer
    out = []
    for n in lengths:
        body = torch.randint(len(SPECIALS), len(tok), (n - 1,), generator=gen).tolist()
        out.append(Sequence(tokens=[tok.bos_token_id, *body], prompt_len=1, train_prompt=True))
    return out


def _alone(model: Any, tokens: list[int], settings: SamplingSettings) -> torch.Tensor:
    """Logprob of each next token with the sequence run by itself: no padding, no mask."""
    ids = torch.tensor([tokens])
    logits = model(input_ids=ids).logits
    return token_logprobs(logits[:, :-1], ids[:, 1:], settings)[0][0]


Family = tuple[str, LoadedModel, MaskForm, bool]


@pytest.fixture(scope="module", params=family_params(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    _, _, form, left_pads = FAMILIES[request.param]
    folder = family_folder(request.param, tmp_path_factory)
    attn = "eager" if request.param == "llama-eager" else None
    _, loaded = load_family(folder, attn)
    loaded.model.eval()
    return request.param, loaded, form, left_pads


def test_the_layout_follows_the_family(family: Family) -> None:
    name, loaded, form, left_pads = family
    layout: Layout = loaded.layout
    assert layout.mask == form, (name, layout.reason)
    assert layout.left_padding == left_pads, (name, layout.reason)
    assert layout == row_layout(loaded.model.config, CAPACITY)
    # A representative RL batch (32 sequences of 8-14 tokens): packing pays where it runs.
    lengths = [8 + (i * 5) % 7 for i in range(32)]
    share = pack(_random_sequences(loaded, lengths, 1), CAPACITY, 0, layout).real_token_share
    assert share >= (0.95 if layout.packs else 0.75), share


def _sampled_as_alone(
    family: Family, prompts: list[list[int]], settings: SamplingSettings, seed: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample up to 6 tokens per prompt; assert each recorded logprob is the one the
    sequence has when run alone, and return completions and logprobs."""
    name, loaded, _, _ = family
    model, tok = loaded.model, loaded.tokenizer
    completions, recorded = sample(
        model,
        prompts,
        6,
        settings,
        (tok.eos_token_id,),
        tok.pad_token_id,
        torch.Generator().manual_seed(seed),
        left_padding=loaded.layout.left_padding,
    )
    for prompt, completion, values in zip(prompts, completions, recorded, strict=True):
        assert completion and len(values) == len(completion)
        alone = _alone(model, prompt + completion, settings)[len(prompt) - 1 :]
        assert torch.allclose(torch.tensor(values), alone, atol=ATOL), name
    return completions, recorded


def test_packed_unpacked_and_sampled_logprobs_agree(family: Family) -> None:
    name, loaded, _, _ = family
    model, tok = loaded.model, loaded.tokenizer
    settings = SamplingSettings(temperature=1.0, suppress_ids=suppressed_ids(tok))
    with torch.no_grad():
        seqs = _random_sequences(loaded, [5, 9, 13, 7, 11, 6], seed=0)
        batch = pack(seqs, CAPACITY, tok.pad_token_id, loaded.layout)
        if loaded.layout.packs:
            assert batch.input_ids.shape[0] < len(seqs)  # really several sequences per row
        trained, _ = packed_logprobs(model, batch, settings)
        for index, seq in enumerate(seqs):
            where = (batch.seq_ids == index) & (batch.loss_mask > 0)
            alone = _alone(model, seq.tokens, settings)
            assert torch.allclose(trained[where], alone, atol=ATOL), (name, index)

        prompts = [s.tokens[:n] for s, n in zip(seqs, [3, 5, 8, 3, 6, 2], strict=True)]
        _sampled_as_alone(family, prompts, settings, seed=0)


def test_shared_prompts_agree_in_sampling_and_training(family: Family) -> None:
    """A group's prompt read once: sampling with each prompt repeated (its cache rows
    copied per completion) and training with one copy of it per row (where rows pack)
    give every sequence the logprobs it has alone; training still works afterwards (no
    tensor of sampling's inference mode reaches autograd)."""
    name, loaded, _, _ = family
    model, tok = loaded.model, loaded.tokenizer
    settings = SamplingSettings(temperature=1.0, suppress_ids=suppressed_ids(tok))
    seqs = _random_sequences(loaded, [4, 7, 3], seed=2)
    prompts = [s.tokens for s in seqs for _ in range(3)]
    with torch.no_grad():
        completions, recorded = _sampled_as_alone(family, prompts, settings, seed=1)
    group = [
        Sequence(tokens=prompt + completion, prompt_len=len(prompt))
        for prompt, completion in zip(prompts, completions, strict=True)
    ]
    batch = pack(group, CAPACITY, tok.pad_token_id, loaded.layout, share_prompts=True)
    assert (batch.sees_ids is not None) == loaded.layout.packs, name
    model.train()
    try:
        trained, _ = packed_logprobs(model, batch, settings)
        trained.masked_fill(batch.loss_mask == 0, 0).sum().backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    for index, values in enumerate(recorded):
        where = (batch.seq_ids == index) & (batch.loss_mask > 0)
        assert torch.allclose(trained[where].detach(), torch.tensor(values), atol=ATOL), name


def test_every_packing_family_is_proven_here() -> None:
    assert {model_type for model_type, *_ in FAMILIES.values()} >= PROVEN_FAMILIES


def _config(model_type: str, attn: str = "sdpa", **extra: Any) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **extra)
    config._attn_implementation = attn
    return config


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (_config("llama", "flash_attention_2"), "'flash_attention_2' does not honour"),
        (_config("llama", "flex_attention"), "'flex_attention' does not honour"),
        (_config("gpt2"), "not proven for the 'gpt2' family"),
        (_config("mamba"), "mamba has linear_attention layers"),
        (_config("qwen3_next"), "qwen3_next has linear_attention layers"),
        (_config("gemma3_text", use_bidirectional_attention=True), "bidirectional"),
    ],
    ids=["flash", "flex", "unknown", "mamba", "qwen3_next", "bidirectional"],
)
def test_what_cannot_pack_gets_one_sequence_per_row(config: Any, why: str) -> None:
    layout = row_layout(config, CAPACITY)
    assert layout.mask == MaskForm.padding and why in layout.reason, layout.reason
    # Prompts of unproven or stateful families are batched by length, never left-padded.
    assert layout.left_padding == (config.model_type in PROVEN_FAMILIES)


def test_a_window_binds_unless_it_covers_the_whole_row() -> None:
    gemma2 = _config("gemma2", "eager")  # window 4096 on its sliding layers
    assert row_layout(gemma2, 4096).mask == MaskForm.block_additive
    assert row_layout(gemma2, 4097).mask == MaskForm.padding
    assert row_layout(gemma2, None).mask == MaskForm.padding  # unknown row length
    qwen2 = _config("qwen2", sliding_window=8)  # no sliding layer unless use_sliding_window
    assert row_layout(qwen2, CAPACITY).mask == MaskForm.block_bool
