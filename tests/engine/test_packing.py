"""Packing: layout by hand, and packed logprobs equal to unpacked ones on the real model."""

from __future__ import annotations

import random

import pytest
import torch
from conftest_model import tiny

from art_hydra.engine.backends.layout import unpacked_layout
from art_hydra.engine.packing import PACKED, Layout, MaskForm, Sequence, completion_values, pack
from art_hydra.engine.rl.sampling import SamplingSettings, token_logprobs
from art_hydra.engine.trainer import packed_logprobs


def test_layout_by_hand() -> None:
    a = Sequence(tokens=[1, 5, 6, 7], prompt_len=2, advantage=0.5, old_logprobs=[-0.1, -0.2])
    b = Sequence(tokens=[1, 8, 9], prompt_len=2, advantage=-1.0, old_logprobs=[-0.3])
    c = Sequence(tokens=[1, 4, 4, 4, 4], prompt_len=1, advantage=2.0, old_logprobs=[-1.0] * 4)
    batch = pack([a, b, c], capacity=8, pad_id=0, layout=PACKED)
    # Width 8 would need 2 rows x 8 slots; width 7 fits c alone and a + b: 14 slots.
    assert batch.input_ids.tolist() == [[1, 4, 4, 4, 4, 0, 0], [1, 5, 6, 7, 1, 8, 9]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 0], [0, 1, 2, 3, 0, 1, 2]]
    assert batch.seq_ids.tolist() == [[2, 2, 2, 2, 2, -1, -1], [0, 0, 0, 0, 1, 1, 1]]
    # Position i predicts token i+1 of its own sequence; only completion targets count.
    assert batch.targets[1, :3].tolist() == [5, 6, 7]
    assert batch.loss_mask.tolist() == [[1, 1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 1, 0]]
    assert batch.old_logprobs[1].tolist() == pytest.approx([0, -0.1, -0.2, 0, 0, -0.3, 0])
    assert batch.advantages[1, 5].item() == -1.0 and batch.advantages[0, 0].item() == 2.0
    assert batch.real_tokens == 12 and batch.real_token_share == 12 / 14
    mask = batch.attention_mask()[1, 0]
    assert mask[5, 4] and not mask[5, 3]  # b's tokens see b, never a
    assert not mask[2, 3]  # causal
    # Eager attention adds its mask to the scores: 0 where allowed, the dtype's minimum
    # elsewhere, in the model's dtype (booleans would add +1/+0 and mask nothing).
    additive = pack([a, b, c], 8, 0, Layout(MaskForm.block_additive)).attention_mask(torch.bfloat16)
    assert additive.dtype == torch.bfloat16
    assert additive[1, 0, 5, 4] == 0 and additive[1, 0, 5, 3] == torch.finfo(torch.bfloat16).min
    assert torch.equal(additive == 0, batch.attention_mask())
    with pytest.raises(ValueError, match="does not fit"):
        pack([Sequence(tokens=[1] * 9, prompt_len=1)], capacity=8, pad_id=0, layout=PACKED)


def test_one_sequence_per_row_is_right_padded_with_a_padding_mask() -> None:
    a = Sequence(tokens=[1, 5, 6, 7], prompt_len=2)
    b = Sequence(tokens=[1, 8], prompt_len=1)
    batch = pack([a, b], capacity=8, pad_id=0, layout=Layout(MaskForm.padding))
    assert batch.input_ids.tolist() == [[1, 5, 6, 7], [1, 8, 0, 0]]
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3]
    assert batch.attention_mask().tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.real_token_share == 6 / 8


def test_packing_leaves_little_padding() -> None:
    rng = random.Random(0)
    seqs = [Sequence(tokens=[1] * rng.randint(8, 14), prompt_len=5) for _ in range(128)]
    assert pack(seqs, capacity=64, pad_id=0, layout=PACKED).real_token_share >= 0.9


def test_the_tiny_model_packs_and_a_mask_dropping_backend_does_not() -> None:
    _, loaded, _ = tiny()
    assert loaded.layout == Layout(MaskForm.block_bool, True, loaded.layout.reason)
    # What the Unsloth backend asks for: its kernels drop the mask in training.
    unsloth_like = unpacked_layout(loaded.model.config, "kernels drop the mask")
    assert unsloth_like.mask == MaskForm.padding and not unsloth_like.packs
    assert unsloth_like.left_padding  # sampling still left-pads a Llama


def test_packed_logprobs_equal_unpacked() -> None:
    _, loaded, _ = tiny()
    model = loaded.model.eval()
    gen = torch.Generator().manual_seed(0)
    vocab = len(loaded.tokenizer)
    seqs = []
    for n in (5, 9, 13, 7, 11, 6):
        tokens = torch.randint(4, vocab, (n,), generator=gen).tolist()
        seqs.append(Sequence(tokens=[1, *tokens], prompt_len=3))
    settings = SamplingSettings(temperature=0.8, top_k=10)
    batch = pack(seqs, capacity=24, pad_id=0, layout=loaded.layout)
    assert batch.input_ids.shape[0] < len(seqs)  # really packed several per row
    with torch.no_grad():
        packed, _ = packed_logprobs(model, batch, settings)
        for index, seq in enumerate(seqs):
            ids = torch.tensor([seq.tokens])
            logits = model(input_ids=ids).logits
            alone, _ = token_logprobs(logits[:, :-1], ids[:, 1:], settings)
            where = (batch.seq_ids == index) & (batch.loss_mask > 0)
            completion = alone[0, seq.prompt_len - 1 :]
            assert torch.allclose(packed[where], completion, atol=1e-5), index


def test_sampling_logprobs_must_cover_the_completion_exactly() -> None:
    """One logprob per completion token: a mismatch is an error, never a shifted row."""
    seq = Sequence(tokens=[1, 5, 6, 7], prompt_len=2, advantage=0.5, old_logprobs=[-0.1])
    with pytest.raises(ValueError, match="2 completion tokens but 1 old logprobs"):
        pack([seq], 8, 0, PACKED)
    seq.old_logprobs = [-0.1, -0.2]
    seq.sampler_logprobs = [-0.3]
    with pytest.raises(ValueError, match="2 completion tokens but 1 sampling logprobs"):
        pack([seq], 8, 0, PACKED)
    seq.sampler_logprobs = [-0.3, -0.4]
    batch = pack([seq], 8, 0, PACKED)
    assert batch.old_logprobs[0, :3].tolist() == pytest.approx([0.0, -0.1, -0.2])
    assert batch.sampler_logprobs is not None
    assert batch.sampler_logprobs[0, :3].tolist() == pytest.approx([0.0, -0.3, -0.4])
    assert batch.advantages[0].tolist() == pytest.approx([0.0, 0.5, 0.5, 0.0])
    assert batch.loss_mask[0].tolist() == [0.0, 1.0, 1.0, 0.0]


def test_a_sequence_without_prompt_tokens_stays_in_its_own_slots() -> None:
    """No prompt token (a tokenizer without BOS, an empty prompt): the first token has no
    position to predict it, and nothing spills into the previous sequence's slots."""
    first = Sequence(tokens=[1, 5, 6], prompt_len=1, advantage=1.0, old_logprobs=[-0.5, -0.6])
    bare = Sequence(tokens=[7, 8, 9], prompt_len=0, advantage=2.0, old_logprobs=[-1, -2, -3])
    batch = pack([first, bare], 6, 0, PACKED)

    def slots(index: int, field: torch.Tensor) -> list[float]:
        return field[batch.seq_ids == index].tolist()

    assert slots(0, batch.input_ids) == [1, 5, 6] and slots(1, batch.input_ids) == [7, 8, 9]
    assert slots(0, batch.loss_mask) == [1.0, 1.0, 0.0]
    assert slots(1, batch.loss_mask) == [1.0, 1.0, 0.0]
    assert slots(0, batch.advantages) == [1.0, 1.0, 0.0]
    assert slots(1, batch.advantages) == [2.0, 2.0, 0.0]
    assert slots(0, batch.old_logprobs) == pytest.approx([-0.5, -0.6, 0.0])
    assert slots(1, batch.old_logprobs) == pytest.approx([-2.0, -3.0, 0.0])
    assert batch.loss_mask.sum() == 4  # nothing outside the two sequences


def test_sequences_with_one_prompt_share_a_copy_of_it() -> None:
    """Layout by hand: a group's prompt once (but its last token), each member's tokens
    after it at the positions it would have alone, seeing the copy and itself only."""
    a = Sequence(tokens=[1, 5, 6, 7, 8], prompt_len=3, advantage=0.5, old_logprobs=[-0.1, -0.2])
    b = Sequence(tokens=[1, 5, 6, 9], prompt_len=3, advantage=-1.0, old_logprobs=[-0.3])
    c = Sequence(tokens=[1, 4, 4], prompt_len=1, advantage=2.0, old_logprobs=[-1.0, -1.0])
    batch = pack([a, b, c], capacity=12, pad_id=0, layout=PACKED, share_prompts=True)
    #                         prompt | a's rest  | b's rest | c (no prompt to share)
    assert batch.input_ids.tolist() == [[1, 5, 6, 7, 8, 6, 9, 1, 4, 4]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1, 2]]
    assert batch.seq_ids.tolist() == [[3, 3, 0, 0, 0, 1, 1, 2, 2, 2]]
    assert batch.sees_ids is not None
    assert batch.sees_ids.tolist() == [[-2, -2, 3, 3, 3, 3, 3, -2, -2, -2]]
    assert batch.targets.tolist() == [[5, 6, 7, 8, 0, 9, 0, 4, 4, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 1, 0, 1, 1, 0]]
    old = [0, 0, -0.1, -0.2, 0, -0.3, 0, -1, -1, 0]
    assert batch.old_logprobs[0].tolist() == pytest.approx(old)
    assert batch.advantages[0].tolist() == pytest.approx([0, 0, 0.5, 0.5, 0, -1, 0, 2, 2, 0])
    assert batch.real_tokens == 10 and batch.loss_tokens == 5  # 12 tokens laid out in 10
    mask = batch.attention_mask()[0, 0]
    assert mask[5, :2].all() and mask[5, 5] and not mask[5, 2:5].any()  # b: prompt + itself
    assert mask[3, :4].all() and not mask[3, 4:].any()  # a: prompt + itself, causal
    assert mask[7, 7] and not mask[7, :7].any()  # c sees only itself
    assert mask[1, :2].all() and not mask[1, 2:].any()  # the prompt sees only itself
    additive = pack([a, b, c], 12, 0, Layout(MaskForm.block_additive), share_prompts=True)
    assert torch.equal(additive.attention_mask() == 0, batch.attention_mask())


def test_prompts_are_shared_only_where_rows_pack_and_prompts_are_not_trained() -> None:
    group = [Sequence(tokens=[1, 5, 6, 7 + i], prompt_len=3) for i in range(3)]
    plain = pack(group, 12, 0, PACKED)
    assert plain.sees_ids is None and plain.real_tokens == 12
    padded = pack(group, 12, 0, Layout(MaskForm.padding), share_prompts=True)
    assert padded.sees_ids is None and padded.input_ids.shape == (3, 4)
    sft = [Sequence(tokens=s.tokens, prompt_len=3, train_prompt=True) for s in group]
    trained = pack(sft, 12, 0, PACKED, share_prompts=True)
    assert trained.sees_ids is None and trained.real_tokens == 12


def test_a_group_too_long_for_one_row_goes_on_behind_a_copy_of_its_prompt() -> None:
    group = [Sequence(tokens=[1, 5, 6, 7, 8, 9], prompt_len=3) for _ in range(5)]
    batch = pack(group, capacity=12, pad_id=0, layout=PACKED, share_prompts=True)
    # prompt (2) + 4 tokens per member: 2 members per row of 12, with a prompt copy each.
    assert batch.input_ids.shape == (3, 10)
    assert batch.input_ids[:, :2].tolist() == [[1, 5]] * 3
    assert sorted(batch.seq_ids[batch.loss_mask > 0].tolist()) == sorted([0, 1, 2, 3, 4] * 3)


def test_shared_prompts_give_the_same_logprobs_and_gradient() -> None:
    """The tiny model, groups of 4 completions per prompt, some groups split over rows."""
    _, loaded, _ = tiny()
    model = loaded.model.train()
    gen = torch.Generator().manual_seed(1)
    vocab = len(loaded.tokenizer)
    seqs = []
    for group in range(5):
        prompt = [1, *torch.randint(4, vocab, (2 + group,), generator=gen).tolist()]
        for _ in range(4):
            tail = torch.randint(4, vocab, (int(torch.randint(1, 7, (1,), generator=gen)),))
            seqs.append(
                Sequence(
                    tokens=prompt + tail.tolist(),
                    prompt_len=len(prompt),
                    advantage=float(torch.randn(1, generator=gen)),
                )
            )
    settings = SamplingSettings(temperature=0.9)
    grads, logprobs = [], []
    for share in (False, True):
        batch = pack(seqs, capacity=24, pad_id=0, layout=loaded.layout, share_prompts=share)
        model.zero_grad()
        values, _ = packed_logprobs(model, batch, settings)
        (values * batch.loss_mask * batch.advantages).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        logprobs.append([values[(batch.seq_ids == i) & (batch.loss_mask > 0)] for i in range(20)])
        if share:
            assert batch.real_tokens < sum(len(s.tokens) for s in seqs)
            assert batch.input_ids.shape[0] > 1  # some groups went on in another row
    for plain, shared in zip(*logprobs, strict=True):
        assert torch.allclose(plain, shared, atol=1e-5)
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6 * grads[0].abs().max())


@pytest.mark.parametrize("share", [False, True], ids=["alone", "shared-prompts"])
@pytest.mark.parametrize("layout", [PACKED, Layout(MaskForm.padding)], ids=["packed", "padded"])
def test_completion_values_read_back_what_pack_placed(share: bool, layout: Layout) -> None:
    """A forward at sampling time gives each sequence its old logprobs through
    completion_values: the inverse of how pack places them, whatever the layout, with
    prompts shared or not, and for a sequence without prompt tokens."""
    rng = random.Random(0)
    prompts = [[1, 2, 3], [1, 4], [5, 6, 7, 8]]
    seqs = []
    for i in range(9):
        prompt = prompts[i % 3]
        completion = [rng.randrange(10, 20) for _ in range(rng.randrange(1, 6))]
        values = [-rng.random() for _ in completion]
        seqs.append(Sequence(prompt + completion, len(prompt), old_logprobs=values))
    bare = [rng.randrange(10, 20) for _ in range(4)]
    seqs.append(Sequence(bare, 0, old_logprobs=[0.0, -0.5, -0.6, -0.7]))
    batch = pack(seqs, 16, 0, layout, share_prompts=share)
    assert (batch.sees_ids is not None) == (share and layout.packs)
    found = completion_values(batch, batch.old_logprobs, seqs)
    for seq, values in zip(seqs, found, strict=True):
        assert values == pytest.approx(seq.old_logprobs, abs=1e-7)
