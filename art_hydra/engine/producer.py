"""The producer: prompts -> rollouts -> rewards -> advantages -> packed inputs.

It reads ``cfg.producer`` plus the algorithm's own section for rollout settings. RL
makes one input per optimizer step (whole groups of ``rl.num_generations`` completions
of the same prompt); SFT makes ``gradient_accumulation_steps`` micro-batch inputs per
step. The run puts them on the queue and waits for the step's result.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from art_hydra import moved
from art_hydra.engine.distributed import World, seed_for
from art_hydra.engine.packing import PackedBatch, Sequence, completion_values, one_step, pack
from art_hydra.engine.rl.advantages import group_advantages
from art_hydra.engine.rl.sampling import SamplingSettings
from art_hydra.engine.rollout.base import Request, build_rollout_engine
from art_hydra.engine.trainer import eval_mode, packed_logprobs
from art_hydra.errors import InvalidDistributionError, StallError
from art_hydra.tasks import Example, Task, TaskDataError
from art_hydra.tasks.held_out import prompt_key
from art_hydra.tasks.scoring import Scores, score_rewards

if TYPE_CHECKING:
    from art_hydra.config.schema import RunConfig

log = moved.logger(__name__)  # the name it logged under before the move


class ExampleStream:
    """Examples in a reproducible order: epoch ``e`` is shuffled with seed ``seed + e``.

    Its whole state is (epoch, position), so a checkpoint restores it exactly.
    """

    def __init__(self, examples: list[Example], seed: int, shuffle: bool) -> None:
        self.examples = examples
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            out.append(self.examples[self._order[self.position]])
            self.position += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._make_order()


def prompt_messages(example: Example) -> list[dict[str, str]]:
    """The chat messages of ``example``'s prompt: its conversation (TRL's conversational
    format, or ``task.system_prompt`` then the text), else the text as one user turn."""
    pairs = example.messages or (("user", example.prompt),)
    return [{"role": role, "content": content} for role, content in pairs]


def encode_prompt(tokenizer: Any, example: Example | str) -> list[int]:
    """Prompt ids: with a chat template, the template applied to :func:`prompt_messages`
    with the generation prompt (as TRL encodes conversational prompts); without one
    (the tiny model), or for TRL's standard text rows (``example.plain``), the text. A
    conversation on a tokenizer without a template cannot be encoded faithfully and is
    refused (the pre-flight refuses it earlier)."""
    if isinstance(example, str):
        example = Example(prompt=example)
    if getattr(tokenizer, "chat_template", None) and (example.messages or not example.plain):
        ids = tokenizer.apply_chat_template(
            prompt_messages(example), add_generation_prompt=True, tokenize=True
        )
        # transformers 5 returns a BatchEncoding here, older versions a list of ids.
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if example.messages:
        raise TaskDataError(
            f"the prompt {example.prompt[:40]!r} is a conversation (a list of messages or "
            "task.system_prompt), but the tokenizer has no chat template to render it; use a "
            "model with a chat template, or text prompts without task.system_prompt"
        )
    return list(tokenizer(example.prompt)["input_ids"])


def encode_prompts(tokenizer: Any, examples: list[Example] | list[str]) -> list[list[int]]:
    """:func:`encode_prompt` for many: plain text in one batched call of the fast
    tokenizer (2,000 prompts one by one took 0.2 s of the start-up), each distinct
    prompt encoded once."""
    items = [Example(prompt=e) if isinstance(e, str) else e for e in examples]
    unique = list({prompt_key(ex): ex for ex in items}.values())
    if getattr(tokenizer, "chat_template", None) or any(ex.messages for ex in unique):
        ids = [encode_prompt(tokenizer, ex) for ex in unique]
    else:
        ids = [list(row) for row in tokenizer([ex.prompt for ex in unique])["input_ids"]]
    table = {prompt_key(ex): row for ex, row in zip(unique, ids, strict=True)}
    return [table[prompt_key(ex)] for ex in items]


def stop_token_ids(loaded: Any) -> tuple[int, ...]:
    """Every id that ends a completion: the tokenizer's EOS and the model's
    ``generation_config.eos_token_id`` (Llama 3 lists three)."""
    ids = {loaded.tokenizer.eos_token_id}
    config = getattr(loaded.model, "generation_config", None)
    extra = getattr(config, "eos_token_id", None)
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    ids.discard(None)
    return tuple(sorted(ids))


def encode_checked(
    tokenizer: Any, examples: list[Example], limit: int, key: str, what: str = "prompt(s)"
) -> list[list[int]]:
    """Every prompt's ids, refusing prompts longer than ``limit`` up front.

    Cutting a templated prompt would drop its beginning (the system header, the first
    operand) and train on a different question without a word, so it is an error that
    names the setting to raise; ``what`` says whose prompts (evaluation's, of eval.path).
    """
    encoded = encode_prompts(tokenizer, examples)
    longest = max(len(ids) for ids in encoded)
    if longest > limit:
        count = sum(len(ids) > limit for ids in encoded)
        raise TaskDataError(
            f"{count} {what} are longer than {key}={limit} tokens (the longest has "
            f"{longest}, chat template included); set {key}={longest} (and model.max_seq_length "
            "to fit) or shorten the prompts"
        )
    return encoded


def answer_sequence(tokenizer: Any, prompt: list[int], answer: str, train_prompt: bool) -> Sequence:
    """An SFT row: the prompt's ids, the answer's (no special tokens of their own) and EOS,
    trained on from the answer on (and on the prompt too with ``train_prompt``). SFT's
    training and evaluation's loss on the answers build their rows alike from here."""
    ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    return Sequence(
        tokens=prompt + ids + [tokenizer.eos_token_id],
        prompt_len=len(prompt),
        train_prompt=train_prompt,
    )


def sft_row_capacity(cfg: RunConfig) -> int:
    """The tokens one packed SFT row holds: ``sft.max_length``, or the model's window
    (``model.max_seq_length``) where that is shorter."""
    return min(cfg.model.max_seq_length, cfg.sft.max_length)


def _part(scores: Scores, start: int, stop: int) -> dict[str, list[float | None]]:
    """Each reward's values for completions ``start:stop``, by its metric name."""
    return {
        bound.spec.name: values[start:stop]
        for bound, values in zip(scores.rewards, scores.per_reward, strict=True)
    }


def reward_metrics(per_reward: dict[str, list[float | None]]) -> dict[str, float | None]:
    """``reward/<name>/mean`` and ``/std`` over the completions each reward applies to
    (TRL's nanmean and nanstd; None when it applies to none), and ``/count``, how many
    that is (the ranks' metrics are combined from it)."""
    found: dict[str, float | None] = {}
    for name, values in per_reward.items():
        applied = [v for v in values if v is not None]
        mean = sum(applied) / len(applied) if applied else None
        std = (
            (sum((v - mean) ** 2 for v in applied) / len(applied)) ** 0.5
            if mean is not None
            else None
        )
        found.update(
            {
                f"reward/{name}/mean": mean,
                f"reward/{name}/std": std,
                f"reward/{name}/count": float(len(applied)),
            }
        )
    return found


@dataclass
class MiniBatch:
    """One optimizer step's share of a generation batch: whole groups of completions with
    their advantages and sampling-time logprobs, packed only when handed to the trainer."""

    sequences: list[Sequence]
    info: dict[str, float]
    samples: list[dict[str, Any]]
    #: Trained-on tokens of the whole generation batch it came from (on this rank);
    #: None for a mini-batch restored from a checkpoint written before it was kept.
    generation_loss_tokens: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "sequences": [dataclasses.asdict(s) for s in self.sequences],
            "info": self.info,
            "samples": self.samples,
            "generation_loss_tokens": self.generation_loss_tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MiniBatch:
        # Saved before sampler logprobs were kept apart: the old logprobs were the sampler's.
        sequences = [{"sampler_logprobs": s.get("old_logprobs"), **s} for s in data["sequences"]]
        return cls(
            [Sequence(**s) for s in sequences],
            data["info"],
            data["samples"],
            data.get("generation_loss_tokens"),
        )

    def loss_denominator(self, steps_per_generation: int, own_tokens: float) -> float:
        """What its loss sum is divided by on this rank: the generation batch's mean
        trained-on tokens per mini-batch (TRL's ``num_items_in_batch`` rescaled by
        ``steps_per_generation``), so every optimizer step of a generation batch weighs a
        token alike, however the tokens fell into mini-batches. A mini-batch of an older
        checkpoint (no generation count) keeps its own count, as it was trained then."""
        if self.generation_loss_tokens is None:
            return own_tokens
        return self.generation_loss_tokens / steps_per_generation


def _slice(examples: list[Example], size: int, rank: int) -> list[Example]:
    """Rank ``rank``'s share of a global batch (all ranks read the same stream)."""
    return examples[rank * size : (rank + 1) * size]


class RLProducer:
    """Samples generation batches from the current policy and hands them out as
    mini-batches, one per optimizer step.

    A generation batch holds ``rl.steps_per_generation`` mini-batches of whole groups;
    each is trained on ``rl.num_iterations`` times (all mini-batches in order, then again),
    so the importance ratio against the sampling-time logprobs moves off 1 from the
    second step on a batch, and clipping acts. With both at 1 every step samples afresh.
    """

    def __init__(
        self,
        loaded: Any,
        task: Task,
        cfg: RunConfig,
        sampling: SamplingSettings,
        world: World | None = None,
        engine: Any = None,
        agent: Any = None,
    ) -> None:
        """``cfg`` is the run's validated config: the producer reads its ``rl``,
        ``producer`` and ``timeouts`` sections, the completions per step
        (``trainer.per_device_train_batch_size``), ``model.max_seq_length`` and ``seed``.
        ``sampling`` must be the trainer's, so logprobs match rollouts. ``engine`` is the
        rollout engine (:mod:`art_hydra.engine.rollout`; None: the one ``rollout.engine``
        names, built here). ``agent`` (:class:`~art_hydra.engine.envs.session.Agent`):
        multi-turn rollouts with its environments and tools; None: single-turn."""
        rl_cfg, producer_cfg, seed = cfg.rl, cfg.producer, cfg.seed
        self.agent, self.cfg = agent, cfg
        self.rewards = list(task.rewards) + (agent_reward() if agent and agent.has_reward else [])
        self.loaded = loaded
        self.task = task
        #: This rank and the number of ranks: each rank samples its own slice of every
        #: global batch (whole groups), with its own sampler stream.
        self.rank, self.ranks = (world.rank, world.size) if world is not None else (0, 1)
        self.rl = rl_cfg
        self.timeouts = cfg.timeouts
        #: Completions no reward applied to are warned about once (the pre-flight said so
        #: already when it saw it on the first rows).
        self.none_warned = False
        self.log_completions = producer_cfg.log_completions
        self.share_prompts = producer_cfg.share_prompts
        self.groups = cfg.trainer.per_device_train_batch_size // rl_cfg.num_generations
        self.capacity = cfg.model.max_seq_length
        self.sampling = sampling
        #: Whether every step trains the policy that sampled its rollouts, once (one
        #: iteration, one step per generation, no overlap): its old logprobs are then the
        #: training forward's own; otherwise a forward at sampling time records them.
        self.on_policy = (
            rl_cfg.num_iterations == 1
            and rl_cfg.steps_per_generation == 1
            and not rl_cfg.overlap_rollouts
        )
        self.stop_ids = stop_token_ids(loaded)
        self.prompt_ids = self._encoded() if agent is None else {}
        self.stream = ExampleStream(task.examples, seed, producer_cfg.shuffle)
        self.generator = torch.Generator(device=loaded.device).manual_seed(
            seed_for(seed, self.rank)
        )
        #: Mini-batches of the current generation batch still to be trained on.
        self.pending: list[MiniBatch] = []
        #: Generation batches sampled so far.
        self.generations = 0
        #: The optimizer step the next generation batch is sampled for (0: the warmup
        #: pass), set by the run; errors of sampling name it.
        self.step: int | None = None
        #: What samples the rollouts (rollout.engine): the torch sampler on the policy (or,
        #: with rl.overlap_rollouts, on a copy of it), or an engine holding its own weights.
        self.engine = engine if engine is not None else build_rollout_engine(loaded, cfg, world)

    def _encoded(self) -> dict[Any, list[int]]:
        """Every prompt's ids by its key, checked against rl.max_prompt_length (an
        agent's prompts are encoded per rollout: they depend on its environment)."""
        examples = self.task.examples
        limit = self.rl.max_prompt_length
        ids = encode_checked(self.loaded.tokenizer, examples, limit, "rl.max_prompt_length")
        return {prompt_key(ex): p for ex, p in zip(examples, ids, strict=True)}

    def needs_rollouts(self) -> bool:
        """Whether the next input needs a new generation batch."""
        return not self.pending

    def sample_ahead(self) -> None:
        """Sample and score the next generation batch into ``pending`` (with
        rl.overlap_rollouts, on its own thread while the trainer trains)."""
        if not self.pending:
            chunks = self._generate()
            self.pending = [c for _ in range(self.rl.num_iterations) for c in chunks]

    def refresh_sampler(self) -> None:
        """Give the rollout engine the trained weights (after an optimizer step or a
        resume, while neither thread computes)."""
        self.engine.sync_weights()

    @property
    def sampled_from(self) -> Any:
        """The torch module whose weights the rollouts were sampled with: the engine's
        own where it samples from one (the torch sampler, or its overlapped copy), else
        the policy, whose weights an engine holding its own copy was synced to."""
        return getattr(self.engine, "model", None) or self.loaded.model

    def make_inputs(self) -> list[PackedBatch]:
        """The next optimizer step's input (sampling a generation batch when none is left)."""
        self.sample_ahead()
        mini = self.pending.pop(0)
        pad = self.loaded.tokenizer.pad_token_id
        batch = pack(mini.sequences, self.capacity, pad, self.loaded.layout, self.share_prompts)
        one_step([batch], mini.loss_denominator(self.rl.steps_per_generation, batch.loss_tokens))
        batch.on_policy = self.on_policy
        batch.info = dict(mini.info)
        batch.samples = list(mini.samples)
        return [batch]

    def _generate(self) -> list[MiniBatch]:
        """Sample, score and split one generation batch into its mini-batches."""
        n = self.rl.num_generations
        per_rank = self.groups * self.rl.steps_per_generation
        examples = _slice(self.stream.take(per_rank * self.ranks), per_rank, self.rank)
        batch = self._agent_batch(examples) if self.agent is not None else None
        if batch is not None:
            repeated, completions, logprobs = batch.prompts, batch.completions, batch.logprobs
            old = self._old(repeated, completions)
        else:
            repeated = [self.prompt_ids[prompt_key(ex)] for ex in examples for _ in range(n)]
            completions, logprobs, old = self._sample(examples, repeated)
        self.generations += 1
        texts = (
            batch.texts
            if batch is not None
            else self.loaded.tokenizer.batch_decode(completions, skip_special_tokens=True)
        )
        scores = self._score(examples, texts, completions, batch.reward_args if batch else None)
        if batch is not None:
            batch.close()  # the rewards have read the environments
        rewards = scores.totals
        advantages, zero_spread = group_advantages(
            rewards, n, self.rl.scale_rewards, estimator=self.rl.advantage_estimator
        )
        masks = batch.masks if batch is not None else [None] * len(completions)
        sequences = [
            Sequence(
                tokens=p + c, prompt_len=len(p), advantage=a, sampler_logprobs=lp, completion_mask=m
            )
            for p, c, a, lp, m in zip(
                repeated, completions, advantages, logprobs, masks, strict=True
            )
        ]
        for seq, values in zip(sequences, old or (), strict=False):
            seq.old_logprobs = values
        size = self.groups * n
        generation_tokens = float(sum(s.loss_tokens for s in sequences))
        minis = [
            self._mini_batch(
                examples[start // n : (start + size) // n],
                sequences[start : start + size],
                texts[start : start + size],
                rewards[start : start + size],
                completions[start : start + size],
                _part(scores, start, start + size),
                zero_spread[start // n : (start + size) // n],
            )
            for start in range(0, len(sequences), size)
        ]
        for mini in minis:
            mini.generation_loss_tokens = generation_tokens
        if batch is not None:
            _with_conversations(minis, batch, n, self.groups)
        return minis

    def _agent_batch(self, examples: list[Example]) -> Any:
        """Multi-turn rollouts of ``examples`` (each ``rl.num_generations`` times), one
        environment each, sampled turn by turn on the rollout engine."""
        from art_hydra.engine.envs.session import agent_rollouts

        repeated = [ex for ex in examples for _ in range(self.rl.num_generations)]

        def sample(engine: Any, requests: list[Request], timeout_s: float | None) -> list[Any]:
            try:
                return engine.generate(requests, self.sampling, self.generator, timeout_s)
            except InvalidDistributionError as exc:
                raise exc.located(self.step, [ex.prompt for ex in repeated]) from None

        timeout = self.timeouts.rollout_s
        return agent_rollouts(self.agent, repeated, self._turn_rules, sample, self.engine, timeout)

    def _turn_rules(self, agent: Any) -> Any:
        from art_hydra.engine.envs.loop import TurnRules

        budget, prompt = self.rl.max_completion_length, self.rl.max_prompt_length
        return TurnRules.of(agent, self.cfg, budget, self.stop_ids, prompt)

    def _old(
        self, prompts: list[list[int]], completions: list[list[int]]
    ) -> list[list[float]] | None:
        """Off-policy steps' old logprobs (None on policy), as :meth:`_sample` takes them."""
        if self.on_policy:
            return None
        with eval_mode(self.sampled_from) as model, self.loaded.compute_precision():
            return self._old_logprobs(model, prompts, completions)

    def _sample(
        self, examples: list[Example], repeated: list[list[int]]
    ) -> tuple[list[list[int]], list[list[float]], list[list[float]] | None]:
        """Completions of the ``repeated`` prompts, their sampler logprobs, and (off
        policy) their old logprobs. Sampled in the precision the trainer computes in (its
        autocast), so the sampler's logprobs differ from the training forward's by
        kernels alone."""
        budget, stops = self.rl.max_completion_length, self.stop_ids
        requests = [Request(tuple(p), budget, stops) for p in repeated]
        try:
            done = self.engine.generate(
                requests, self.sampling, self.generator, timeout_s=self.timeouts.rollout_s
            )
        except InvalidDistributionError as exc:  # name the step and the prompts
            prompts = [ex.prompt for ex in examples for _ in range(self.rl.num_generations)]
            raise exc.located(self.step, prompts) from None
        completions = [c.token_ids for c in done]
        logprobs = [c.logprobs for c in done]
        return completions, logprobs, self._old(repeated, completions)

    def _score(
        self,
        examples: list[Example],
        texts: list[str],
        completions: list[list[int]],
        agent_args: dict[str, list[Any]] | None = None,
    ) -> Scores:
        """The rewards of the generation batch just sampled (``self.generations`` counts
        it); completions no reward applies to are reported, and total 0 as in TRL."""
        n = self.rl.num_generations
        pairs = list(zip((ex for ex in examples for _ in range(n)), texts, strict=True))
        scores = score_rewards(
            self.rewards,
            pairs,
            self.timeouts.reward_s,
            completions,
            global_step=(self.generations - 1) * self.rl.steps_per_generation,
            agent=agent_args,
        )
        if scores.none_all and not self.none_warned:
            self.none_warned = True
            log.warning(
                "%d of %d completions had no reward that applies (every reward returned None): "
                "their total is 0, as in TRL. Said once; later batches are not warned about.",
                scores.none_all,
                len(scores.totals),
            )
        return scores

    @torch.no_grad()
    def _old_logprobs(
        self, model: Any, prompts: list[list[int]], completions: list[list[int]]
    ) -> list[list[float]]:
        """Off-policy steps' old logprobs: each completion's logprobs under the policy
        that sampled it (``model``), from a forward in the trainer's precision over each
        mini-batch packed as the trainer will pack it (TRL computes them so at generation
        time); the later steps' ratios then measure the policy's change alone."""
        size = self.groups * self.rl.num_generations
        pad = self.loaded.tokenizer.pad_token_id
        found: list[list[float]] = []
        for start in range(0, len(prompts), size):
            sequences = [
                Sequence(tokens=p + c, prompt_len=len(p))
                for p, c in zip(
                    prompts[start : start + size], completions[start : start + size], strict=True
                )
            ]
            batch = pack(sequences, self.capacity, pad, self.loaded.layout, self.share_prompts)
            batch.to(self.loaded.device)
            values, _ = packed_logprobs(model, batch, self.sampling)
            found += completion_values(batch, values, sequences)
        return found

    def _mini_batch(
        self,
        examples: list[Example],
        sequences: list[Sequence],
        texts: list[str],
        rewards: list[float],
        completions: list[list[int]],
        per_reward: dict[str, list[float | None]],
        zero_spread: list[bool],
    ) -> MiniBatch:
        """Whole groups of a generation batch (``zero_spread``: which of them have
        rewards all equal, as the advantages found) with the metrics reported for them."""
        n = self.rl.num_generations
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        info = {
            "reward_mean": mean,
            "reward_std": std,
            "zero_std_groups": float(sum(zero_spread)),
            "completion_length": sum(len(c) for c in completions) / len(completions),
            "completions": float(len(completions)),
            **reward_metrics(per_reward),
        }
        shown = min(self.log_completions, len(examples))  # whole groups
        samples = [
            {
                "prompt": examples[g].prompt,
                "reference": examples[g].answer,
                "completions": [
                    {
                        "text": texts[i],
                        "reward": rewards[i],
                        "rewards": {name: values[i] for name, values in per_reward.items()},
                        "advantage": sequences[i].advantage,
                    }
                    for i in range(g * n, (g + 1) * n)
                ],
            }
            for g in range(shown)
        ]
        return MiniBatch(sequences, info, samples)

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The sampler's random state (tensors), and the data position and the rest of the
        current generation batch (JSON-able)."""
        plain = {
            "stream": self.stream.state(),
            "pending": [m.to_json() for m in self.pending],
            "generations": self.generations,
        }
        return {"sampler": self.generator.get_state().cpu()}, plain

    def load_state_dict(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        self.generator.set_state(tensors["sampler"].to(self.generator.device))
        self.stream.load_state(state["stream"])
        self.pending = [MiniBatch.from_json(m) for m in state["pending"]]
        self.generations = state["generations"]


def agent_reward() -> list[Any]:
    """An environment's ``get_reward()`` as one more reward, named ``environment``."""
    from art_hydra.engine.envs.session import ENV_REWARD, environment_reward
    from art_hydra.tasks.reward_set import RewardSpec
    from art_hydra.tasks.scoring import bind

    spec = RewardSpec("task.environment._target_", "get_reward()", 1.0, ENV_REWARD)
    return [bind(environment_reward, spec)]


def _with_conversations(minis: list[MiniBatch], batch: Any, n: int, groups: int) -> None:
    """Give each mini-batch its trajectories' agent metrics, and each logged completion
    its conversation (OpenAI chat shape) in completions.jsonl."""
    size = groups * n
    for number, mini in enumerate(minis):
        mini.info.update(batch.info(number * size, (number + 1) * size))
        for g, sample in enumerate(mini.samples):
            for i, completion in enumerate(sample["completions"]):
                index = number * size + g * n + i
                completion["messages"] = batch.conversations[index]


class RolloutsAhead:
    """rl.overlap_rollouts: the next generation batch is sampled on a thread of its own
    (on the producer's copy of the policy) while the trainer's thread trains on the
    current one; each side gets half the cores, so their OpenMP teams do not compete."""

    def __init__(self, producer: RLProducer, threads: int, timeout_s: float) -> None:
        self.producer, self.threads, self.timeout_s = producer, threads, timeout_s
        self._thread: Any = None
        self._error: BaseException | None = None

    def start(self) -> None:
        from art_hydra import workers

        self._error = None

        def work() -> None:
            torch.set_num_threads(self.threads)
            try:
                self.producer.sample_ahead()
            except BaseException as exc:  # re-raised in the run's thread by wait()
                self._error = exc

        self._thread = workers.start(work, "rollouts")

    def wait(self) -> None:
        """Wait for the batch being sampled (at most ``timeout_s``); its error is raised."""
        if self._thread is None:
            return
        self._thread.join(self.timeout_s)
        if self._thread.is_alive():
            raise StallError(
                f"sampling the next generation batch did not finish within "
                f"{self.timeout_s:g}s (timeouts.rollout_s + timeouts.reward_s)"
            )
        self._thread = None
        if self._error is not None:
            raise self._error


class SFTProducer:
    """Packs (prompt, answer) examples; one input per accumulation micro-batch."""

    def __init__(self, loaded: Any, task: Task, cfg: RunConfig, world: World | None = None) -> None:
        """``cfg`` is the run's validated config: the producer reads its ``sft`` and
        ``producer`` sections, the examples per micro-batch and micro-batches per step
        (``trainer.per_device_train_batch_size``, ``trainer.gradient_accumulation_steps``),
        ``model.max_seq_length`` and ``seed``."""
        sft_cfg, producer_cfg = cfg.sft, cfg.producer
        missing = [ex.prompt for ex in task.examples if ex.answer is None]
        if missing:
            raise TaskDataError(
                f"SFT trains on reference answers, but {len(missing)} example(s) of task "
                f"{task.name!r} have none (first prompt: {missing[0]!r})"
            )
        self.loaded = loaded
        self.task = task
        self.rank, self.ranks = (world.rank, world.size) if world is not None else (0, 1)
        self.sft = sft_cfg
        self.log_completions = producer_cfg.log_completions
        self.batch_size = cfg.trainer.per_device_train_batch_size
        self.accumulation = cfg.trainer.gradient_accumulation_steps
        self.capacity = sft_row_capacity(cfg)
        self.share_prompts = producer_cfg.share_prompts
        self.stream = ExampleStream(task.examples, cfg.seed, producer_cfg.shuffle)
        self.sequences = {ex: self._sequence(ex) for ex in task.examples}
        longest = max(len(s.tokens) for s in self.sequences.values())
        if longest > sft_cfg.max_length:
            count = sum(len(s.tokens) > sft_cfg.max_length for s in self.sequences.values())
            # Cutting would drop the answer and train on prompt tokens as if they were it.
            raise TaskDataError(
                f"{count} example(s) are longer than sft.max_length={sft_cfg.max_length} tokens "
                f"(prompt + answer + EOS, the longest {longest}); set sft.max_length={longest} "
                "(and model.max_seq_length to fit) or shorten the examples"
            )

    def _sequence(self, example: Example) -> Sequence:
        """Prompt (templated as at sampling: a conversation's turns before the trained
        one, with the generation prompt) + answer + EOS; only the answer and EOS are
        trained on under sft.completion_only_loss (assistant-only loss for ``messages``
        data: its last assistant turn)."""
        tok = self.loaded.tokenizer
        train_prompt = not self.sft.completion_only_loss
        if example.conversation:  # every assistant turn trains, tool calls included
            from art_hydra.engine.conversation import example_sequence

            return example_sequence(tok, example, self.task.tool_schemas, train_prompt)
        prompt = encode_prompt(tok, example)
        return answer_sequence(tok, prompt, example.answer or "", train_prompt)

    def make_inputs(self) -> list[PackedBatch]:
        pad = self.loaded.tokenizer.pad_token_id
        rows = [
            _slice(self.stream.take(self.batch_size * self.ranks), self.batch_size, self.rank)
            for _ in range(self.accumulation)
        ]
        micro = [
            pack(
                [self.sequences[ex] for ex in examples],
                self.capacity,
                pad,
                self.loaded.layout,
                self.share_prompts,
            )
            for examples in rows
        ]
        one_step(micro)
        # The step's first rows as samples (completions.jsonl): what it trained on.
        trained = [ex for examples in rows for ex in examples][: self.log_completions]
        micro[0].samples = [{"prompt": ex.prompt, "reference": ex.answer} for ex in trained]
        return micro

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The data position (SFT samples nothing, so it has no random state)."""
        return {}, {"stream": self.stream.state()}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        self.stream.load_state(state["stream"])
