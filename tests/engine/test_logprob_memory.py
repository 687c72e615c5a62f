"""The chunked head (art_hydra.engine.rl.logprobs) gives the full-logits path's logprobs,
entropies and gradients, computes logits for trained positions only, and falls back to
the model's own forward for a head it does not know.

The reference is the path before issue 19: the model's forward over every position,
then ``token_logprobs`` on all of its logits. Chunks are made small here (a few rows),
so every batch spans several chunks and the backward recomputes each.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest_model import tiny
from family_models import (
    CAPACITY,
    FAMILIES,
    family_folder,
    family_params,
    load_family,
    save_family,
)

from art_hydra.engine.packing import PackedBatch, Sequence, pack
from art_hydra.engine.rl import logprobs as lp
from art_hydra.engine.rl.sampling import SamplingSettings, suppressed_ids, token_logprobs
from art_hydra.engine.trainer import packed_logprobs

TOL = 1e-6


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few rows of the tiny vocabularies: several chunks per batch.

    A matrix product over fewer rows may take another kernel and round differently
    (about 2.5e-7 relative to the logits): exact to 1e-6 on the tiny model's small
    logits, relative on the families' large ones (weights of std 0.3).
    """
    monkeypatch.setattr(lp, "CHUNK_ELEMENTS", 120)


def full_logprobs(
    model: Any, batch: PackedBatch, settings: SamplingSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """The full-logits path (before issue 19)."""
    dtype = model.get_input_embeddings().weight.dtype
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask(dtype),
        position_ids=batch.position_ids,
    ).logits
    return token_logprobs(logits, batch.targets, settings)


def _batch(loaded: Any, seed: int = 0) -> PackedBatch:
    """Packed rows: sequences of different prompt lengths, and groups sharing a prompt."""
    tok = loaded.tokenizer
    vocab = min(len(tok), loaded.model.get_input_embeddings().num_embeddings)
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for n, prompt in [(9, 3), (12, 5), (7, 2), (10, 4)]:
        tokens = torch.randint(5, vocab, (n,), generator=gen).tolist()
        seqs.append(Sequence(tokens=tokens, prompt_len=prompt))
    shared = seqs[0].tokens[:3]
    for n in (3, 2, 4):
        extra = torch.randint(5, vocab, (n,), generator=gen).tolist()
        seqs.append(Sequence(tokens=shared + extra, prompt_len=3))
    return pack(seqs, CAPACITY, tok.pad_token_id, loaded.layout, share_prompts=True)


def _run(
    fn: Any, model: Any, batch: PackedBatch, settings: SamplingSettings
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Logprobs and entropies at trained positions, and the gradients of a weighted sum
    of the logprobs (distinct weights, so a misplaced row would show)."""
    model.train()
    model.zero_grad(set_to_none=True)
    values, entropy = fn(model, batch, settings)
    trained = batch.loss_mask > 0
    weights = torch.linspace(0.5, 2.0, int(trained.sum()))
    (values[trained] * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return values.detach(), entropy, grads


def assert_same_as_full(
    model: Any, batch: PackedBatch, settings: SamplingSettings, rtol: float = 0.0
) -> None:
    """Logprobs and entropies within 1e-6 (plus ``rtol`` of their size), each gradient
    within 1e-6 of the largest entry of its tensor (plus ``rtol`` of it)."""
    full, full_entropy, full_grads = _run(full_logprobs, model, batch, settings)
    got, entropy, grads = _run(packed_logprobs, model, batch, settings)
    trained = batch.loss_mask > 0
    assert torch.allclose(got[trained], full[trained], atol=TOL, rtol=rtol)
    assert torch.allclose(entropy[trained], full_entropy[trained], atol=TOL, rtol=rtol)
    assert (got[~trained] == 0).all() and (entropy[~trained] == 0).all()
    assert grads.keys() == full_grads.keys() and grads
    for name, grad in grads.items():
        size = float(full_grads[name].abs().max().clamp(min=1.0))
        assert float((grad - full_grads[name]).abs().max()) <= (TOL + rtol) * size, name


@pytest.fixture(scope="module", params=family_params(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = family_folder(request.param, tmp_path_factory)
    _, loaded = load_family(folder, "eager" if request.param == "llama-eager" else None)
    return loaded


@pytest.mark.slow
def test_every_family_gives_the_full_paths_numbers(
    family: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One chunk (the default size at these vocabularies): the full path's numbers to
    1e-6; several chunks: the same up to the matrix product's rounding (about 2.5e-7 of
    a logit), which a gated recurrence's backward amplifies: Kimi-Linear's forget-gate
    gradient moved 3e-5 relative. A chunk put in the wrong place moves them by O(1)."""
    settings = SamplingSettings(temperature=0.7, suppress_ids=suppressed_ids(family.tokenizer))
    assert_same_as_full(family.model, _batch(family), settings)
    assert lp.head_matches(family.model, _batch(family).input_ids)  # not the fallback
    monkeypatch.setattr(lp, "CHUNK_ELEMENTS", 120)
    assert_same_as_full(family.model, _batch(family, seed=1), settings, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(),
        SamplingSettings(temperature=1.3, top_k=5),
        SamplingSettings(temperature=0.5, top_p=0.8, suppress_ids=(0, 1, 2)),
    ],
    ids=["plain", "top-k", "top-p-suppressed"],
)
@pytest.mark.usefixtures("small_chunks")
def test_sampling_settings(settings: SamplingSettings) -> None:
    """Temperature and suppressed ids shape the logprobs; top-k/top-p (drawing only)
    do not: the same as the full path under every setting."""
    _, loaded, _ = tiny()
    assert_same_as_full(loaded.model, _batch(loaded, seed=3), settings)


@pytest.mark.slow
@pytest.mark.parametrize("saved", ["[lm_head]", "[]"], ids=["trained-head", "frozen-head"])
@pytest.mark.usefixtures("small_chunks")
def test_lora(saved: str) -> None:
    """LoRA with the head trained (modules_to_save) or frozen: the same adapter
    gradients; a frozen head still passes gradient to the hidden states."""
    _, loaded, _ = tiny(["model.finetune=lora", f"model.lora.modules_to_save={saved}"])
    settings = SamplingSettings(suppress_ids=suppressed_ids(loaded.tokenizer))
    assert_same_as_full(loaded.model, _batch(loaded, seed=4), settings)
    _, _, grads = _run(packed_logprobs, loaded.model, _batch(loaded, seed=4), settings)
    # lora_B starts at zero, so lora_A's first gradient is zero; lora_B's is not.
    adapters = [g for n, g in grads.items() if "lora_B" in n]
    assert adapters and all(g.abs().sum() > 0 for g in adapters)
    assert any("modules_to_save" in n for n in grads) == (saved != "[]")


@pytest.mark.usefixtures("small_chunks")
def test_logits_only_for_trained_positions() -> None:
    """The head runs on the trained rows only (prompts, padding and last tokens get no
    logits), and the reference path (no gradient) the same."""
    _, loaded, _ = tiny()
    batch = _batch(loaded, seed=5)
    trained = int((batch.loss_mask > 0).sum())
    assert trained < batch.input_ids.numel() - 10  # prompts and last tokens are not
    for grad in (True, False):
        before = lp.HEAD_ROWS[0]
        with torch.set_grad_enabled(grad):
            packed_logprobs(loaded.model, batch, SamplingSettings())
        assert lp.HEAD_ROWS[0] - before == trained


@pytest.mark.usefixtures("small_chunks")
def test_no_trained_position_keeps_the_graph() -> None:
    """A batch with nothing to train gives zeros that still backpropagate (zero
    gradients on every parameter, as the full path gives)."""
    _, loaded, _ = tiny()
    batch = _batch(loaded, seed=6)
    batch.loss_mask = torch.zeros_like(batch.loss_mask)
    values, entropy = packed_logprobs(loaded.model, batch, SamplingSettings())
    assert (values == 0).all() and (entropy == 0).all()
    values.sum().backward()
    grads = [p.grad for p in loaded.model.parameters() if p.requires_grad]
    assert all(g is not None and (g == 0).all() for g in grads)
    loaded.model.zero_grad(set_to_none=True)


@pytest.mark.slow
def test_unknown_post_processing_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A head whose logit scaling the table does not know (Granite's, removed from the
    table here) fails the one-time check: one warning, then the model's own forward,
    with the full path's numbers."""
    table = {k: v for k, v in lp._POST_PROCESSING.items() if k != "granite"}
    monkeypatch.setattr(lp, "_POST_PROCESSING", table)
    monkeypatch.setattr(lp, "_VERIFIED", {})
    folder = save_family(tmp_path, "granite", {"logits_scaling": 8.0})
    _, loaded = load_family(folder)
    settings = SamplingSettings(suppress_ids=suppressed_ids(loaded.tokenizer))
    batch = _batch(loaded, seed=7)
    before = lp.HEAD_ROWS[0]
    with caplog.at_level(logging.WARNING, logger=lp.__name__):
        assert_same_as_full(loaded.model, batch, settings)
        packed_logprobs(loaded.model, batch, settings)
    assert lp.HEAD_ROWS[0] == before  # never the chunked head
    warnings = [r for r in caplog.records if "does not reproduce" in r.getMessage()]
    assert len(warnings) == 1 and "GraniteForCausalLM" in warnings[0].getMessage()


def test_known_scaling_is_applied(tmp_path: Path) -> None:
    """With the table, the same Granite (logits divided by 8) passes the check."""
    folder = save_family(tmp_path, "granite", {"logits_scaling": 8.0})
    _, loaded = load_family(folder)
    batch = _batch(loaded, seed=8)
    assert lp.head_matches(loaded.model, batch.input_ids)
    with torch.no_grad():
        full, _ = full_logprobs(loaded.model, batch, SamplingSettings())
        got, _ = packed_logprobs(loaded.model, batch, SamplingSettings())
    trained = batch.loss_mask > 0
    assert torch.allclose(got[trained], full[trained], atol=TOL, rtol=0)


def test_chunk_rows() -> None:
    assert lp.chunk_tokens(151_936, 1 << 24) == 110
    assert lp.chunk_tokens(10**9, 1 << 24) == 1
