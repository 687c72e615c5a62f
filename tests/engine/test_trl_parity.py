"""Where TRL 1.16's GRPOTrainer made a choice, art_hydra makes the same one.

With ``rl.steps_per_generation > 1`` a generation batch trains several optimizer steps;
TRL divides each step's token-level loss (``dapo``, ``cispo``) by the generation batch's
``num_items_in_batch`` rescaled to one step (``grpo_trainer.py``, ``_compute_loss``)::

    normalizer = num_items_in_batch / num_processes
    normalizer = normalizer * gradient_accumulation_steps / steps_per_generation

``num_items_in_batch`` being the loss tokens of the generation batch over all processes.
In art_hydra one mini-batch is one optimizer step (RL does not accumulate), so each
mini-batch divides by the generation batch's tokens / steps_per_generation. The formula
is reproduced here (:func:`trl_normalizer`); where TRL is installed (the ``bench``
extra), its own ``_compute_loss`` runs on the same tensors (skipped otherwise).
"""

from __future__ import annotations

import collections
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import output_of, report_entries, run_cli
from conftest_model import QUICK, tiny

from art_hydra import compose, train
from art_hydra.engine.metrics import read_metrics
from art_hydra.engine.packing import PACKED, Sequence, pack
from art_hydra.engine.producer import MiniBatch
from art_hydra.engine.recipe import build_trainer_and_producer
from art_hydra.engine.rl.losses import PolicyLossSettings, policy_loss


def trl_normalizer(
    num_items_in_batch: float, processes: int, accumulation: int, steps_per_generation: int
) -> float:
    """TRL 1.16's divisor of one micro-batch's loss sum (``dapo`` and ``cispo``)."""
    return num_items_in_batch / processes * accumulation / steps_per_generation


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_generation", [2, 3])
def test_each_mini_batch_divides_by_the_generation_batch_mean(steps_per_generation: int) -> None:
    cfg, _, _ = tiny(
        [f"rl.steps_per_generation={steps_per_generation}", "rl.max_completion_length=12"]
    )
    _, producer = build_trainer_and_producer(cfg)
    inputs = [producer.make_inputs()[0] for _ in range(steps_per_generation)]
    assert producer.generations == 1  # one generation batch
    own = [b.loss_tokens for b in inputs]
    expected = trl_normalizer(sum(own), 1, 1, steps_per_generation)
    assert [b.step_loss_tokens for b in inputs] == pytest.approx([expected] * len(inputs))
    # The choice matters here: the mini-batches hold different token counts, so dividing
    # each by its own count would scale their gradients by own/mean (0.86-1.14x seen).
    scales = [n / expected for n in own]
    assert max(abs(s - 1) for s in scales) > 1e-3, scales


@pytest.mark.slow
def test_one_mini_batch_per_generation_keeps_its_own_count() -> None:
    cfg, _, _ = tiny()
    _, producer = build_trainer_and_producer(cfg)
    batch = producer.make_inputs()[0]
    assert batch.step_loss_tokens == batch.loss_tokens


def test_a_mini_batch_of_an_older_checkpoint_keeps_its_own_count() -> None:
    """Checkpoints written before the generation count was kept resume as they trained."""
    seq = Sequence(tokens=[1, 2, 3, 4], prompt_len=2, old_logprobs=[-1.0, -1.0])
    data = MiniBatch([seq], {}, []).to_json()
    del data["generation_loss_tokens"]
    old = MiniBatch.from_json(data)
    assert old.loss_denominator(2, 7.0) == 7.0
    new = MiniBatch.from_json({**data, "generation_loss_tokens": 10.0})
    assert new.loss_denominator(2, 7.0) == 5.0


def test_a_sequence_counts_the_tokens_pack_trains_on() -> None:
    seqs = [
        Sequence(tokens=[5] * 7, prompt_len=3),
        Sequence(tokens=[5] * 4, prompt_len=0),
        Sequence(tokens=[5] * 6, prompt_len=2, train_prompt=True),
        Sequence(tokens=[5] * 3, prompt_len=3),
    ]
    for seq in seqs:
        assert pack([seq], 16, 0, PACKED).loss_tokens == seq.loss_tokens
    assert pack(seqs, 16, 0, PACKED).loss_tokens == sum(s.loss_tokens for s in seqs)


# ---- against TRL's own _compute_loss ---------------------------------------------------


def _generation_batch(seed: int, size: int = 8) -> list[tuple[list[float], list[float], float]]:
    """(logprobs, sampling logprobs, advantage) per completion, of varied lengths."""
    rng = random.Random(seed)
    out = []
    for _ in range(size):
        n = rng.randint(1, 9)
        logp = [rng.uniform(-3.0, -0.05) for _ in range(n)]
        old = [v + rng.gauss(0.0, 0.3) for v in logp]
        out.append((logp, old, rng.gauss(0.0, 1.0)))
    return out


def _ours(
    part: list[tuple[list[float], list[float], float]],
    settings: PolicyLossSettings,
    denominator: float,
) -> tuple[float, dict[str, float]]:
    """art_hydra's loss on the packed rows of one mini-batch (prompt of 2 tokens)."""

    def packed(index: int) -> torch.Tensor:
        seqs = [
            Sequence([1, 1] + [2] * len(c[0]), 2, advantage=c[2], old_logprobs=c[index])
            for c in part
        ]
        return pack(seqs, 64, 0, PACKED)

    new, old = packed(0), packed(1)
    loss, stats = policy_loss(
        new.old_logprobs, old.old_logprobs, old.advantages, old.loss_mask, settings, denominator
    )
    return loss.item(), stats


def _trls(
    part: list[tuple[list[float], list[float], float]],
    loss_type: str,
    settings: PolicyLossSettings,
    num_items: float,
    steps_per_generation: int,
    compute: Any = None,
) -> tuple[float, dict[str, float]]:
    """TRL's ``GRPOTrainer._compute_loss`` on the same mini-batch, with its model forward
    replaced by the logprobs (one process, no accumulation, no vLLM; no KL unless
    ``compute(stub, inputs)``, which calls it, sets one up)."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    width = max(len(c[0]) for c in part)

    def rows(index: int) -> torch.Tensor:
        return torch.tensor([c[index] + [0.0] * (width - len(c[index])) for c in part])

    mask = torch.tensor([[1] * len(c[0]) + [0] * (width - len(c[0])) for c in part])
    logps = rows(0)
    metrics: Any = collections.defaultdict(lambda: collections.defaultdict(list))
    same = SimpleNamespace(num_processes=1, reduce=lambda x, reduction="sum": x)
    same.gather = same.gather_for_metrics = lambda x: x
    stub = SimpleNamespace(
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        loss_type=loss_type,
        epsilon_low=settings.epsilon,
        epsilon_high=settings.epsilon_high,
        args=SimpleNamespace(
            delta=None, steps_per_generation=steps_per_generation, use_bias_correction_kl=False
        ),
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=same,
        _entropy_bonus_enabled=False,
        _metrics=metrics,
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
    )
    inputs = {
        "prompt_ids": torch.ones(len(part), 2, dtype=torch.long),
        "prompt_mask": torch.ones(len(part), 2, dtype=torch.long),
        "completion_ids": torch.full((len(part), width), 2),
        "completion_mask": mask,
        "advantages": torch.tensor([c[2] for c in part]),
        "old_per_token_logps": rows(1),
        "num_items_in_batch": torch.tensor(num_items),
    }
    if compute is None:
        loss = GRPOTrainer._compute_loss(stub, None, inputs)
    else:
        loss = compute(stub, inputs)
    return loss.item(), {k: v[-1] for k, v in metrics["train"].items()}


@pytest.mark.parametrize("loss_type", ["dapo", "cispo"])
@pytest.mark.parametrize("steps_per_generation", [2, 4])
def test_mini_batch_losses_equal_trls(loss_type: str, steps_per_generation: int) -> None:
    pytest.importorskip("trl")
    ours_type = "cispo" if loss_type == "cispo" else "ppo_clip"
    settings = PolicyLossSettings(ours_type, 0.2, 1.1 if loss_type == "cispo" else 0.28, 0.0)
    generation = _generation_batch(seed=steps_per_generation)
    size = len(generation) // steps_per_generation
    parts = [generation[i : i + size] for i in range(0, len(generation), size)]
    num_items = float(sum(len(c[0]) for c in generation))
    minis = [
        MiniBatch([Sequence([1, 1] + [2] * len(c[0]), 2) for c in part], {}, [], num_items)
        for part in parts
    ]
    for part, mini in zip(parts, minis, strict=True):
        own = float(sum(len(c[0]) for c in part))
        denominator = mini.loss_denominator(steps_per_generation, own)
        assert denominator == pytest.approx(trl_normalizer(num_items, 1, 1, steps_per_generation))
        ours, stats = _ours(part, settings, denominator)
        theirs, metrics = _trls(part, loss_type, settings, num_items, steps_per_generation)
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-7)
        if loss_type == "cispo":
            assert stats["clip_fraction"] == pytest.approx(metrics["cispo_clip_ratio"], abs=1e-7)
        else:
            assert stats["clip_fraction"] == pytest.approx(
                metrics["clip_ratio/region_mean"], abs=1e-7
            )


# ---- rl.loss_aggregation: each of TRL's normalisations ---------------------------------

#: TRL's loss_type -> (rl.loss_type, rl.loss_aggregation); cispo normalises as dapo in TRL.
PAIRS = {
    "grpo": ("ppo_clip", "grpo"),
    "bnpo": ("ppo_clip", "bnpo"),
    "dr_grpo": ("ppo_clip", "dr_grpo"),
    "dapo": ("ppo_clip", "dapo"),
    "cispo": ("cispo", "dapo"),
}
MAX_COMPLETION = 12


def _reference(logp: list[float]) -> list[float]:
    """A reference policy's logprobs near the policy's (deterministic), for the KL term."""
    return [0.9 * v - 0.1 for v in logp]


def _ours_aggregated(
    part: list[tuple[list[float], list[float], float]],
    settings: PolicyLossSettings,
    denominator: float,
) -> tuple[float, dict[str, float]]:
    """art_hydra's loss on one mini-batch packed several completions per row (rows of 24
    slots, prompts of 2 tokens), with the KL term, its completions told apart by the
    packed ``seq_ids``."""

    def packed(logprobs: list[list[float]]) -> Any:
        seqs = [
            Sequence([1, 1] + [2] * len(c[0]), 2, advantage=c[2], old_logprobs=lp)
            for c, lp in zip(part, logprobs, strict=True)
        ]
        return pack(seqs, 24, 0, PACKED)

    new = packed([c[0] for c in part])
    old = packed([c[1] for c in part])
    ref = packed([_reference(c[0]) for c in part])
    loss, stats = policy_loss(
        new.old_logprobs,
        old.old_logprobs,
        old.advantages,
        old.loss_mask,
        settings,
        denominator,
        ref.old_logprobs,
        seq_ids=old.seq_ids,
        completions=old.completions,
    )
    return loss.item(), stats


def _shares_rows(part: list[tuple[list[float], list[float], float]]) -> bool:
    """Whether packing ``part`` as :func:`_ours_aggregated` does puts several completions
    in one row (``pack`` chooses the least wasteful width)."""
    seqs = [Sequence([1, 1] + [2] * len(c[0]), 2) for c in part]
    ids = pack(seqs, 24, 0, PACKED).seq_ids
    return any(len(set(row.tolist()) - {-1}) > 1 for row in ids)


def _trls_with_kl(
    part: list[tuple[list[float], list[float], float]],
    loss_type: str,
    settings: PolicyLossSettings,
    num_items: float,
    steps_per_generation: int,
) -> tuple[float, dict[str, float]]:
    """TRL's ``_compute_loss`` as :func:`_trls`, with the KL term to :func:`_reference`'s
    logprobs and ``max_completion_length`` (dr_grpo's constant) set."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    width = max(len(c[0]) for c in part)

    def compute(stub: Any, inputs: dict[str, Any]) -> Any:
        stub.beta, stub.max_completion_length = settings.beta, MAX_COMPLETION
        inputs["ref_per_token_logps"] = torch.tensor(
            [_reference(c[0]) + [0.0] * (width - len(c[0])) for c in part]
        )
        return GRPOTrainer._compute_loss(stub, None, inputs)

    return _trls(part, loss_type, settings, num_items, steps_per_generation, compute)


@pytest.mark.parametrize("loss_type", sorted(PAIRS))
@pytest.mark.parametrize("steps_per_generation", [1, 2, 4])
def test_every_aggregation_equals_trls(loss_type: str, steps_per_generation: int) -> None:
    """Each of TRL's normalisations (with its policy loss) on varied-length completions
    packed several per row, with the KL term: loss, clip and KL statistics equal TRL's
    own ``_compute_loss`` on each mini-batch of the generation batch."""
    pytest.importorskip("trl")
    policy, aggregation = PAIRS[loss_type]
    high = 1.1 if policy == "cispo" else 0.28
    settings = PolicyLossSettings(
        policy, 0.2, high, 0.04, aggregation=aggregation, max_completion_length=MAX_COMPLETION
    )
    generation = _generation_batch(seed=10 + steps_per_generation, size=12)
    size = len(generation) // steps_per_generation
    parts = [generation[i : i + size] for i in range(0, len(generation), size)]
    num_items = float(sum(len(c[0]) for c in generation))
    assert any(_shares_rows(part) for part in parts)
    for part in parts:
        mini = MiniBatch([Sequence([1, 1] + [2] * len(c[0]), 2) for c in part], {}, [], num_items)
        own = float(sum(len(c[0]) for c in part))
        denominator = mini.loss_denominator(steps_per_generation, own)
        ours, stats = _ours_aggregated(part, settings, denominator)
        theirs, metrics = _trls_with_kl(part, loss_type, settings, num_items, steps_per_generation)
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-7)
        clip = "cispo_clip_ratio" if policy == "cispo" else "clip_ratio/region_mean"
        assert stats["clip_fraction"] == pytest.approx(metrics[clip], abs=1e-7)
        assert stats["kl"] == pytest.approx(metrics["kl"], rel=1e-6)


@pytest.mark.parametrize("aggregation", ["grpo", "dr_grpo"])
def test_a_shared_prompt_is_no_completion(aggregation: str) -> None:
    """With ``rl`` groups' prompts packed once (a shared prompt has an id of its own and
    trains no token), grpo and dr_grpo average over the same completions as unshared."""
    part = _generation_batch(seed=5, size=6)
    settings = PolicyLossSettings(
        "ppo_clip", 0.2, 0.28, 0.0, aggregation=aggregation, max_completion_length=12
    )

    def loss(share: bool) -> float:
        def packed(index: int) -> Any:
            seqs = [
                Sequence([1, 1, 1] + [2] * len(c[0]), 3, advantage=c[2], old_logprobs=c[index])
                for c in part
            ]
            return pack(seqs, 64, 0, PACKED, share_prompts=share)

        new, old = packed(0), packed(1)
        assert share == (old.sees_ids is not None)
        args = (new.old_logprobs, old.old_logprobs, old.advantages, old.loss_mask, settings)
        value, _ = policy_loss(*args, 1.0, seq_ids=old.seq_ids, completions=old.completions)
        return value.item()

    assert loss(True) == pytest.approx(loss(False), rel=1e-6)


@pytest.mark.parametrize("aggregation", ["grpo", "bnpo", "dr_grpo"])
def test_a_per_process_aggregation_ignores_the_global_count(
    monkeypatch: pytest.MonkeyPatch, aggregation: str
) -> None:
    """TRL's grpo, bnpo and dr_grpo are each process's own mean, which DDP then averages:
    across ranks the step's global count (``ranks.ProcessGroup.normalise``) leaves their
    loss as one process computes it, while dapo's follows the count."""
    from art_hydra.engine import distributed
    from art_hydra.engine.ranks import ProcessGroup

    monkeypatch.setattr(distributed, "all_sum", lambda world, values: [values[0] + 50.0])
    part = _generation_batch(seed=3, size=6)
    settings = PolicyLossSettings(
        "ppo_clip", 0.2, 0.28, 0.04, aggregation=aggregation, max_completion_length=12
    )
    mini = MiniBatch([Sequence([1, 1] + [2] * len(c[0]), 2) for c in part], {}, [], None)
    batch = pack(mini.sequences, 24, 0, PACKED)
    alone, _ = _ours_aggregated(part, settings, batch.step_loss_tokens)
    ProcessGroup(SimpleNamespace(enabled=True, size=2), 1.0, 1.0, 1.0).normalise([batch])  # type: ignore[arg-type]
    assert batch.step_loss_tokens != batch.loss_tokens
    ranked, _ = _ours_aggregated(part, settings, batch.step_loss_tokens)
    assert ranked == alone
    dapo = PolicyLossSettings("ppo_clip", 0.2, 0.28, 0.04)
    assert _ours_aggregated(part, dapo, batch.step_loss_tokens)[0] != pytest.approx(
        _ours_aggregated(part, dapo, batch.loss_tokens)[0]
    )


def test_the_default_aggregation_is_the_old_normalisation_bit_for_bit() -> None:
    """A config without the key (its legacy value) and the default both give ``dapo``,
    whose loss is, bit for bit, what ``policy_loss`` computed before the key existed:
    the masked sum of PPO-clip's and the KL's per-token terms over the step's count."""
    from art_hydra.config.fields import legacy_values

    assert legacy_values()["rl.loss_aggregation"] == "dapo"
    settings = PolicyLossSettings.from_config(compose([]).rl)
    assert settings.aggregation == "dapo"
    settings = PolicyLossSettings(settings.loss_type, 0.2, 0.28, 0.04)
    torch.manual_seed(0)
    new, old, ref = (torch.randn(3, 10) - 1.0 for _ in range(3))
    advantages, mask = torch.randn(3, 10), (torch.rand(3, 10) > 0.3).float()
    loss, _ = policy_loss(new, old, advantages, mask, settings, 11.0, ref)
    keep = mask > 0
    new, old, ref = (torch.where(keep, t, torch.zeros_like(t)) for t in (new, old, ref))
    ratio = torch.exp((new - old).clamp(-20.0, 20.0))
    clipped = ratio.clamp(0.8, 1.28)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    delta = (ref - new).clamp(-20.0, 20.0)
    per_token = per_token + 0.04 * (torch.exp(delta) - delta - 1)
    assert torch.equal(loss, (per_token * mask).sum() / 11.0)


@pytest.mark.fast  # a refusal at composition: the real CLI, nothing loaded
@pytest.mark.parametrize("name", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_a_trl_loss_type_name_is_refused_with_both_keys(name: str, tmp_path: Path) -> None:
    """TRL's ``loss_type=dapo`` names a policy loss and a normalisation together; typed
    at ``rl.loss_type`` the fix sets both (not ppo_clip alone), and the fix runs."""
    proc = run_cli(f"rl.loss_type={name}", "dry_run=true", cwd=tmp_path)
    assert proc.returncode != 0
    fixed = f"rl.loss_type=ppo_clip rl.loss_aggregation={name}"
    assert report_entries(output_of(proc)) == [("rl.loss_type", name, fixed)]
    if name == "dr_grpo":
        proc = run_cli(*fixed.split(), "dry_run=true", cwd=tmp_path)
        assert proc.returncode == 0, output_of(proc)


@pytest.mark.slow
def test_a_cispo_run_logs_both_counts(tmp_path: Path) -> None:
    overrides = [
        *QUICK,
        "trainer.max_steps=4",
        "rl.loss_type=cispo",
        "rl.epsilon_high=1.0001",
        "rl.num_iterations=2",
    ]
    train(compose(overrides), run_dir=tmp_path)
    rows = read_metrics(tmp_path)
    assert all(0 <= r["clip_fraction"] <= r["cispo_capped_fraction"] <= 1 for r in rows)
    assert any(r["cispo_capped_fraction"] > r["clip_fraction"] for r in rows)  # A < 0 too


def test_across_ranks_the_generation_counts_are_summed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks, each with its own generation batch: every mini-batch divides by TRL's
    normalizer over both (the sum of the ranks' generation tokens / steps_per_generation
    / processes, since DDP averages the ranks' gradients)."""
    from art_hydra.engine import distributed
    from art_hydra.engine.ranks import ProcessGroup

    other_rank = 40.0 / 2  # the other rank's generation batch: 40 tokens, 2 mini-batches
    monkeypatch.setattr(distributed, "all_sum", lambda world, values: [values[0] + other_rank])
    seqs = [Sequence([1, 1] + [2] * n, 2) for n in (3, 9, 4, 8)]
    mine = [MiniBatch(seqs[:2], {}, [], 24.0), MiniBatch(seqs[2:], {}, [], 24.0)]
    for mini in mine:
        batch = pack(mini.sequences, 64, 0, PACKED)
        batch.step_loss_tokens = mini.loss_denominator(2, batch.loss_tokens)
        world = SimpleNamespace(enabled=True, size=2)
        ProcessGroup(world, 1.0, 1.0, 1.0).normalise([batch])  # type: ignore[arg-type]
        assert batch.step_loss_tokens == trl_normalizer(24.0 + 40.0, 2, 1, 2)
