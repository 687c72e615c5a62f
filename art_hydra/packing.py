"""Packing: several sequences per row, each attending only to itself.

Rows are filled first-fit-decreasing, at the width (up to a capacity) that wastes the
fewest slots, and padded only to the longest row, so little compute goes to padding.
Each sequence keeps its own positions (0, 1, ...) and a block-diagonal causal mask
confines attention to it, so a packed forward gives each sequence the same logits as
running it alone.

That holds only where the model honours the mask as given: a :class:`Layout` (chosen per
model by :func:`art_hydra.backends.layout.row_layout`) says whether rows are packed and
in which form the mask is passed, and falls back to one right-padded sequence per row
with a plain padding mask wherever packing is not proven right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch


class MaskForm(Enum):
    """How the attention mask of a packed batch reaches the model."""

    #: Block-diagonal causal mask as booleans (True = may attend): what sdpa reads.
    block_bool = "block_bool"
    #: Block-diagonal causal mask as an additive float (0 / dtype minimum): eager attention
    #: adds the mask to the scores, so booleans there would add +1/+0 and mask nothing.
    block_additive = "block_additive"
    #: One sequence per row, right-padded, with a 2D padding mask: the model builds its
    #: own causal, sliding-window and recurrent masks, as it does for plain batches.
    padding = "padding"


@dataclass(frozen=True)
class Layout:
    """How a model's training rows are laid out, and how its prompts are batched."""

    #: The mask form; anything but ``padding`` packs several sequences per row.
    mask: MaskForm
    #: Whether the sampler may left-pad prompts of different lengths into one batch
    #: (False: prompts are batched by length, so no row holds padding).
    left_padding: bool = True
    #: Why this layout, in words (logged, and shown in errors).
    reason: str = ""

    @property
    def packs(self) -> bool:
        return self.mask != MaskForm.padding


#: Packed rows with a boolean mask: the tiny model's layout (a Llama on sdpa).
PACKED = Layout(MaskForm.block_bool, reason="block-diagonal boolean mask (sdpa)")


@dataclass
class Sequence:
    """One training sequence: prompt followed by completion."""

    #: Token ids, prompt first.
    tokens: list[int]
    #: How many leading tokens are prompt (not trained on, unless ``train_prompt``).
    prompt_len: int
    #: The sequence's advantage (RL); the same for each of its completion tokens.
    advantage: float = 0.0
    #: Logprob of each completion token when it was sampled (RL).
    old_logprobs: list[float] | None = None
    #: Train on prompt tokens too (SFT without completion_only_loss).
    train_prompt: bool = False


@dataclass
class PackedBatch:
    """One micro-batch of packed rows, ready for the trainer."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    #: Which sequence each position belongs to (-1 for padding).
    seq_ids: torch.Tensor
    #: Next token at each position (0 where there is none).
    targets: torch.Tensor
    #: 1.0 where the target is trained on.
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    #: Real (non-padding) tokens.
    real_tokens: int
    #: How the rows were laid out, hence which mask the forward needs.
    layout: Layout
    #: Trained-on tokens of the whole optimizer step this micro-batch belongs to.
    step_loss_tokens: float = 0.0
    #: A warmup pass: forward/backward only, no weight or optimizer change.
    warmup: bool = False
    #: Producer-side numbers reported with the step's result.
    info: dict[str, float] = field(default_factory=dict)
    #: A few (prompt, completion, reward) records kept for inspection.
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def loss_tokens(self) -> float:
        return float(self.loss_mask.sum())

    @property
    def real_token_share(self) -> float:
        return self.real_tokens / self.input_ids.numel()

    def attention_mask(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The mask in the layout's form; ``dtype`` is the model's compute dtype (the
        additive form must be in it, as transformers' own eager masks are).

        Packed: block-diagonal causal, [rows, 1, L, L], booleans (True = may attend) or
        additive floats (0 = may attend, the dtype's minimum = may not). One per row:
        [rows, L] padding mask (1 = real token).
        """
        seq = self.seq_ids
        if self.layout.mask == MaskForm.padding:
            return (seq >= 0).long()
        length = seq.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=seq.device).tril()
        same = seq.unsqueeze(-1) == seq.unsqueeze(-2)
        real = (seq >= 0).unsqueeze(-1)
        eye = torch.eye(length, dtype=torch.bool, device=seq.device)
        # Padding attends to itself only, so its softmax row is never empty (no NaN).
        allowed = ((causal & same & real) | eye).unsqueeze(1)
        if self.layout.mask == MaskForm.block_bool:
            return allowed
        blocked = torch.zeros(allowed.shape, dtype=dtype, device=seq.device)
        return blocked.masked_fill(~allowed, torch.finfo(dtype).min)

    def to(self, device: torch.device) -> PackedBatch:
        for name in (
            "input_ids",
            "position_ids",
            "seq_ids",
            "targets",
            "loss_mask",
            "advantages",
            "old_logprobs",
        ):
            setattr(self, name, getattr(self, name).to(device))
        return self


def _first_fit_decreasing(sizes: list[int], width: int) -> tuple[list[list[int]], list[int]]:
    rows: list[list[int]] = []
    fill: list[int] = []
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        for r, used in enumerate(fill):
            if used + sizes[index] <= width:
                rows[r].append(index)
                fill[r] += sizes[index]
                break
        else:
            rows.append([index])
            fill.append(sizes[index])
    return rows, fill


def _best_rows(sizes: list[int], capacity: int) -> tuple[list[list[int]], list[int]]:
    """First-fit decreasing at the row width that wastes the fewest slots.

    Filling rows to ``capacity`` can leave the last row nearly empty; a slightly
    narrower width that spreads the same tokens evenly pads less.
    """
    total, longest = sum(sizes), max(sizes)
    fewest = -(-total // capacity)
    widths = {capacity}
    for rows in range(fewest, fewest + 3):
        for slack in (0, 1, 2, 4):
            widths.add(min(capacity, max(longest, -(-total // rows) + slack)))
    best: tuple[int, list[list[int]], list[int]] | None = None
    for width in sorted(widths):
        rows_, fill = _first_fit_decreasing(sizes, width)
        slots = len(rows_) * max(fill)
        if best is None or slots < best[0]:
            best = (slots, rows_, fill)
    assert best is not None
    return best[1], best[2]


def pack(sequences: list[Sequence], capacity: int, pad_id: int, layout: Layout) -> PackedBatch:
    """Lay ``sequences`` out in rows of at most ``capacity`` tokens, as ``layout`` says.

    A layout that does not pack gives each sequence its own row, right-padded: correct
    for any causal model, even kernels that drop the attention mask in training
    (Unsloth), since neither causal attention nor a causal recurrence looks at the
    padding after a sequence.
    """
    if not sequences:
        raise ValueError("nothing to pack")
    too_long = [len(s.tokens) for s in sequences if len(s.tokens) > capacity]
    if too_long:
        raise ValueError(
            f"a sequence of {max(too_long)} tokens does not fit a row of {capacity} "
            "(model.max_seq_length)"
        )
    sizes = [len(s.tokens) for s in sequences]
    if layout.packs:
        rows, fill = _best_rows(sizes, capacity)
    else:
        rows, fill = [[i] for i in range(len(sizes))], list(sizes)
    width = max(fill)
    shape = (len(rows), width)
    # Filled as flat Python lists and turned into tensors once per field: writing each
    # sequence's slices into tensors cost ~500 small tensor ops per step (half the
    # packing time of the default run).
    size = len(rows) * width
    ids, positions, owners = [pad_id] * size, [0] * size, [-1] * size
    targets, mask = [0] * size, [0.0] * size
    advantages, old = [0.0] * size, [0.0] * size
    for r, members in enumerate(rows):
        offset = r * width
        for index in members:
            seq = sequences[index]
            tokens = seq.tokens
            n, p = len(tokens), seq.prompt_len
            end = offset + n
            ids[offset:end] = tokens
            positions[offset:end] = range(n)
            owners[offset:end] = [index] * n
            # Position i predicts token i + 1 of the same sequence.
            targets[offset : end - 1] = tokens[1:]
            # Position 0 predicts nothing of its own sequence's past: with no prompt
            # token the first completion token cannot be trained on.
            first = offset + (0 if seq.train_prompt else max(p - 1, 0))
            mask[first : end - 1] = [1.0] * (end - 1 - first)
            advantages[first : end - 1] = [float(seq.advantage)] * (end - 1 - first)
            if seq.old_logprobs is not None:
                if len(seq.old_logprobs) != n - p:  # a list slice would silently resize
                    raise ValueError(
                        f"sequence {index} has {n - p} completion tokens but "
                        f"{len(seq.old_logprobs)} sampling logprobs"
                    )
                skip = 1 if p == 0 else 0  # (the untrainable first token, as above)
                old[offset + p - 1 + skip : end - 1] = seq.old_logprobs[skip:]
            offset = end
    input_ids = torch.tensor(ids, dtype=torch.long).view(shape)
    position_ids = torch.tensor(positions, dtype=torch.long).view(shape)
    seq_ids = torch.tensor(owners, dtype=torch.long).view(shape)
    targets_t = torch.tensor(targets, dtype=torch.long).view(shape)
    loss_mask = torch.tensor(mask).view(shape)
    advantages_t = torch.tensor(advantages).view(shape)
    old_logprobs = torch.tensor(old).view(shape)
    return PackedBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        seq_ids=seq_ids,
        targets=targets_t,
        loss_mask=loss_mask,
        advantages=advantages_t,
        old_logprobs=old_logprobs,
        real_tokens=sum(fill),
        layout=layout,
    )
