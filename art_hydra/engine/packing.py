"""Packing: several sequences per row, each attending only to itself.

Rows are filled first-fit-decreasing, at the width (up to a capacity) that wastes the
fewest slots, and padded only to the longest row, so little compute goes to padding.
Each sequence keeps its own positions (0, 1, ...) and a block-diagonal causal mask
confines attention to it, so a packed forward gives each sequence the same logits as
running it alone. Sequences with the same prompt (a group's completions) may share one
copy of it in a row (``share_prompts``; see :func:`pack`): each still sees exactly
the tokens it would alone, at the same positions.

That holds only where the model honours the mask as given: a :class:`Layout` (chosen per
model by :func:`art_hydra.engine.backends.layout.row_layout`) says whether rows are packed and
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
    #: Logprob of each completion token under the policy that sampled it, from a
    #: training-style forward (RL, off-policy steps); None on-policy, where the training
    #: forward's own logprobs serve, detached.
    old_logprobs: list[float] | None = None
    #: The sampler's own logprob of each completion token, as it drew them (RL): for
    #: the sampling mismatch metrics and truncated importance sampling.
    sampler_logprobs: list[float] | None = None
    #: Train on prompt tokens too (SFT without completion_only_loss).
    train_prompt: bool = False
    #: Per completion token, 1 where it trains and 0 where it does not: a multi-turn
    #: completion trains on what the model sampled (or, in SFT, its assistant turns),
    #: never on tool results or template text between turns. None: every completion
    #: token trains. Always as long as the completion (refused otherwise).
    completion_mask: list[int] | None = None

    def __post_init__(self) -> None:
        mask = self.completion_mask
        if mask is not None and len(mask) != len(self.tokens) - self.prompt_len:
            raise ValueError(
                f"a completion of {len(self.tokens) - self.prompt_len} tokens has a mask of "
                f"{len(mask)}: the mask must cover each completion token once"
            )

    @property
    def loss_tokens(self) -> int:
        """How many of its positions :func:`pack` trains on (its share of a batch's
        ``loss_mask``): every token after the first trained one; without a prompt token
        the first completion token has no past to be predicted from. Under a
        ``completion_mask``, its masked completion tokens are not counted."""
        first = 0 if self.train_prompt else max(self.prompt_len - 1, 0)
        count = max(len(self.tokens) - 1 - first, 0)
        if self.completion_mask is not None:
            lead = 1 if self.prompt_len == 0 and not self.train_prompt else 0
            count -= sum(1 for m in self.completion_mask[lead:] if not m)
        return count


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
    #: The sequences' ``old_logprobs`` at the positions predicting them (0 elsewhere).
    old_logprobs: torch.Tensor
    #: Real (non-padding) tokens.
    real_tokens: int
    #: How the rows were laid out, hence which mask the forward needs.
    layout: Layout
    #: What the loss sum is divided by: the trained-on tokens of the whole optimizer
    #: step this micro-batch belongs to (with rl.steps_per_generation > 1, the
    #: generation batch's divided by it; across ranks, see ranks.ProcessGroup.normalise).
    #: Set once, where the step's work is made (:func:`one_step`); :func:`pack` starts
    #: it at the batch's own count (a batch alone is a whole step).
    step_loss_tokens: float = 0.0
    #: Per position, the sequence (a shared prompt) it may attend to besides its own;
    #: None when no prompt is shared (see :func:`pack`).
    sees_ids: torch.Tensor | None = None
    #: Producer-side numbers reported with the step's result.
    info: dict[str, float] = field(default_factory=dict)
    #: A few (prompt, completion, reward) records kept for inspection.
    samples: list[dict[str, Any]] = field(default_factory=list)
    #: The sequences' ``sampler_logprobs`` placed as ``old_logprobs`` (None: none has).
    sampler_logprobs: torch.Tensor | None = None
    #: Trained by the policy that sampled it, once: the old logprobs are the training
    #: forward's own, detached (``old_logprobs`` is unused).
    on_policy: bool = False
    #: True at the slots predicting a completion token, trained or masked (None: the
    #: trained slots are exactly those, as before multi-turn masks).
    completion_slots: torch.Tensor | None = None
    #: Sequences packed (their ids are 0..completions-1 in ``seq_ids``; a shared prompt's
    #: id is above): what rl.loss_aggregation=grpo/dr_grpo average over, counting a
    #: completion with no trained token, as TRL's mean over its batch rows does.
    completions: int = 0

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
        if self.sees_ids is not None:  # a completion also sees its group's shared prompt
            same = same | (self.sees_ids.unsqueeze(-1) == seq.unsqueeze(-2))
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
        if self.sees_ids is not None:
            self.sees_ids = self.sees_ids.to(device)
        if self.sampler_logprobs is not None:
            self.sampler_logprobs = self.sampler_logprobs.to(device)
        if self.completion_slots is not None:
            self.completion_slots = self.completion_slots.to(device)
        return self


def completion_values(
    batch: PackedBatch, values: torch.Tensor, sequences: list[Sequence]
) -> list[list[float]]:
    """Per sequence of ``sequences`` (as packed into ``batch``), ``values`` at the slots
    that predict its completion tokens, in order: the inverse of how :func:`pack` places
    ``old_logprobs``, so a forward over the packed batch gives each sequence's list.

    A sequence lies in one row, its slots in order, so the trained slots read row by row
    and grouped by owner (a stable sort) are each sequence's values in order; a sequence
    without a prompt token cannot have its first token predicted and gets 0.0 for it.
    """
    slots = batch.completion_slots if batch.completion_slots is not None else batch.loss_mask > 0
    chosen = slots & (batch.seq_ids >= 0)
    owners = batch.seq_ids[chosen]
    found = values.detach()[chosen].float()
    order = torch.argsort(owners, stable=True)
    counts = torch.bincount(owners, minlength=len(sequences)).tolist()
    flat = found[order].tolist()
    out, start = [], 0
    for seq, count in zip(sequences, counts, strict=False):
        lead = [0.0] * (len(seq.tokens) - seq.prompt_len - count)
        out.append(lead + flat[start : start + count])
        start += count
    return out


def _place(
    flat: list[float], index: int, values: list[float] | None, count: int, span: slice, what: str
) -> None:
    """Write sequence ``index``'s per-completion-token ``values`` (``count`` of them)
    into ``span``, the slots predicting them; ``span`` is one shorter when the first
    token cannot be predicted (no prompt token), and that first value is skipped."""
    if values is None:
        return
    if len(values) != count:  # a list slice would silently resize
        raise ValueError(f"sequence {index} has {count} completion tokens but {len(values)} {what}")
    flat[span] = values[count - (span.stop - span.start) :]


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


@dataclass
class _Unit:
    """Sequences laid out together in a row: their shared prompt once (all of it but its
    last token), then each sequence's remaining tokens; or one sequence whole."""

    members: list[int]
    #: Leading tokens written once for all members (0: one sequence, written whole).
    shared: int


def _shared_rows(
    sequences: list[Sequence], capacity: int
) -> tuple[list[list[_Unit]], list[int]] | None:
    """Rows in which sequences with the same prompt share one copy of it; None when no
    two sequences share a prompt.

    A group's sequences fill rows one after another; where a row is full the group goes
    on in the next, behind a copy of its prompt of its own, so rows fill to
    ``capacity`` and no group needs a row to itself. The prompt's last token is repeated
    in every member, so each member's first completion token is predicted at a position
    of its own. Prompts trained on (SFT without completion_only_loss) and one-token
    prompts are not shared; those sequences fill the space left, first-fit decreasing.
    """
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    alone: list[int] = []
    for i, seq in enumerate(sequences):
        if seq.train_prompt or seq.prompt_len < 2:
            alone.append(i)
        else:
            by_prompt.setdefault(tuple(seq.tokens[: seq.prompt_len]), []).append(i)
    alone += [m[0] for m in by_prompt.values() if len(m) == 1]
    groups = [(len(prompt) - 1, m) for prompt, m in by_prompt.items() if len(m) > 1]
    if not groups:
        return None
    rows: list[list[_Unit]] = [[]]
    fill = [0]
    for shared, members in groups:
        unit: _Unit | None = None
        for i in members:
            branch = len(sequences[i].tokens) - shared
            if fill[-1] + branch + (shared if unit is None else 0) > capacity:
                rows.append([])
                fill.append(0)
                unit = None
            if unit is None:
                unit = _Unit([], shared)
                rows[-1].append(unit)
                fill[-1] += shared
            unit.members.append(i)
            fill[-1] += branch
    for i in sorted(alone, key=lambda i: -len(sequences[i].tokens)):
        size = len(sequences[i].tokens)
        r = next((r for r, used in enumerate(fill) if used + size <= capacity), len(fill))
        if r == len(fill):
            rows.append([])
            fill.append(0)
        rows[r].append(_Unit([i], 0))
        fill[r] += size
    return rows, fill


def pack(
    sequences: list[Sequence],
    capacity: int,
    pad_id: int,
    layout: Layout,
    share_prompts: bool = False,
) -> PackedBatch:
    """Lay ``sequences`` out in rows of at most ``capacity`` tokens, as ``layout`` says.

    With ``share_prompts`` (and a layout that packs), sequences with the same prompt
    share one copy of it: each attends to that copy and to itself, at the positions it
    would have alone, so its logits are the same and the group's prompt is computed once
    instead of once per completion (``rl.num_generations`` times).

    A layout that does not pack gives each sequence its own row, right-padded: correct
    for any causal model, even kernels that drop the attention mask in training
    (Unsloth), since neither causal attention nor a causal recurrence looks at the
    padding after a sequence.
    """
    _check_fits(sequences, capacity)
    shared = _shared_rows(sequences, capacity) if share_prompts and layout.packs else None
    rows, fill = shared if shared is not None else _plain_rows(sequences, capacity, layout)
    width = max(fill)
    slots = _Slots.empty(len(rows) * width, pad_id, sees=shared is not None)
    prompts = 0
    for r, units in enumerate(rows):
        offset = r * width
        for unit in units:
            prompt_id = -2
            if unit.shared:
                prompt_id = len(sequences) + prompts
                prompts += 1
                offset = slots.write_prompt(offset, sequences[unit.members[0]], unit, prompt_id)
            for index in unit.members:
                offset = slots.write_member(offset, sequences[index], index, unit, prompt_id)
    return slots.batch((len(rows), width), sum(fill), layout, sequences)


def _check_fits(sequences: list[Sequence], capacity: int) -> None:
    """Refuse an empty batch or a sequence longer than a row, before any layout work:
    a row cannot be split, so such a sequence could never be trained on."""
    if not sequences:
        raise ValueError("nothing to pack")
    too_long = [len(s.tokens) for s in sequences if len(s.tokens) > capacity]
    if too_long:
        raise ValueError(
            f"a sequence of {max(too_long)} tokens does not fit a row of {capacity} "
            "(model.max_seq_length)"
        )


def _plain_rows(
    sequences: list[Sequence], capacity: int, layout: Layout
) -> tuple[list[list[_Unit]], list[int]]:
    """Rows of whole sequences, none sharing a prompt: packed at the least wasteful width
    where the layout packs, else one sequence per row (right-padded)."""
    sizes = [len(s.tokens) for s in sequences]
    if layout.packs:
        indices, fill = _best_rows(sizes, capacity)
    else:
        indices, fill = [[i] for i in range(len(sizes))], list(sizes)
    return [[_Unit([i], 0) for i in row] for row in indices], fill


@dataclass
class _Slots:
    """A packed batch's fields as flat Python lists (row after row), filled slice by
    slice and turned into tensors once per field: writing each sequence's slices into
    tensors cost ~500 small tensor ops per step (half the packing time of the default
    run)."""

    ids: list[int]
    positions: list[int]
    owners: list[int]
    targets: list[int]
    mask: list[float]
    advantages: list[float]
    old: list[float]
    sampler: list[float]
    #: Slots that predict a completion token (trained or masked): where
    #: :func:`completion_values` reads each sequence's values.
    completion: list[bool]
    #: The sequence whose slots each slot may see besides its own: a shared prompt's
    #: (ids from len(sequences) on), or -2 (none; never an owner, not even padding's -1).
    #: None when no prompt is shared.
    sees: list[int] | None

    @classmethod
    def empty(cls, size: int, pad_id: int, sees: bool) -> _Slots:
        """``size`` slots of padding (owner -1, nothing trained on)."""
        return cls(
            [pad_id] * size,
            [0] * size,
            [-1] * size,
            [0] * size,
            [0.0] * size,
            [0.0] * size,
            [0.0] * size,
            [0.0] * size,
            [False] * size,
            [-2] * size if sees else None,
        )

    def write_prompt(self, offset: int, first: Sequence, unit: _Unit, prompt_id: int) -> int:
        """Write the copy of ``unit``'s shared prompt (taken from its ``first`` member) at
        ``offset``, owned by ``prompt_id`` and trained on by none; return where it ends."""
        tokens = first.tokens
        end = offset + unit.shared
        self.ids[offset:end] = tokens[: unit.shared]
        self.positions[offset:end] = range(unit.shared)
        self.owners[offset:end] = [prompt_id] * unit.shared
        self.targets[offset:end] = tokens[1 : unit.shared + 1]
        return end

    def write_member(
        self, offset: int, seq: Sequence, index: int, unit: _Unit, prompt_id: int
    ) -> int:
        """Write sequence ``index`` at ``offset`` (less the ``unit``'s shared prompt,
        written before it), with its targets, loss mask, advantage and logprobs; return
        where it ends."""
        tokens = seq.tokens
        n, p, skip = len(tokens), seq.prompt_len, unit.shared
        # Slot j holds token skip + j, at its own position, and predicts the next.
        end = offset + n - skip
        self.ids[offset:end] = tokens[skip:]
        self.positions[offset:end] = range(skip, n)
        self.owners[offset:end] = [index] * (n - skip)
        if self.sees is not None:
            self.sees[offset:end] = [prompt_id] * (n - skip)
        self.targets[offset : end - 1] = tokens[skip + 1 :]
        # Position 0 predicts nothing of its own sequence's past: with no prompt
        # token the first completion token cannot be trained on.
        first = offset - skip + (0 if seq.train_prompt else max(p - 1, 0))
        self.mask[first : end - 1] = [1.0] * (end - 1 - first)
        self.advantages[first : end - 1] = [float(seq.advantage)] * (end - 1 - first)
        lead = 1 if p == 0 else 0  # (the untrainable first token, as above)
        span = slice(offset - skip + p - 1 + lead, end - 1)
        self.completion[span] = [True] * (span.stop - span.start)
        if seq.completion_mask is not None:  # tool results and template text do not train
            kept = seq.completion_mask[n - p - (span.stop - span.start) :]
            self.mask[span] = [m if k else 0.0 for m, k in zip(self.mask[span], kept, strict=True)]
        _place(self.old, index, seq.old_logprobs, n - p, span, "old logprobs")
        _place(self.sampler, index, seq.sampler_logprobs, n - p, span, "sampling logprobs")
        return end

    def batch(
        self, shape: tuple[int, int], real_tokens: int, layout: Layout, sequences: list[Sequence]
    ) -> PackedBatch:
        """The slots as a :class:`PackedBatch` of ``shape``, one tensor per field."""
        loss_mask = torch.tensor(self.mask).view(shape)
        return PackedBatch(
            input_ids=torch.tensor(self.ids, dtype=torch.long).view(shape),
            position_ids=torch.tensor(self.positions, dtype=torch.long).view(shape),
            seq_ids=torch.tensor(self.owners, dtype=torch.long).view(shape),
            targets=torch.tensor(self.targets, dtype=torch.long).view(shape),
            loss_mask=loss_mask,
            advantages=torch.tensor(self.advantages).view(shape),
            old_logprobs=torch.tensor(self.old).view(shape),
            real_tokens=real_tokens,
            layout=layout,
            step_loss_tokens=float(loss_mask.sum()),
            sees_ids=(
                None if self.sees is None else torch.tensor(self.sees, dtype=torch.long).view(shape)
            ),
            sampler_logprobs=(
                torch.tensor(self.sampler).view(shape)
                if any(s.sampler_logprobs is not None for s in sequences)
                else None
            ),
            completion_slots=torch.tensor(self.completion, dtype=torch.bool).view(shape),
            completions=len(sequences),
        )


def one_step(batches: list[PackedBatch], loss_tokens: float | None = None) -> list[PackedBatch]:
    """``batches``, the micro-batches of one optimizer step, each carrying the step's loss
    denominator: ``loss_tokens`` where the producer knows it (RL: its generation batch's
    share), else the trained-on tokens of them all. The one place a producer sets it; the
    trainer divides by it and never counts again, and across ranks
    ``ranks.ProcessGroup.normalise`` sums it."""
    if loss_tokens is None:
        loss_tokens = sum(b.loss_tokens for b in batches)
    for batch in batches:
        batch.step_loss_tokens = loss_tokens
    return batches
