"""Evaluation on held-out prompts: greedy (and optionally sampled) completions scored by
the task's rewards, and under SFT the loss on the reference answers.

The run calls :meth:`Evaluator.evaluate` every ``eval.every_steps`` steps and at the
end, between two optimizer steps (the trainer idle). It samples with a generator of its
own, seeded from the run's seed and the step, and puts every process-wide random state
back as it found it (a reward may draw from Python's ``random``), so a run with
evaluation trains the same steps as one without, and a resumed run evaluates what the
uninterrupted run evaluated. Under torchrun each rank evaluates its own slice of the
prompts and the sums are combined over the ranks; rank 0's samples are saved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from art_hydra import moved
from art_hydra.config.eval_rules import enabled
from art_hydra.config.schema import AlgorithmName
from art_hydra.engine.distributed import seed_for
from art_hydra.tasks.examples import Example
from art_hydra.tasks.held_out import EVAL_SALT

if TYPE_CHECKING:
    from art_hydra.config.schema import RunConfig

log = moved.logger(__name__)  # the name it logged under before the move


@dataclass
class _Sums:
    """What one rank adds up over its prompts (combined over the ranks as sums)."""

    n: float = 0.0
    reward: float = 0.0
    length: float = 0.0
    exact_n: float = 0.0
    exact: float = 0.0
    sampled_n: float = 0.0
    sampled: float = 0.0
    sampled_exact_n: float = 0.0
    sampled_exact: float = 0.0
    loss: float = 0.0
    loss_tokens: float = 0.0
    #: Per reward (by metric name): completions it applied to, and their sum.
    per_reward: dict[str, list[float]] = field(default_factory=dict)

    def vector(self, names: list[str]) -> list[float]:
        """The sums as one list (:data:`_TOTALS` in order, then each of ``names``'
        count and sum), to add up over the ranks."""
        head = [getattr(self, total) for total in _TOTALS]
        return head + [v for name in names for v in self.per_reward.get(name, [0.0, 0.0])]


#: The plain sums of :class:`_Sums`, in the order its vector carries them.
_TOTALS = tuple(f.name for f in fields(_Sums) if f.name != "per_reward")


def _exact(example: Example, text: str) -> float | None:
    """1.0 when the completion is the reference answer (surrounding space ignored), 0.0
    when not; None without a reference."""
    if example.answer is None:
        return None
    return float(text.strip() == example.answer.strip())


class Evaluator:
    """Evaluates the policy of ``loaded`` on ``examples`` (the evaluation data) with the
    task's ``rewards``, as ``cfg.eval`` says."""

    def __init__(
        self,
        cfg: RunConfig,
        loaded: Any,
        rewards: list[Any],
        examples: list[Example],
        world: Any,
        engine: Any = None,
    ) -> None:
        from art_hydra.engine.producer import encode_checked, stop_token_ids
        from art_hydra.engine.rl.sampling import SamplingSettings, suppressed_ids
        from art_hydra.engine.rollout.torch_engine import TorchRollout

        self.cfg, self.ev, self.loaded, self.rewards = cfg, cfg.eval, loaded, rewards
        #: What generates the completions: the run's engine where it holds weights of its
        #: own (synced to the policy after every step), else the torch sampler on the
        #: policy itself (never the overlapped copy: evaluation runs between steps).
        #: Sharded (distributed.strategy=fsdp), the run's torch sampler already holds a
        #: whole copy, synced after every step: evaluation samples from it too (an SFT run
        #: has none, so evaluation keeps its own and refreshes it when due).
        sharded = loaded.sharding is not None
        own = engine is None or (getattr(engine, "model", None) is not None and not sharded)
        self.engine = TorchRollout.on(loaded) if own else engine
        self.refreshes = own and sharded
        self.rank, self.ranks = (world.rank, world.size) if world is not None else (0, 1)
        self.world = world
        self.examples = examples
        #: This rank's slice of the prompts (every rank evaluates its own).
        self.local = examples[self.rank :: self.ranks]
        self.is_sft = cfg.algorithm.name == AlgorithmName.sft
        tok = loaded.tokenizer
        if self.is_sft:
            limit, key = cfg.sft.max_length, "sft.max_length"
        else:
            limit, key = cfg.rl.max_prompt_length, "rl.max_prompt_length"
        source = (
            f"eval.path={self.ev.path}"
            if self.ev.path is not None
            else "eval.split"
            if self.ev.split is not None
            else "the held-out prompts"
        )
        self.prompt_ids = (
            encode_checked(tok, self.local, limit, key, f"evaluation prompt(s) of {source}")
            if self.local
            else []
        )
        self.stop_ids = stop_token_ids(loaded)
        suppress = suppressed_ids(tok)
        #: Greedy: only the most likely token can be drawn.
        self.greedy = SamplingSettings(1.0, 1, 1.0, suppress)
        self.sampled = SamplingSettings(self.ev.temperature, cfg.rl.top_k, cfg.rl.top_p, suppress)
        self.max_new = self.ev.max_completion_length or cfg.rl.max_completion_length
        self.names = [r.spec.name for r in rewards]
        #: Multi-turn tool rollouts (:class:`~art_hydra.engine.envs.session.Agent`): each
        #: evaluation prompt is rolled out with its own environment, as in training.
        self.agent: Any = None
        #: The last evaluation's metrics (the run's end line quotes them).
        self.last: dict[str, float] = {}

    @classmethod
    def for_run(
        cls,
        cfg: RunConfig,
        loaded: Any,
        examples: list[Example],
        rewards: list[Any],
        world: Any,
        engine: Any = None,
        agent: Any = None,
    ) -> Evaluator | None:
        """The run's evaluator (None with evaluation off), on the data and with the
        rewards :func:`art_hydra.engine.recipe.build_run_parts` handed the recipe, the
        run's rollout engine (None: the torch sampler), and its agent (multi-turn tool
        rollouts, as in training; None: single-turn)."""
        if not enabled(cfg):
            return None
        found = cls(cfg, loaded, rewards, examples, world, engine)
        found.agent = agent
        return found

    def describe(self) -> str:
        """The start-up line: what is evaluated, on what, how often."""
        ev = self.ev
        source = (
            f"eval.fraction={ev.fraction} of the task's distinct prompts (never trained on)"
            if ev.fraction > 0
            else (f"eval.path={ev.path}" if ev.path is not None else "task.path")
            + (f", split {ev.split}" if ev.split is not None else "")
        )
        when = f"every {ev.every_steps} steps and at the end" if ev.every_steps else "at the end"
        sampled = f" + {ev.num_samples} sampled" if ev.num_samples else ""
        loss = " and the loss on the answers" if self.is_sft else ""
        return (
            f"evaluation: {len(self.examples)} prompts from {source}, greedy{sampled} "
            f"completions scored by the task's rewards{loss}, {when}"
        )

    def summary(self) -> str:
        """The last evaluation in a few words (the run's end line)."""
        m = self.last
        parts = []
        if "eval/reward" in m:
            parts.append(f"reward {m['eval/reward']:.3f}")
        if "eval/exact" in m:
            parts.append(f"exact {m['eval/exact']:.3f}")
        if "eval/loss" in m:
            parts.append(f"loss {m['eval/loss']:.4f}")
        what = "held-out" if self.ev.fraction > 0 else "evaluation"
        return f"eval {' '.join(parts)} on {int(m.get('eval/examples', 0))} {what} prompts"

    def due(self, step: int) -> bool:
        """Every ``eval.every_steps``-th step, and always the run's last one."""
        every = self.ev.every_steps
        return step == self.cfg.trainer.max_steps or (every > 0 and step % every == 0)

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """``eval/*`` metrics (combined over the ranks) and this rank's samples, the
        process's random states left as they were."""
        from art_hydra.runs.checkpoint import _process_rng, _restore_process_rng

        started = time.perf_counter()
        rng = _process_rng()
        if self.refreshes:  # every rank, even one without prompts: a collective
            self.engine.sync_weights()
        try:
            sums, samples = self._local(step)
        finally:
            _restore_process_rng(rng)
        vector = sums.vector(self.names)
        if self.world is not None and self.world.enabled:
            from art_hydra.engine import distributed

            vector = distributed.all_sum(self.world, vector)
        metrics = self._metrics(vector)
        metrics["eval/time_s"] = time.perf_counter() - started
        self.last = metrics
        return metrics, samples

    def _metrics(self, v: list[float]) -> dict[str, float]:
        """The ``eval/*`` metrics from a (combined) :meth:`_Sums.vector`."""
        t = dict(zip(_TOTALS, v, strict=False))
        per_reward = v[len(_TOTALS) :]
        n = t["n"]
        found: dict[str, float] = {"eval/examples": n}
        if n and self.rewards:
            found["eval/reward"] = t["reward"] / n
            found["eval/completion_length"] = t["length"] / n
            for i, name in enumerate(self.names):
                count, total = per_reward[2 * i], per_reward[2 * i + 1]
                if count:
                    found[f"eval/reward_{name}"] = total / count
        if t["exact_n"]:
            found["eval/exact"] = t["exact"] / t["exact_n"]
        if t["sampled_n"]:
            found["eval/sampled_reward"] = t["sampled"] / t["sampled_n"]
        if t["sampled_exact_n"]:
            found["eval/sampled_exact"] = t["sampled_exact"] / t["sampled_exact_n"]
        if t["loss_tokens"]:
            found["eval/loss"] = t["loss"] / t["loss_tokens"]
        return found

    @torch.no_grad()
    def _local(self, step: int) -> tuple[_Sums, list[dict[str, Any]]]:
        from art_hydra.engine.trainer import eval_mode

        sums, samples = _Sums(), []
        if not self.local:
            return sums, samples
        generator = torch.Generator(device=self.loaded.device).manual_seed(
            (seed_for(self.cfg.seed, self.rank) + EVAL_SALT + 1_000_003 * step) % 2**63
        )
        size = self.ev.batch_size
        with eval_mode(self._policy()) as model, self.loaded.compute_precision():
            for start in range(0, len(self.local), size):
                examples = self.local[start : start + size]
                prompts = self.prompt_ids[start : start + size]
                if self.is_sft:
                    self._loss(model, examples, prompts, sums)
                if not self.rewards:
                    continue
                rows = self._generate(examples, prompts, self.greedy, generator, step)
                for example, text, tokens, total, scores in rows:
                    sums.n += 1
                    sums.reward += total
                    sums.length += len(tokens)
                    for name, value in scores.items():
                        if value is not None:
                            entry = sums.per_reward.setdefault(name, [0.0, 0.0])
                            entry[0] += 1
                            entry[1] += value
                    hit = _exact(example, text)
                    if hit is not None:
                        sums.exact_n += 1
                        sums.exact += hit
                    if len(samples) < self.ev.log_completions:
                        samples.append(
                            {
                                "kind": "greedy",
                                "prompt": example.prompt,
                                "reference": example.answer,
                                "completion": text,
                                "reward": total,
                                "rewards": scores,
                                "exact": hit,
                            }
                        )
                if self.ev.num_samples > 0:
                    k = self.ev.num_samples
                    repeated = [p for p in prompts for _ in range(k)]
                    many = [ex for ex in examples for _ in range(k)]
                    for example, text, _, total, _ in self._generate(
                        many, repeated, self.sampled, generator, step
                    ):
                        sums.sampled_n += 1
                        sums.sampled += total
                        hit = _exact(example, text)
                        if hit is not None:
                            sums.sampled_exact_n += 1
                            sums.sampled_exact += hit
        return sums, samples

    def _policy(self) -> Any:
        """The model evaluation's forwards run on: the policy, or where it is sharded the
        sampler's whole copy (a sharded forward is a collective, and the ranks' slices of
        the prompts differ in size)."""
        return self.engine.model if self.loaded.sharding is not None else self.loaded.model

    def _generate(
        self,
        examples: list[Example],
        prompts: list[list[int]],
        settings: Any,
        generator: torch.Generator,
        step: int,
    ) -> list[tuple[Example, str, list[int], float, dict[str, float | None]]]:
        """One completion per prompt under ``settings``, scored by every reward."""
        from art_hydra.engine.rollout.base import Request
        from art_hydra.tasks.scoring import score_rewards

        tok = self.loaded.tokenizer
        timeout = self.cfg.timeouts.rollout_s
        agent_args = None
        if self.agent is not None:
            batch = self._agent_batch(examples, settings, generator)
            completions, texts, agent_args = batch.completions, batch.texts, batch.reward_args
        else:
            requests = [Request(tuple(p), self.max_new, self.stop_ids) for p in prompts]
            done = self.engine.generate(requests, settings, generator, timeout_s=timeout)
            completions = [c.token_ids for c in done]
            texts = tok.batch_decode(completions, skip_special_tokens=True)
        pairs = list(zip(examples, texts, strict=True))
        scores = score_rewards(
            self.rewards,
            pairs,
            self.cfg.timeouts.reward_s,
            completions,
            global_step=step,
            agent=agent_args,
        )
        if self.agent is not None:
            batch.close()  # the rewards have read the environments
        per = [
            {name: values[i] for name, values in zip(self.names, scores.per_reward, strict=True)}
            for i in range(len(pairs))
        ]
        return [
            (ex, text, ids, total, p)
            for ex, text, ids, total, p in zip(
                examples, texts, completions, scores.totals, per, strict=True
            )
        ]

    def _agent_batch(self, examples: list[Example], settings: Any, generator: Any) -> Any:
        """Multi-turn tool rollouts of ``examples``, as the producer rolls them out."""
        from art_hydra.engine.envs.loop import TurnRules
        from art_hydra.engine.envs.session import agent_rollouts

        timeout = self.cfg.timeouts.rollout_s

        def sample(engine: Any, requests: list[Any], left: float | None) -> list[Any]:
            return engine.generate(requests, settings, generator, timeout_s=left)

        def rules(agent: Any) -> TurnRules:
            return TurnRules.of(agent, self.cfg, self.max_new, self.stop_ids, None)

        return agent_rollouts(self.agent, examples, rules, sample, self.engine, timeout)

    def _loss(
        self, model: Any, examples: list[Example], prompts: list[list[int]], sums: _Sums
    ) -> None:
        """SFT: the token-mean negative log-likelihood of the reference answers (and
        EOS) given their prompts, packed as training packs them."""
        from art_hydra.engine.packing import pack
        from art_hydra.engine.producer import answer_sequence, sft_row_capacity
        from art_hydra.engine.rl.sampling import SamplingSettings
        from art_hydra.engine.trainer import packed_logprobs

        tok = self.loaded.tokenizer
        sequences = [
            answer_sequence(tok, prompt, example.answer, train_prompt=False)
            for example, prompt in zip(examples, prompts, strict=True)
            if example.answer is not None
        ]
        if not sequences:
            return
        capacity = sft_row_capacity(self.cfg)
        batch = pack(sequences, capacity, tok.pad_token_id, self.loaded.layout, False)
        batch.to(self.loaded.device)
        values, _ = packed_logprobs(model, batch, SamplingSettings())
        trained = batch.loss_mask > 0
        sums.loss -= float(values[trained].sum())
        sums.loss_tokens += float(trained.sum())
