"""One run in its locked folder, as a recipe read top to bottom: set up (small
``_setup_*`` builders, resuming where asked), train (the loop), save, close, clean up.

:mod:`art_hydra.run` checks a config and takes the run folder's lock;
:func:`train_in_folder` then runs the recipe there. Heavy libraries (torch,
transformers, peft) are imported inside the functions that need them.

The run's config goes by two names here, each always the same type: ``config`` is the
DictConfig (only where it is written or compared as YAML), ``run`` the same config as
dataclass objects (:class:`RunConfig`, for everything the run reads).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from art_hydra.config import run_files
from art_hydra.config.objective import NOT_IN_SFT
from art_hydra.config.schema import AlgorithmName, ModelSource, RunConfig
from art_hydra.config.secrets import redacted_overrides
from art_hydra.config.typed import typed_config
from art_hydra.engine.result import (
    DONE,
    FAILED,
    INTERRUPTED,
    JobRecord,
    hparams_of,
    objective_value,
)
from art_hydra.errors import Interrupted, ResumeError, WriteError
from art_hydra.runs.run_messages import in_log_files, restart_command, resume_hint, stopped_message

if TYPE_CHECKING:
    from art_hydra.tasks.examples import Example

log = logging.getLogger("art_hydra")


@dataclass(frozen=True)
class RunParts:
    """What :func:`build_run_parts` makes: the trainer, the producer, and the evaluation's
    data, which the recipe hands to the evaluator itself (the producer never holds it)."""

    trainer: Any
    producer: Any
    #: Evaluation's prompts, split off the task's (``eval.fraction``) or read
    #: (``eval.path``); none with evaluation off.
    eval_examples: list[Example]
    #: The task's rewards, which score the evaluation's completions as they score rollouts.
    eval_rewards: list[Any]
    #: What generates (rollout.engine): the producer's rollouts and RL evaluation's
    #: completions; None for SFT, whose evaluation samples with the torch sampler.
    engine: Any = None


def build_run_parts(
    config: DictConfig, world: Any = None, loaded: Any = None, run: RunConfig | None = None
) -> RunParts:
    """Task, model, trainer, producer and evaluation data for a validated config;
    ``world`` is this rank's place among several (None: a single process); ``loaded``
    a model already loaded for ``config.model`` (None: load it); ``run``: ``config`` as
    dataclass objects (None: made here), whose sections the trainer and producer take.
    The task and the held-out split still read ``config`` itself."""
    from art_hydra.engine.backends import load_model
    from art_hydra.engine.producer import RLProducer, SFTProducer
    from art_hydra.engine.rl.sampling import SamplingSettings, suppressed_ids
    from art_hydra.engine.rollout.base import build_rollout_engine
    from art_hydra.engine.trainer import Trainer, TrainingLoss
    from art_hydra.tasks import build_task
    from art_hydra.tasks.held_out import eval_examples

    task = build_task(config)
    # Evaluation's prompts are split off (eval.fraction) or read (eval.path) first: the
    # tiny model's vocabulary covers them too, and the producer never sees them.
    train, held = eval_examples(config, task.examples)
    charset = task.charset() if not held else replace(task, examples=task.examples + held).charset()
    task = replace(task, examples=train)
    run = run if run is not None else typed_config(config)
    derived = run.model.max_seq_length is None
    settle_max_seq_length(run)
    if loaded is None:
        loaded = load_model(run.model, run.backend, run.seed, charset=charset)
    if derived:  # a hub id downloaded at load: its positions are known only now
        settle_max_seq_length(run, getattr(loaded.model, "config", None))
    if run.algorithm.name == AlgorithmName.sft:
        task = replace(task, tool_schemas=agent_schemas(config))
        trainer = Trainer(loaded, run.trainer, TrainingLoss.for_sft(), world)
        return RunParts(trainer, SFTProducer(loaded, task, run, world), held, task.rewards)
    # One settings object for rollouts and training logprobs: they must never differ.
    sampling = SamplingSettings.from_config(run.rl, suppressed_ids(loaded.tokenizer))
    trainer = Trainer(loaded, run.trainer, TrainingLoss.for_rl(run.rl, sampling), world)
    engine = build_rollout_engine(loaded, run, world)
    agent = build_agent(config, loaded)
    task = replace(task, tool_schemas=agent.schemas if agent is not None else None)
    producer = RLProducer(loaded, task, run, sampling, world, engine, agent)
    return RunParts(trainer, producer, held, producer.rewards, engine)


def build_agent(config: DictConfig, loaded: Any) -> Any:
    """The run's agent (task.environment, task.tools) over the loaded tokenizer; None
    for single-turn tasks."""
    from art_hydra.engine.envs.session import Agent
    from art_hydra.tasks.agent_code import environment_kwargs, resolve_agent_code, uses_agent_code

    task_cfg = config.task
    if not uses_agent_code(task_cfg):
        return None
    env_class, functions = resolve_agent_code(task_cfg)
    kwargs = environment_kwargs(task_cfg)
    return Agent(env_class, kwargs, functions, loaded.tokenizer, str(task_cfg.tool_parser))


def agent_schemas(config: DictConfig) -> list[dict[str, Any]] | None:
    """The task's tools' schemas (task.environment's methods, task.tools) without an
    agent: what SFT renders its conversations with; None without tools."""
    from art_hydra.engine.envs.session import tool_schemas
    from art_hydra.engine.envs.tools import function_tools
    from art_hydra.tasks.agent_code import resolve_agent_code, uses_agent_code

    if not uses_agent_code(config.task):
        return None
    env_class, functions = resolve_agent_code(config.task)
    return tool_schemas(env_class, function_tools(functions)) or None


def settle_max_seq_length(run: RunConfig, loaded_config: Any = None) -> None:
    """``model.max_seq_length=null`` made the value the run uses, before anything reads
    it: :func:`~art_hydra.config.validators.derived_max_seq_length` over the positions of
    the folder's (or the cached hub snapshot's) config.json, as the world pre-flight
    derived it; ``loaded_config``, a loaded model's config, can only cut it further (a
    hub id that was not cached when the run began)."""
    from art_hydra import model_files
    from art_hydra.config.validators import derived_max_seq_length

    model = run.model
    if model.max_seq_length is None:
        positions = None
        if model.source == ModelSource.pretrained:
            positions = model_files.model_positions(str(model.name), model.revision)
            if positions is None:
                positions = _hub_positions(str(model.name), model.revision)
        model.max_seq_length = derived_max_seq_length(run, positions)
    elif loaded_config is not None and hasattr(loaded_config, "to_dict"):
        found = model_files.position_limit(loaded_config.to_dict())
        if found is not None and found[1] < model.max_seq_length:
            model.max_seq_length = found[1]


def _hub_positions(name: str, revision: str | None) -> int | None:
    """The positions of a hub id not yet downloaded, from its config.json alone (the load
    fetches it first anyway): a backend that sizes the model by the length it is given
    (Unsloth scales RoPE past the positions) then loads with the derived one. None where
    it cannot be fetched (offline): the load decides. Never runs a model's own code."""
    from transformers import AutoConfig

    from art_hydra import model_files

    try:
        config = AutoConfig.from_pretrained(name, revision=revision, trust_remote_code=False)
    except Exception:
        return None
    found = model_files.position_limit(config.to_dict())
    return found[1] if found else None


def build_trainer_and_producer(
    config: DictConfig, world: Any = None, loaded: Any = None, run: RunConfig | None = None
) -> tuple[Any, Any]:
    """The trainer and the producer of :func:`build_run_parts`, for what drives them
    without evaluating (bench/, the engine's tests)."""
    parts = build_run_parts(config, world, loaded, run)
    return parts.trainer, parts.producer


def parameter_counts(model: Any) -> tuple[int, int]:
    """Trainable and total parameters of ``model`` (shared tensors, such as tied
    embeddings, counted once; a 4-bit weight counts its packed elements)."""
    trainable = total = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


def parameter_line(run: RunConfig, model: Any) -> str:
    """The start-up line that says what trains: a LoRA run that trains a whole head, or
    a full run of a model much larger than meant, shows here before the first step."""
    trainable, total = parameter_counts(model)
    share = 100.0 * trainable / total if total else 0.0
    how = run.model.finetune.name
    return (
        f"model {run.model.name} ({run.model.source.name}, finetune={how}): "
        f"{trainable:,} trainable of {total:,} parameters ({share:.2f}%)"
    )


class _ProducerStates:
    """The producers' states of every rank as one component of a checkpoint: rank 0
    writes them all (``gathered`` by the rank coordinator before each save); on resume
    each rank takes back its own. One process (nothing gathered): its producer's state
    as it is."""

    def __init__(self, producer: Any, world: Any, gathered: list[Any] | None = None) -> None:
        self.producer, self.world, self.gathered = producer, world, gathered

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.gathered is None:
            return self.producer.state_dict()
        tensors = {
            f"rank{rank}.{name}": tensor
            for rank, (rank_tensors, _) in enumerate(self.gathered)
            for name, tensor in rank_tensors.items()
        }
        return tensors, {"ranks": [plain for _, plain in self.gathered]}

    def load_state_dict(self, tensors: dict[str, Any], plain: dict[str, Any]) -> None:
        saved = len(plain["ranks"]) if "ranks" in plain else 1
        if saved != self.world.size:
            raise ResumeError(
                f"the checkpoint was written by a run of {saved} rank(s), and this run has "
                f"{self.world.size}: each rank resumes its own sampler state and data "
                f"position, so resume with {saved} rank(s) "
                + (f"(torchrun --nproc_per_node={saved} ...)" if saved > 1 else "(no torchrun)")
            )
        if saved == 1:
            self.producer.load_state_dict(tensors, plain)
            return
        prefix = f"rank{self.world.rank}."
        own = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        self.producer.load_state_dict(own, plain["ranks"][self.world.rank])


def train_in_folder(
    config: DictConfig,
    run_dir: Path,
    stop: Any,
    world: Any,
    record: JobRecord | None,
    run: RunConfig,
) -> dict[str, Any]:
    """The run in its locked folder, as a recipe: set up (resuming where asked), train,
    close the channel and the record whatever happened, then clean up (a stop's report,
    or the finished run's summary). ``run``: ``config`` as dataclass objects, made once by
    the caller. A secret's value never reaches the log (:mod:`art_hydra.config.secrets`)."""
    from art_hydra.config.secrets import scrubbing_logs

    with scrubbing_logs(), _threads_kept():
        recipe = TrainingRecipe(config, run_dir, stop, world, record, run)
        recipe.setup()
        try:
            recipe.train()
        except Exception as exc:
            # A step that fails after a stop request (a reward past its bound): the stop
            # still keeps the last finished step. One process only: ranks share no snapshot.
            if not stop.requested or not recipe.ranks.keeps_last_step:
                raise
            recipe.failure = exc
        finally:
            recipe.close()
        return recipe.cleanup()


@contextlib.contextmanager
def _threads_kept() -> Iterator[None]:
    """torch's thread count as the caller had it, after the run: ``backend.cpu_threads``
    and the overlapped sampler size it for the run only, and a Python caller's later work
    (another run included: the count orders float sums) sees its own again."""
    import torch

    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class TrainingRecipe:
    """One run in its locked folder, in the shape of torchtune's recipes: :meth:`setup`
    (small ``_setup_*`` builders, and :meth:`resume` where the run resumes), :meth:`train`
    (the loop), :meth:`save` (a checkpoint), :meth:`close` (channel and record) and
    :meth:`cleanup` (what a stop kept, or the summary).

    Whatever spans the ranks goes through ``self.ranks``, the run's rank coordinator
    (:mod:`art_hydra.engine.ranks`): a single process's does nothing, so the loop has no rank
    branches; ``ranks.writes_records`` names the one process that writes the folder."""

    def __init__(
        self,
        config: DictConfig,
        run_dir: Path,
        stop: Any,
        world: Any,
        record: JobRecord | None,
        run: RunConfig,
    ) -> None:
        from art_hydra.engine.ranks import coordinator_for

        #: The run's config as the DictConfig, only where it is written or compared as
        #: YAML or its expressions count: run_config.yaml, the identity, resume, the
        #: trackers' config, the secrets notice (and the stop message, which takes it).
        self.config = config
        #: The same config as dataclass objects (:class:`RunConfig`): everything else
        #: reads its sections from here.
        self.run = run
        self.run_dir, self.world, self.record = run_dir, world, record
        self.stop = stop  # the signals' stop request (interrupts.StopRequest)
        self.sample_and_score_s = _sample_and_score_s(run)
        self.ranks = coordinator_for(
            world, run.distributed.timeout_s, self.sample_and_score_s, run.timeouts.checkpoint_s
        )
        self.start_step = 0
        #: The step the latest checkpoint of this run holds (None: none yet).
        self.saved_step: int | None = None
        #: The last step's metric line (over every rank).
        self.last: dict[str, Any] = {}
        # The producer's and the process's random states after the last finished step that
        # no checkpoint holds: after a stop request a failing step can still save that step.
        self.finished: _LastStep | None = None
        self.handed = False  # whether the step in progress has given the trainer its inputs
        #: A step's failure after a stop request, kept: the run reports it as it stops.
        self.failure: Exception | None = None
        #: Whether the run trained all its steps (set by :meth:`close`).
        self.complete = False
        self.ahead: Any = None  # the next step's rollouts, sampled while a step trains

    # ---- setup ---------------------------------------------------------------------

    def setup(self) -> None:
        """Everything the loop needs, in order; a resumed run loads its checkpoint before
        its records and metrics open (they continue from its step)."""
        from art_hydra.runs import run_folder

        self._setup_process()
        parts = self._setup_trainer_and_producer()
        self._setup_evaluator(parts)
        self._setup_checkpoints()
        # resume=true, or resume=auto where the run has a checkpoint (auto clears the records
        # of a run that ended before its first checkpoint, under this lock, and starts afresh).
        resuming = run_folder.start_resumed(
            self.config, self.run_dir, clear=self.ranks.writes_records
        )
        if resuming:
            self.resume()
        self._setup_records(resuming)
        self._setup_metrics(resuming)
        self._setup_channel()
        self._setup_rollouts_ahead()

    def _setup_process(self) -> None:
        _prepare_process(self.run, self.ranks.writes_records)

    def _setup_trainer_and_producer(self) -> RunParts:
        """The trainer and the producer; the evaluation's data comes back with them, for
        :meth:`_setup_evaluator` alone."""
        parts = build_run_parts(self.config, self.world, run=self.run)
        self.trainer, self.producer = parts.trainer, parts.producer
        _log_what_trains(self.run, self.ranks, self.trainer, self.producer)
        if self.ranks.writes_records:
            from art_hydra.config.secrets import notice

            hidden = notice(self.config)  # one line, whatever the number of keys
            if hidden:
                log.info("%s", hidden)
        return parts

    def _setup_evaluator(self, parts: RunParts) -> None:
        from art_hydra.engine.evaluation import Evaluator

        self.evaluator = Evaluator.for_run(
            self.run,
            self.trainer.loaded,
            parts.eval_examples,
            parts.eval_rewards,
            self.world,
            parts.engine,
            getattr(parts.producer, "agent", None),
        )
        if self.evaluator is not None:
            log.info("%s", self.evaluator.describe())

    def _setup_checkpoints(self) -> None:
        from art_hydra.runs.checkpoint import Checkpointer

        # One process saves the producer's own state; the ranks save theirs together. Both
        # load through _ProducerStates, which refuses a checkpoint of another number of ranks.
        self.producer_states = _ProducerStates(self.producer, self.world)
        self.components = {"trainer": self.trainer, "producer": self.producer_states}
        self.checkpoints = Checkpointer(
            self.run_dir, self.run.checkpoint, self.run.timeouts.checkpoint_s
        )

    def _setup_records(self, resuming: bool) -> None:
        """The run config and identity (rank 0), and what a stop before the first
        checkpoint removes again."""
        from art_hydra.runs import run_folder, run_identity

        # What this invocation adds to the folder: removed again if it stops before its
        # first checkpoint, so the printed command can start the run afresh there.
        self.records = _FreshRecords(self.run_dir, fresh=not resuming and self.ranks.writes_records)
        self.stop.before_exit = self._forget_unsaved
        if self.ranks.writes_records:
            run_folder.write_run_config(self.run_dir, self.config)
            run_identity.record(self.config, self.run_dir)

    def _forget_unsaved(self) -> str:
        """A second signal before any checkpoint: leave the folder restartable."""
        if self.saved_step is not None or self.checkpoints.complete() or not self.records.forget():
            return ""
        return (
            "art_hydra: no checkpoint was written; the run's records were removed, so the "
            f"same command starts it afresh:\n  {restart_command(self.run_dir, self.world.size)}\n"
        )

    def _setup_metrics(self, resuming: bool) -> None:
        resume_step = self.start_step if resuming else None
        self.metrics = _metrics_log(
            self.config, self.run, self.run_dir, self.ranks.writes_records, resume_step
        )

    def _setup_channel(self) -> None:
        from art_hydra.engine.queue import StepChannel

        run, trainer = self.run, self.trainer
        self.channel = StepChannel(run.queue, trainer.train_step, run.timeouts.step_s)

    def _setup_rollouts_ahead(self) -> None:
        """With rl.overlap_rollouts, the sampler makes the next step's rollouts while a
        step trains."""
        if self.run.algorithm.name != AlgorithmName.rl or not self.run.rl.overlap_rollouts:
            return
        import torch

        from art_hydra.engine.producer import RolloutsAhead

        # Sampling and training run at once: half the cores each.
        threads = max(1, torch.get_num_threads() // 2)
        self.channel.run_on_trainer_thread(
            lambda: torch.set_num_threads(threads), "sizing its threads", self.sample_and_score_s
        )
        self.ahead = RolloutsAhead(self.producer, threads, self.sample_and_score_s)

    def resume(self) -> None:
        """Load the latest intact checkpoint into the trainer and the producers' states
        and note the resume in the run folder; the run goes on after its step."""
        from art_hydra.runs import run_folder

        config, checkpoints = self.config, self.checkpoints
        latest, skipped = checkpoints.latest()
        for reason in skipped:
            log.warning("skipped a checkpoint that does not verify: %s", reason)
        if latest is None:
            raise ResumeError(
                f"resume={config.resume} but {checkpoints.root} holds no intact checkpoint; "
                f"point {run_folder.folder_key()} at the run to resume, or drop resume=true"
            )
        start_step = checkpoints.load(latest, self.components, self.trainer.loaded)
        if self.run.algorithm.name == AlgorithmName.rl:
            self.producer.refresh_sampler()  # the sampler samples from the weights resumed
        log.info("resumed from %s (step %d)", latest, start_step)
        saved = run_folder.saved_config(self.run_dir)
        from art_hydra.config.secrets import for_comparison

        # Expressions compared, never the values they read (a rotated token resumes).
        changed = run_folder.differences(saved, for_comparison(config)) if saved is not None else []
        if self.ranks.writes_records:
            run_folder.record_resume(self.run_dir, start_step, changed)
        if self.record is not None:
            self.record.steps = start_step
        self.start_step = self.saved_step = start_step

    # ---- the loop ------------------------------------------------------------------

    def train(self) -> None:
        """The optional warmup pass, then one optimizer step a turn up to
        ``trainer.max_steps``; a stop ends the loop after a checkpoint of its step."""
        run, ranks, stop = self.run, self.ranks, self.stop
        if self.start_step == 0 and run.algorithm.name == AlgorithmName.rl:
            self._sft_warm_start()  # a new run only: a resumed one has it in its weights
        if run.trainer.warmup_pass and self.start_step == 0:
            self._warmup()
        for step in range(self.start_step + 1, run.trainer.max_steps + 1):
            if ranks.stopping(stop):
                break
            self.handed = False
            started = time.perf_counter()
            inputs = self._make_inputs(step)
            result = self._train_step(step, inputs)
            measured = _step_metrics(result, time.perf_counter() - started)
            self.last = ranks.combine(result, measured, stop)
            eval_samples = self._evaluate(step)  # where due; its eval/* keys join the line
            self._record_step(step, inputs[0].samples, eval_samples)
            if self.checkpoints.due(step, run.trainer.max_steps) or ranks.stopping(stop):
                self.save(step)
            elif ranks.keeps_last_step:
                self.finished = _LastStep.take(step, self.producer)
        if ranks.stopping(stop) and self.trainer.step > 0 and self.saved_step != self.trainer.step:
            self.save(self.trainer.step)  # the signal came between the step's check and the next

    def _sft_warm_start(self) -> None:
        """``rl.sft_warm_start_steps``: SFT on the task's demonstrations before the first
        RL step (:mod:`art_hydra.engine.warm_start`), on the trainer's thread; the sampler
        then samples from the warm-started weights."""
        steps = self.run.rl.sft_warm_start_steps
        if not steps:
            return
        from art_hydra.engine.warm_start import warm_start

        trainer, producer = self.trainer, self.producer
        found = self.channel.run_on_trainer_thread(
            lambda: warm_start(trainer.loaded, producer.task, self.run, self.world),
            f"the SFT warm start ({steps} steps)",
            steps * self.run.timeouts.step_s,
        )
        trainer.anchor_reference()  # rl.beta's KL anchors to the warm-started policy
        producer.refresh_sampler()
        log.info("SFT warm start done: %s", ", ".join(f"{k} {v:.4f}" for k, v in found.items()))

    def _warmup(self) -> None:
        """``trainer.warmup_pass``: one input through the trainer that changes no weight."""
        from art_hydra.engine.queue import StepWork

        channel = self.channel
        _sampling_for(self.producer, 0)
        first = channel.run_on_trainer_thread(
            self.producer.make_inputs, "making the warmup input", self.sample_and_score_s
        )[0]
        self.ranks.inputs_barrier("waiting for the other ranks' warmup inputs")
        channel.put(StepWork([first], warmup=True))
        channel.result(step=0)

    def _make_inputs(self, step: int) -> list[Any]:
        """The step's inputs, made on the trainer's thread (all torch work runs there),
        with the loss denominator over every rank."""
        _sampling_for(self.producer, step)
        inputs = self.channel.run_on_trainer_thread(
            self.producer.make_inputs, f"making the inputs of step {step}", self.sample_and_score_s
        )
        self.ranks.inputs_barrier(f"waiting for the other ranks' inputs of step {step}")
        self.ranks.normalise(inputs)
        return inputs

    def _train_step(self, step: int, inputs: list[Any]) -> Any:
        """Hand the trainer the step's inputs and wait for its one result (the next
        step's rollouts, with rl.overlap_rollouts, sampled meanwhile)."""
        from art_hydra.engine.queue import StepWork

        channel, producer, ahead = self.channel, self.producer, self.ahead
        self.handed = True
        channel.put(StepWork(inputs))
        if ahead is not None and producer.needs_rollouts():
            _sampling_for(producer, step + 1)
            ahead.start()  # the next batch, on the sampler, while this one trains
        result = channel.result(step)
        if ahead is not None:
            ahead.wait()
        if self.run.algorithm.name == AlgorithmName.rl:
            producer.refresh_sampler()  # the next rollouts sample from this step's weights
        return result

    def _evaluate(self, step: int) -> list[dict[str, Any]]:
        """Evaluation where it is due: its eval/* keys join the step's metric line; the
        samples it returns go to the eval completions."""
        if self.evaluator is None or not self.evaluator.due(step):
            return []
        with self.channel.producer_phase(f"evaluating at step {step}"):
            found, eval_samples = self.evaluator.evaluate(step)
        self.last.update(found)
        return eval_samples

    def _record_step(self, step: int, samples: Any, eval_samples: list[dict[str, Any]]) -> None:
        """The step's metric line and samples into the run's record; a failed write (a
        full disk) stops the run saying what to resume from."""
        try:
            self.metrics.log(self.last)
            self.metrics.log_samples(step, samples)
            if eval_samples:
                self.metrics.log_eval_samples(step, eval_samples)
        except OSError as exc:
            raise WriteError(
                f"writing the run's record failed at step {step}: {exc}. "
                + resume_hint(self.run_dir, self.saved_step)
            ) from exc
        if self.record is not None:
            self.record.steps = step

    def save(self, step: int) -> None:
        """Write checkpoint ``step``: the ranks' producer states (and a sharded model's
        weights and optimizer moments, whole) gathered to rank 0, which writes it; every
        rank then waits for that write (a declared phase, so the trainer's wait for an
        input does not run out meanwhile)."""
        with self.channel.producer_phase(f"writing checkpoint step {step}"):
            self.producer_states.gathered = self.ranks.gather_producer_states(self.producer)
            weights = self.trainer.gather_checkpoint()
            if self.ranks.writes_records:
                self.checkpoints.save(step, self.components, weights)
            self.ranks.checkpoint_barrier(step)
        self.saved_step = step

    # ---- the end -------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel and the run's record, also while the loop raises: the record
        ends with the run's state (done, interrupted or failed)."""
        self.channel.close()
        engine = getattr(self.producer, "engine", None)
        if engine is not None:
            engine.close()
        raising = sys.exc_info()[0] is not None
        # A stop that came after the last step stopped nothing: the run is finished.
        self.complete = self.trainer.step >= self.run.trainer.max_steps and not raising
        stopped = self.stop.requested and not (self.complete and self.failure is None)
        _log_hparams(self.metrics, self.record, stopped)
        failing = raising or self.failure is not None
        self.metrics.close(INTERRUPTED if stopped else FAILED if failing else DONE)

    def cleanup(self) -> dict[str, Any]:
        """After the loop: save the last finished step a failing step left behind, then
        report a stop (``Interrupted``, with the command that carries on) or return the
        finished run's summary."""
        stop, trainer = self.stop, self.trainer
        if _can_keep(self.failure, self.finished, self.handed, trainer.step, self.saved_step):
            assert self.finished is not None
            self.finished.save(self.checkpoints, trainer)
            self.saved_step = trainer.step
        if self.complete and self.failure is None and self.ranks.stopping(stop):
            log.info(
                "%s came after the last step (%d of %d): the run is finished",
                stop.name,
                trainer.step,
                self.run.trainer.max_steps,
            )
        elif self.ranks.stopping(stop) or self.failure is not None:
            if self.saved_step is None and self.records.forget():
                log.info(
                    "no checkpoint was written: removed this run's records from %s", self.run_dir
                )
            message = stopped_message(
                self.config, self.run_dir, stop.name, self.saved_step, self.world.size, self.failure
            )
            raise Interrupted(in_log_files(message), stop.exit_code) from self.failure
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """A finished run's summary (the plot drawn on rank 0), and its closing lines: the
        result and the commands to try the model."""
        from art_hydra.engine.metrics import plot_curve

        run, run_dir, last, writes = self.run, self.run_dir, self.last, self.ranks.writes_records
        is_rl = run.algorithm.name == AlgorithmName.rl
        plot = (
            plot_curve(
                run_dir,
                "reward_mean" if is_rl else "loss",
                run_files.REWARD_PLOT if is_rl else run_files.LOSS_PLOT,
            )
            if run.logging.plot and writes
            else None
        )
        summary = {
            "run_dir": str(run_dir),
            "steps": self.trainer.step,
            # As its metric line holds it: an SFT run's summary has no RL keys held as None.
            "final": {k: v for k, v in last.items() if is_rl or k not in NOT_IN_SFT},
            "plot": str(plot) if plot else None,
            "status": DONE,
            "objective": self.record.spec.as_dict() if self.record is not None else None,
        }
        if last and writes:
            self._closing_lines(is_rl)
        return summary

    def _closing_lines(self, is_rl: bool) -> None:
        """The result (also closing art_hydra.log) and the commands to try the model."""
        from art_hydra.runs.run_messages import try_commands

        last, evaluator = self.last, self.evaluator
        shown = f"reward {last['reward_mean']:.3f}" if is_rl else f"loss {last['loss']:.4f}"
        if evaluator is not None and evaluator.last:
            shown += f", {evaluator.summary()}"
        done = f"art_hydra: {self.trainer.step} steps, final {shown}; outputs in {self.run_dir}"
        print(in_log_files(done, logging.INFO))  # the result closes art_hydra.log too
        print(try_commands(self.run_dir, self.producer.stream.examples))


def _prepare_process(run: RunConfig, main: bool) -> None:
    """Process-wide settings before the model loads: quiet library logs, torch's thread
    count (and a warning for a busy CPU, on the ``main`` process), every generator seeded."""
    import random

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bar, and quiet logs
    if main:  # once per run: a busy CPU with torch's default thread count
        from art_hydra.engine.backends.torch_backend import resolve_device
        from art_hydra.engine.cpu_load import warn_if_busy

        warn_if_busy(resolve_device(run.backend.device).type, run.backend.cpu_threads)
    if run.backend.cpu_threads is not None:
        # Before the trainer's thread starts: it takes this count at its first torch op.
        torch.set_num_threads(run.backend.cpu_threads)
    # Fresh runs start every process-wide generator from the seed (a reward may draw from
    # Python's or NumPy's); a resume then restores them from the checkpoint.
    random.seed(run.seed)
    _seed_numpy(run.seed)
    torch.manual_seed(run.seed)


def _log_what_trains(run: RunConfig, ranks: Any, trainer: Any, producer: Any) -> None:
    """What trains, where, on what, how: in plain words (rank 0); the other ranks log
    their parameter line."""
    import torch

    if ranks.writes_records:
        from art_hydra.runs.start_summary import log_start_summary

        parameters = parameter_line(run, trainer.model)
        threads = torch.get_num_threads()
        size = ranks.world.size
        log_start_summary(run, trainer.loaded, producer.task, parameters, size, threads)
        sharding = trainer.loaded.sharding
        if sharding is not None:
            log.info("%s", sharding.describe(size))
        engine = getattr(producer, "engine", None)
        if engine is not None and (run.rollout.engine != "torch" or sharding is not None):
            log.info("%s", engine.describe())
    else:
        log.info("%s", parameter_line(run, trainer.model))


def _metrics_log(
    config: DictConfig, run: RunConfig, run_dir: Path, writes: bool, resume_step: int | None
) -> Any:
    """Rank 0 alone (``writes``) writes the run's record; the others measure and report
    to it. The trackers get ``config`` itself (their config is the resolved DictConfig)."""
    from art_hydra.engine.metrics import MetricsLog

    if not writes:
        return NoRecord()
    return MetricsLog(
        run_dir,
        run.logging,
        run.trainer.max_steps,
        resume_step=resume_step,
        algorithm=run.algorithm.name,
        config=config,
    )


def _sample_and_score_s(run: RunConfig) -> float:
    """The bound on making a step's inputs: sampling and scoring are each bounded
    inside (``timeouts.rollout_s``, ``timeouts.reward_s``); this bounds the whole."""
    return run.timeouts.rollout_s + run.timeouts.reward_s


def _log_hparams(metrics: Any, record: JobRecord | None, stopped: bool) -> None:
    """The job's overrides and objective as TensorBoard hparams, also for a run that
    fails or is stopped (its status is one of the hparams). Never raises: the run's own
    outcome matters more than its TensorBoard summary."""
    from art_hydra.engine.metrics import MetricsLog, read_metrics

    if record is None or not isinstance(metrics, MetricsLog):
        return
    failing = sys.exc_info()[0] is not None
    status = INTERRUPTED if stopped else FAILED if failing else DONE
    try:
        rows = read_metrics(record.run_dir)
        value = objective_value(record.spec, rows)
        hparams = {**hparams_of(redacted_overrides(record.overrides)), "status": status}
        step = rows[-1]["step"] if rows else 0
        metrics.log_hparams(hparams, record.spec.metric, value, step)
    except Exception as exc:
        log.warning("could not write the TensorBoard hparams: %s", exc)


class NoRecord:
    """What ranks other than 0 keep instead of the run's record."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        pass

    def track_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        pass

    def log_eval_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        pass

    def close(self, status: str = DONE) -> None:
        pass


def _step_metrics(result: Any, elapsed: float) -> dict[str, Any]:
    """One step's metrics on this rank (its line in the run's record)."""
    return {
        "step": result.step,
        "reward_mean": result.info.get("reward_mean"),
        "reward_std": result.info.get("reward_std"),
        "loss": result.loss,
        "grad_norm": result.grad_norm,
        "learning_rate": result.learning_rate,
        "kl": result.kl,
        "entropy": result.entropy,
        "clip_fraction": result.clip_fraction,
        "zero_std_groups": result.info.get("zero_std_groups"),
        "completion_length": result.info.get("completion_length"),
        "real_token_share": result.real_token_share,
        "tokens_per_s": result.trained_tokens / elapsed,
        "step_time_s": elapsed,
        # The loss's further statistics (token-weighted means, and ``_max`` maxima).
        **result.stats,
        # Each reward's own mean, std and count (reward/<name>/...), next to the total's.
        **{k: v for k, v in result.info.items() if k.startswith("reward/")},
        # Multi-turn tool rollouts: tool calls and turns per trajectory, masked share, ...
        **{k: result.info[k] for k in AGENT_METRICS if k in result.info},
    }


#: The agent metrics a step of multi-turn tool rollouts reports (see
#: :func:`art_hydra.engine.envs.loop.agent_metrics`).
AGENT_METRICS = (
    "tool_calls_mean",
    "turns_mean",
    "masked_token_share",
    "tool_errors",
    "tool_time_s",
)


def _sampling_for(producer: Any, step: int) -> None:
    """Tell an RL producer which optimizer step it samples for (0: the warmup pass), so
    an invalid distribution names it; SFT samples nothing."""
    if hasattr(producer, "step"):
        producer.step = step


def _seed_numpy(seed: int) -> None:
    """Seed NumPy's global generator (when NumPy is installed), which takes 32 bits."""
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)


class _FreshRecords:
    """The run's record files a fresh run creates in its folder, so that a run stopped
    before its first checkpoint can remove them again: the folder then holds no run (the
    pre-flight's test) and the printed command starts it afresh. Files that were there
    before this invocation are never touched."""

    NAMES = (
        run_files.RUN_CONFIG,
        run_files.IDENTITY,
        run_files.METRICS,
        run_files.COMPLETIONS,
        run_files.EVAL_COMPLETIONS,
        run_files.TENSORBOARD,
        run_files.TRACKERS,
    )

    def __init__(self, run_dir: Path, fresh: bool) -> None:
        self.run_dir = run_dir
        self.mine = [n for n in self.NAMES if not (run_dir / n).exists()] if fresh else []

    def forget(self) -> bool:
        """Remove this invocation's records, those the folder's manifest lists as the run's
        own (never through a link); whether anything was removed."""
        from art_hydra.runs.run_folder import remove_records

        return bool(remove_records(self.run_dir, self.mine))


def _can_keep(
    failure: Exception | None,
    finished: _LastStep | None,
    handed: bool,
    trained: int,
    saved: int | None,
) -> bool:
    """Whether a step that failed after a stop request leaves the last finished step to
    save: the failing step gave the trainer nothing (it failed making its inputs: sampling,
    scoring), so the weights and optimizer are still those of the step the snapshot was
    taken after, and no checkpoint holds that step yet."""
    return (
        failure is not None
        and finished is not None
        and not handed
        and finished.step == trained
        and saved != trained
    )


class _LastStep:
    """The producer's state and the process's random states right after a finished step
    that no checkpoint holds (the trainer's own state stays that step's until the next
    step hands it inputs): what a stop followed by a failing step still saves. Taking it
    costs a few small copies per step."""

    def __init__(self, step: int, tensors: dict, plain: dict, rng: dict) -> None:
        self.step, self.tensors, self.plain, self.rng = step, tensors, plain, rng

    @classmethod
    def take(cls, step: int, producer: Any) -> _LastStep:
        from art_hydra.runs.checkpoint import _process_rng

        tensors, plain = producer.state_dict()
        return cls(step, tensors, plain, _process_rng())

    def state_dict(self) -> tuple[dict, dict]:
        """The producer's state as it was (a checkpoint component)."""
        return self.tensors, self.plain

    def save(self, checkpoints: Any, trainer: Any) -> None:
        """Write the checkpoint of this step: the trainer's live state (still this
        step's), the producer's and the process's generators as they were then."""
        from art_hydra.runs.checkpoint import _restore_process_rng

        _restore_process_rng(self.rng)
        checkpoints.save(self.step, {"trainer": trainer, "producer": self}, trainer.loaded)
