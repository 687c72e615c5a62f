"""Built-in validators: rules between fields that the config alone decides.

Single-field limits are declared on the schema (:mod:`art_hydra.config.bounds`); what
files and the environment decide is the world pre-flight's. Each rule here reads a few
keys of the resolved config and yields a :class:`Problem` naming the key, the value,
why the run cannot work (error) or probably does not do what was meant (warning), and
the overrides that fix it. They run on every config that comes into being, so they are
cheap and import nothing heavy.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig

from art_hydra.config import (
    agent_rules,  # noqa: F401  (registers the agent keys' rules)
    distributed_rules,  # noqa: F401  (registers the sharding rules)
    rollout_rules,  # noqa: F401  (registers the engine rules)
    run_files,
)
from art_hydra.config.backends import Backend, backends, get_backend
from art_hydra.config.eval_rules import PREFIX as EVAL_PREFIX  # registers the eval rules
from art_hydra.config.eval_rules import objective_problem as eval_objective_problem
from art_hydra.config.fields import default
from art_hydra.config.launch_plan import launched_world_size, world_size
from art_hydra.config.objective import (
    AUTO_METRIC,
    CONDITIONAL_METRICS,
    REWARD_NAME,
    logged_metrics,
    loss_metrics,
    reward_metrics,
    reward_name,
)
from art_hydra.config.problems import Fix, Kind, Problem, Severity, fix, placeholder
from art_hydra.config.run_length import known_steps, steps_named
from art_hydra.config.schema import (
    DERIVED_SEQUENCE_ROOM,
    AlgorithmName,
    Device,
    DistBackend,
    DType,
    FinetuneMethod,
    ModelSource,
    TaskSource,
)
from art_hydra.config.targets import (
    ART_HYDRA_GENERATORS,
    ART_HYDRA_REWARDS,
    refusal,
    refused_module,
)
from art_hydra.config.tracker_names import LIBRARIES, NONE, TENSORBOARD
from art_hydra.config.validator_registry import validator


def _is_rl(cfg: DictConfig) -> bool:
    return cfg.algorithm.name == AlgorithmName.rl


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _warning(key: str, value: object, reason: str, remedy: object) -> Problem:
    return Problem(key, value, reason, remedy, Kind.rule, Severity.warning)  # type: ignore[arg-type]


@validator
def rl_rejects_gradient_accumulation(cfg: DictConfig) -> Iterator[Problem]:
    """The founding rule: RL with accumulation deadlocks producer and trainer."""
    gas = cfg.trainer.gradient_accumulation_steps
    if not _is_rl(cfg) or gas <= 1:
        return
    total = cfg.trainer.per_device_train_batch_size * gas
    n = cfg.rl.num_generations
    groups = f", {total // n} groups of rl.num_generations={n}" if total % n == 0 else ""
    yield Problem(
        "trainer.gradient_accumulation_steps",
        gas,
        "RL cannot accumulate gradients: the producer puts one packed input on the queue and "
        "waits for that input's optimizer-step result before it makes the next one, while the "
        f"trainer would wait for {gas - 1} more input(s) before stepping. Both sides would wait "
        "on each other forever (the run hangs at step 0).",
        fix(
            {
                "trainer.gradient_accumulation_steps": 1,
                "trainer.per_device_train_batch_size": total,
            },
            f"the same {total} completions per optimizer step{groups}",
        ),
    )


@validator
def rl_groups_fill_the_batch(cfg: DictConfig) -> Iterator[Problem]:
    """Each optimizer step trains on whole groups of num_generations completions."""
    if not _is_rl(cfg):
        return
    n, batch = cfg.rl.num_generations, cfg.trainer.per_device_train_batch_size
    if batch % n == 0:
        return
    up = math.ceil(batch / n) * n
    divisors = [d for d in _divisors(batch) if d >= 2]
    ranks = world_size(cfg)
    where = f"each of the {ranks} ranks samples" if ranks > 1 else "each optimizer step trains on"
    yield Problem(
        "trainer.per_device_train_batch_size",
        batch,
        f"is not a multiple of rl.num_generations={n}: {where} whole groups of {n} "
        f"completions of one prompt, and {batch} completions do not split into whole groups.",
        fix(
            {"trainer.per_device_train_batch_size": up},
            f"{up // n} groups",
            alt=fix({"rl.num_generations": divisors[-1]}) if divisors else None,
        ),
    )


def budget_room(cfg: Any) -> int:
    """The tokens one sequence of the run's budgets needs: RL's prompt plus completion,
    SFT's longest example."""
    if _is_rl(cfg):
        return int(cfg.rl.max_prompt_length) + int(cfg.rl.max_completion_length)
    return int(cfg.sft.max_length)


def derived_max_seq_length(cfg: Any, positions: int | None) -> int:
    """``model.max_seq_length`` as the run uses it: the value set (by the user or a
    preset), or for ``null`` the budgets' room (at least :data:`DERIVED_SEQUENCE_ROOM`)
    cut to the model's ``positions`` (None: not known). The world pre-flight and the run
    both derive it here (the run from the folder's or the cached config.json, before the
    model loads), so the checked value is the value trained with."""
    value = cfg.model.max_seq_length
    if value is not None:
        return int(value)
    room = max(DERIVED_SEQUENCE_ROOM, budget_room(cfg))
    return room if positions is None else min(room, positions)


@validator
def sequences_fit_the_model(cfg: DictConfig) -> Iterator[Problem]:
    limit = cfg.model.max_seq_length
    if limit is None:
        return  # derived from the model: its positions are checked with the folder
    if _is_rl(cfg):
        prompt, completion = cfg.rl.max_prompt_length, cfg.rl.max_completion_length
        if prompt + completion <= limit:
            return
        smaller = (
            fix({"rl.max_completion_length": limit - prompt})
            if limit - prompt >= 1
            else fix(
                {"rl.max_prompt_length": limit // 2, "rl.max_completion_length": limit - limit // 2}
            )
            if limit >= 2
            else None
        )
        longer = fix({"model.max_seq_length": prompt + completion})
        # A real model's positions end where its config says (the world pre-flight reads
        # it): shrinking the budgets always fits; the tiny model is built to the length.
        first, second = (
            (longer, smaller)
            if cfg.model.source == ModelSource.tiny or smaller is None
            else (smaller, longer)
        )
        yield Problem(
            "rl.max_completion_length",
            completion,
            f"rl.max_prompt_length={prompt} plus rl.max_completion_length={completion} is "
            f"{prompt + completion} tokens, longer than model.max_seq_length={limit}: rollouts "
            "would be cut or overflow the model's positions.",
            Fix(first.sets, first.note, second, first.drops),
        )
    elif cfg.sft.max_length > limit:
        yield Problem(
            "sft.max_length",
            cfg.sft.max_length,
            f"is longer than model.max_seq_length={limit}: examples would overflow the model's "
            "positions.",
            fix({"sft.max_length": limit}, alt=fix({"model.max_seq_length": cfg.sft.max_length})),
        )


def _four_bit_fix(backend: Backend, able: list[Backend]) -> Fix:
    """Choose a backend that loads 4-bit weights (one installed here first), or drop 4 bits."""
    off = fix({"model.load_in_4bit": False})
    here = [b for b in able if b.installed]
    if here:
        return fix(backend.override_to(here[0]), alt=off)
    if able and able[0].install:
        chosen = " ".join(f"{k}={v}" for k, v in backend.override_to(able[0]).items())
        return fix(
            {"model.load_in_4bit": False},
            f"{able[0].words} is not installed here",
            alt=fix(note=f"{able[0].install}, then {chosen}"),
        )
    return off


@validator
def model_and_backend_agree(cfg: DictConfig) -> Iterator[Problem]:
    """4-bit loading is a backend's declared capability (``four_bit``); the tiny model and
    full fine-tuning cannot use it on any backend."""
    model, backend = cfg.model, get_backend(cfg.backend.name)
    if not model.load_in_4bit:
        return
    if backend is not None and not backend.four_bit:
        able = [b for b in backends().values() if b.four_bit]
        yield Problem(
            "model.load_in_4bit",
            True,
            f"backend={backend.name} loads weights in full or half precision; 4-bit loading "
            "needs "
            + (
                " or ".join(f"the {b.words} backend ({b.help})" for b in able)
                or "a backend that declares four_bit"
            )
            + ".",
            _four_bit_fix(backend, able),
        )
    if model.source == ModelSource.tiny:
        yield Problem(
            "model.load_in_4bit",
            True,
            "the tiny model is built locally in full precision and cannot be loaded in 4 bits.",
            fix({"model.load_in_4bit": False}),
        )
    if model.finetune == FinetuneMethod.full:
        yield Problem(
            "model.load_in_4bit",
            True,
            "4-bit weights are frozen; full fine-tuning needs trainable full-precision weights.",
            fix({"model.finetune": "lora"}, alt=fix({"model.load_in_4bit": False})),
        )


@validator
def half_weights_train_on_masters(cfg: DictConfig) -> Iterator[Problem]:
    """``model.master_weights=false`` asks for pure half weights: float16 cannot train
    that way (loss scaling unscales gradients into float32 masters, and float16 weights
    overflow), and where no half weight trains (LoRA adapters, Unsloth, float32) the key
    does nothing. bfloat16 full fine-tuning may (a load-time warning measures the updates
    it rounds away)."""
    model = cfg.model
    if model.master_weights:
        return
    backend = get_backend(cfg.backend.name)
    own_precision = backend is not None and backend.own_precision
    torch_full = model.finetune == FinetuneMethod.full and not own_precision
    if torch_full and model.dtype == DType.float16:
        yield Problem(
            "model.master_weights",
            False,
            "model.dtype=float16 trains only on float32 master weights: float16 weights "
            "overflow within a few steps, and loss scaling needs float32 weights to unscale "
            "the gradient into.",
            fix(
                {"model.master_weights": True},
                "float16 mixed precision",
                alt=fix({"model.dtype": "bfloat16"}, "pure bfloat16 weights"),
            ),
        )
        return
    why = (
        "model.finetune=lora trains float32 adapters over a frozen base"
        if model.finetune == FinetuneMethod.lora
        else f"backend={cfg.backend.name} manages its own precision"
        if own_precision
        else "model.dtype=float32 has no half weights"
        if model.dtype == DType.float32
        else None
    )
    if why is not None:
        yield _warning(
            "model.master_weights",
            False,
            f"does nothing: {why}, so no weight trains in a half type.",
            fix({"model.master_weights": True}),
        )


@validator
def importance_sampling_cap_above_one(cfg: DictConfig) -> Iterator[Problem]:
    """The truncated importance weight of an on-policy token is about 1: a cap below 1
    scales every token's gradient down rather than truncating the rare large ones."""
    cap = cfg.rl.importance_sampling_cap if _is_rl(cfg) else None
    if cap is not None and cap < 1:
        yield _warning(
            "rl.importance_sampling_cap",
            cap,
            f"caps the sampler-to-trainer importance weight at {cap:g}, below the weight of a "
            f"token both sides agree on (1): every token's policy gradient is scaled by about "
            f"{cap:g} instead of only the rare tokens the sampler over-drew being truncated.",
            fix({"rl.importance_sampling_cap": 3.0}, "TRL's default cap"),
        )


@validator
def lora_trains_each_module_one_way(cfg: DictConfig) -> Iterator[Problem]:
    """A module is trained in full (``modules_to_save``) or through adapters
    (``target_modules``), never both: decided here for names written in both lists; the
    run checks the model's own modules before peft is called."""
    model = cfg.model
    if model.finetune != FinetuneMethod.lora:
        return
    saved = {str(m) for m in model.lora.modules_to_save}
    targets = [str(t) for t in model.lora.target_modules]
    both = [t for t in targets if t in saved]
    if both and len(both) < len(targets):
        yield Problem(
            "model.lora.target_modules",
            targets,
            f"{', '.join(both)} {'is' if len(both) == 1 else 'are'} also in "
            f"model.lora.modules_to_save={sorted(saved)}: a module is either trained in full "
            "or through LoRA adapters, not both.",
            fix({"model.lora.target_modules": [t for t in targets if t not in both]}),
        )
    elif both:
        yield Problem(
            "model.lora.modules_to_save",
            sorted(saved),
            f"names every target of model.lora.target_modules ({', '.join(both)}): a module "
            "is either trained in full or through LoRA adapters, not both.",
            fix({"model.lora.modules_to_save": sorted(saved - set(both))}),
        )


@validator
def tiny_model_heads(cfg: DictConfig) -> Iterator[Problem]:
    """Rotary embeddings rotate pairs of dimensions: heads must have an even width."""
    if cfg.model.source != ModelSource.tiny:
        return
    hidden, heads = cfg.model.tiny.hidden_size, cfg.model.tiny.num_heads
    head_dim, rest = divmod(hidden, heads)
    if not rest and head_dim % 2 == 0:
        return
    good = [h for h in _divisors(hidden) if (hidden // h) % 2 == 0]
    yield Problem(
        "model.tiny.num_heads",
        heads,
        f"must divide model.tiny.hidden_size={hidden} into heads of even size (rotary position "
        "embeddings rotate pairs of dimensions).",
        fix({"model.tiny.num_heads": good[-1]})
        if good
        else fix({"model.tiny.hidden_size": hidden + 1, "model.tiny.num_heads": 1}),
    )


@validator
def task_names_its_sources(cfg: DictConfig) -> Iterator[Problem]:
    """A task needs its data (a file or a generator) and a reward; neither may name the
    standard library, a library gadget or art_hydra's own non-reward code, whoever names
    it (which code a config file alone may name is :mod:`art_hydra.config.trust`'s)."""
    task = cfg.task
    if task.source in (TaskSource.jsonl, TaskSource.dataset) and task.path is None:
        jsonl = task.source == TaskSource.jsonl
        yield Problem(
            "task.path",
            None,
            f"task.source={task.source.value} needs the "
            + ("JSONL file to read." if jsonl else "data to read (a file, a folder or a hub id)."),
            fix(
                {
                    "task.path": placeholder(
                        "your JSONL file" if jsonl else "your data file, folder or hub id"
                    )
                }
            ),
        )
    if task.source == TaskSource.generated:
        why = refusal(task.generator, "task.generator")
        if why is not None:
            yield Problem(
                "task.generator",
                task.generator,
                f"task.source=generated needs an example generator: it {why}",
                target_fix("task.generator", task.generator),
            )
    why = refusal(task.reward._target_, "task.reward._target_")
    if why is not None:
        yield Problem(
            "task.reward._target_",
            task.reward._target_,
            f"the reward {why}",
            target_fix("task.reward._target_", task.reward._target_),
        )
    for i, entry in enumerate(task.rewards):
        key = f"task.rewards.{i}._target_"
        why = refusal(entry._target_, key)
        if why is not None:
            yield Problem(
                key,
                entry._target_,
                f"the reward {why}",
                target_fix(key, entry._target_),
            )
    never = [m for m in task.allowed_modules if refused_module(str(m))]
    if never:
        yield Problem(
            "task.allowed_modules",
            list(task.allowed_modules),
            f"lists {', '.join(never)}: the standard library, libraries such as numpy or "
            "torch, and art_hydra itself can never be allowed (their functions load files, "
            "write them or start processes); list only your own modules.",
            fix({"task.allowed_modules": [m for m in task.allowed_modules if m not in never]})
            if len(never) < len(task.allowed_modules)
            else fix({"task.allowed_modules": []}, "your own modules only"),
        )


@validator
def rewards_are_weighed_and_named(cfg: DictConfig) -> Iterator[Problem]:
    """Each reward of ``task.rewards`` has a finite weight and a name of its own in the
    metrics (``reward/<name>/mean``); at least one weight is not 0 (else every total is
    0 and GRPO learns nothing)."""
    entries = list(cfg.task.rewards)
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        weight = entry.weight
        if not math.isfinite(weight):
            yield Problem(
                f"task.rewards.{i}.weight",
                weight,
                "must be a finite number: the total reward is the weighted sum.",
                fix({f"task.rewards.{i}.weight": 1.0}),
            )
        name = reward_name(entry._target_, entry.name)
        if not REWARD_NAME.match(name):
            yield Problem(
                f"task.rewards.{i}.name",
                entry.name,
                f"the reward's metric name {name!r} must be letters, digits, '_', '.' or '-' "
                "(it becomes the metrics.jsonl key reward/<name>/mean and a TensorBoard tag).",
                fix({f"task.rewards.{i}.name": f"reward_{i}"}),
            )
        elif name in seen:
            yield Problem(
                f"task.rewards.{i}.name",
                entry.name,
                f"logs as reward/{name}, as task.rewards.{seen[name]} does: each reward needs "
                "a name of its own in the metrics.",
                fix({f"task.rewards.{i}.name": f"{name}_{i}"}),
            )
        seen.setdefault(name, i)
    if entries and _is_rl(cfg) and all(e.weight == 0 for e in entries):
        yield Problem(
            "task.rewards",
            [e.weight for e in entries],
            "every weight is 0: every total reward is 0, every group has zero spread, and "
            "the loss and its gradient stay 0 forever.",
            fix({"task.rewards.0.weight": 1.0}),
        )


def target_fix(key: str, value: object) -> Fix:
    """The fix for a reward or generator that may never run: art_hydra's own function of
    the same name where there is one (``exact_match`` for a bare ``exact_match``), else
    the user's own function, marked, in its place (a library function cannot be kept)."""
    role = "generator" if key == "task.generator" else "reward"
    own = ART_HYDRA_GENERATORS if role == "generator" else ART_HYDRA_REWARDS
    name = str(value).rpartition(".")[2]
    same = sorted(p for p in own if p.rpartition(".")[2] == name)
    if same:
        return fix({key: same[0]}, f"art_hydra's own {role} of that name")
    if str(value).startswith("art_hydra."):  # meant one of art_hydra's own: the nearest
        near = difflib.get_close_matches(str(value), sorted(own), n=1, cutoff=0.0)
        return fix({key: near[0]}, f"art_hydra's own {role}s: {', '.join(sorted(own))}")
    return fix(
        {key: placeholder(f"my_module.my_{role}: your own function, marked @{role}")},
        f"art_hydra's own: {', '.join(sorted(own))}",
    )


def budget_fix(cfg: DictConfig, key: str, size: int) -> Fix:
    """``key`` (a length budget: ``rl.max_prompt_length``, ``rl.max_completion_length`` or
    ``sft.max_length``) raised to ``size`` in one step with ``model.max_seq_length`` where
    the sum would no longer fit (two fixes in turn would go in a circle)."""
    sets: dict[str, object] = {key: size}
    if key.startswith("rl."):
        other = (
            "rl.max_completion_length" if key == "rl.max_prompt_length" else "rl.max_prompt_length"
        )
        total = size + int(cfg.rl[other.partition(".")[2]])
    else:
        total = size
    limit = cfg.model.max_seq_length
    if limit is not None and total > limit:  # null follows the budgets by itself
        sets["model.max_seq_length"] = total
    return fix(sets)


@validator
def sampling_can_differ(cfg: DictConfig) -> Iterator[Problem]:
    """GRPO learns from differences within a group: sampling must be able to differ."""
    if not _is_rl(cfg):
        return
    rl = cfg.rl
    if rl.top_k == 1:
        yield Problem(
            "rl.top_k",
            1,
            "top-k 1 is greedy decoding: every completion of a prompt is the same, every group "
            "has zero reward spread, and the loss and its gradient stay 0 forever.",
            fix({"rl.top_k": default("rl.top_k")}, "no top-k"),
        )
    if rl.top_p < 0.5:
        yield _warning(
            "rl.top_p",
            rl.top_p,
            f"keeps a second token only where the most likely one has less than {rl.top_p:g} of "
            "the probability: most groups would sample identical completions and carry no signal.",
            fix({"rl.top_p": default("rl.top_p")}),
        )
    if rl.temperature < 0.1:
        yield _warning(
            "rl.temperature",
            rl.temperature,
            "is close to greedy decoding: completions of a prompt would rarely differ, so most "
            "groups carry no signal.",
            fix({"rl.temperature": default("rl.temperature")}),
        )


@validator
def loss_has_the_settings_it_requires(cfg: DictConfig) -> Iterator[Problem]:
    """A policy loss's registration names the ``rl.*`` settings it cannot run without
    (CISPO's cap, rl.epsilon_high) and the value the fix offers."""
    from art_hydra.config.policy_losses import get_policy_loss

    loss = get_policy_loss(cfg.rl.loss_type) if _is_rl(cfg) else None
    if loss is None:
        return
    for key, value in loss.requires.items():
        if cfg.rl[key] is None:
            because = f": {loss.why[key]}" if key in loss.why else "."
            yield Problem(
                f"rl.{key}",
                None,
                f"rl.loss_type={loss.name} reads rl.{key}, and it has no value{because}",
                fix({f"rl.{key}": value}),
            )


@validator
def cispo_has_its_cap(cfg: DictConfig) -> Iterator[Problem]:
    """CISPO caps the importance weight at epsilon_high itself (TRL's convention)."""
    if not _is_rl(cfg) or str(cfg.rl.loss_type) != "cispo":
        return
    high = cfg.rl.epsilon_high
    if high is not None and high <= 1:
        yield _warning(
            "rl.epsilon_high",
            high,
            f"caps the CISPO importance weight at {high:g}, below an on-policy token's weight "
            f"of 1: every token's gradient is scaled by {high:g} (the cap is epsilon_high "
            "itself, not 1 + epsilon_high).",
            fix({"rl.epsilon_high": 5.0}, "ScaleRL's cap"),
        )


@validator
def overlapped_rollouts_have_a_sampler(cfg: DictConfig) -> Iterator[Problem]:
    """Overlapped rollouts sample on a copy of the policy in a second thread: a backend
    declares whether it allows that (``overlap_rollouts``; Unsloth's patched model and
    kernels are built for one model on one stream)."""
    backend = get_backend(cfg.backend.name)
    if _is_rl(cfg) and cfg.rl.overlap_rollouts and backend and not backend.overlap_rollouts:
        yield Problem(
            "rl.overlap_rollouts",
            True,
            "samples on a copy of the policy in a second thread while the trainer trains, "
            f"which the {_default_backend(backend).words} backend provides; {backend.words} "
            "patches one model for its own kernels and generation (its declaration says "
            "overlap_rollouts=False).",
            fix(
                {"rl.overlap_rollouts": default("rl.overlap_rollouts")},
                alt=fix(backend.override_to(_default_backend(backend))),
            ),
        )


def _default_backend(backend: Backend) -> Backend:
    """The default backend (torch), which the fixes offer instead of one that cannot."""
    return get_backend(default("backend.name")) or backend


@validator
def plugins_import(cfg: DictConfig) -> Iterator[Problem]:
    """A policy-loss, backend or advantage-estimator plugin (``art_hydra.policy_losses``,
    ``art_hydra.backends``, ``art_hydra.advantage_estimators`` entry points) that failed
    to import is named, not silently left out of the choices."""
    from art_hydra.config.key_registries import load_problems

    yield from load_problems()


@validator
def generations_are_used_whole(cfg: DictConfig) -> Iterator[Problem]:
    """A generation batch feeds steps_per_generation x num_iterations optimizer steps."""
    if not _is_rl(cfg):
        return
    per_generation = cfg.rl.steps_per_generation * cfg.rl.num_iterations
    steps = known_steps(cfg)  # sized by epochs (None): whole generation batches
    if per_generation > 1 and steps is not None and steps % per_generation:
        whole = max(per_generation, steps - steps % per_generation)
        yield _warning(
            "trainer.max_steps",
            steps,
            f"is not a multiple of rl.steps_per_generation x rl.num_iterations = "
            f"{per_generation}: the last generation batch is only partly trained on.",
            fix({"trainer.max_steps": whole}),
        )


@validator
def ranks_agree_with_the_launch(cfg: DictConfig) -> Iterator[Problem]:
    """Every rank must run the same number of collectives per step; what decides that is
    fixed by construction (one input per RL step per rank, the same micro-batch count in
    SFT), so what remains is a world the backend and the launch can actually form."""
    planned, launched = cfg.distributed.world_size, launched_world_size()
    # (A null world_size was already resolved to the launcher's, or 1.)
    if planned is not None and launched is not None and planned != launched:
        yield Problem(
            "distributed.world_size",
            planned,
            f"the launcher starts {launched} ranks per job, not {planned}: the ranks would "
            "wait in collectives for ranks that do not exist, or leave some out.",
            fix(
                {"distributed.world_size": launched},
                "or null, to take the launcher's; or launch as many processes",
            ),
        )
    if planned is not None and planned > 1 and launched is None:
        yield _warning(
            "distributed.world_size",
            planned,
            f"plans {planned} ranks, but nothing launched them: this runs as one process, "
            f"on 1/{planned} of the planned global batch (fine for checking a plan with "
            "dry_run=true).",
            fix(
                note=f"torchrun --nproc_per_node={planned} -m art_hydra ..., or "
                "distributed.world_size=null"
            ),
        )
    ranks = world_size(cfg)
    backend = get_backend(cfg.backend.name)
    if ranks > 1 and backend is not None and not backend.several_ranks:
        yield Problem(
            next(iter(backend.choose())),
            backend.name,
            f"{backend.words} trains on one device (its declaration says several_ranks=False); "
            f"this run has {ranks} ranks.",
            fix(backend.override_to(_default_backend(backend)), "data-parallel over the ranks"),
        )
    if cfg.distributed.backend == DistBackend.nccl and cfg.backend.device == Device.cpu:
        yield Problem(
            "distributed.backend",
            "nccl",
            "NCCL runs collectives between CUDA devices, and backend.device=cpu.",
            fix({"distributed.backend": "gloo"}),
        )


@validator
def warmup_within_the_run(cfg: DictConfig) -> Iterator[Problem]:
    """Checked on the run's steps; a run sized by the data is checked by the world
    pre-flight once it has counted them (:mod:`art_hydra.preflight.epochs`)."""
    steps = known_steps(cfg)
    if steps is not None:
        yield from warmup_problems(cfg, steps)


def warmup_problems(cfg: DictConfig, steps: int) -> Iterator[Problem]:
    """A warmup as long as the run's ``steps``."""
    t = cfg.trainer
    if t.warmup_steps >= steps:
        yield _warning(
            "trainer.warmup_steps",
            t.warmup_steps,
            f"is not shorter than the run ({steps_named(cfg, steps)}): the learning rate "
            "never reaches trainer.learning_rate.",
            fix({"trainer.warmup_steps": steps // 10}),
        )


@validator
def max_steps_wins_over_epochs(cfg: DictConfig) -> Iterator[Problem]:
    """Both lengths set after composition decided (a typed ``max_steps``, or both from
    config files): ``trainer.max_steps`` wins, as TRL's ``max_steps > 0`` overrides
    ``num_train_epochs``; said, since the epochs asked for are then not trained."""
    t = cfg.trainer
    if t.num_train_epochs is None or t.max_steps is None:
        return
    yield _warning(
        "trainer.num_train_epochs",
        t.num_train_epochs,
        f"is ignored: trainer.max_steps={t.max_steps} is set too, and wins (as in TRL, where "
        "max_steps overrides num_train_epochs), so the run trains "
        f"{t.max_steps} steps, whatever an epoch holds (a trainer.max_steps typed on the "
        "command line, or both set by config files; a typed trainer.num_train_epochs sets "
        "a config file's trainer.max_steps aside). null sizes the run by epochs.",
        fix(
            {"trainer.max_steps": None},
            "size the run by trainer.num_train_epochs",
            alt=fix({"trainer.num_train_epochs": None}, f"train {t.max_steps} steps"),
        ),
    )


@validator
def objective_names_a_logged_metric(cfg: DictConfig) -> Iterator[Problem]:
    """The objective a sweeper optimises must be a metric this algorithm logs: any other
    name would give every job the same NaN, and the sweeper would learn nothing."""
    metric = cfg.objective.metric
    if metric == "auto":
        return
    if metric.startswith(EVAL_PREFIX):
        found = eval_objective_problem(cfg, metric)
        if found is not None:
            yield found
        return
    algorithm = cfg.algorithm.name
    valid = logged_metrics(algorithm, cfg)
    if metric in valid or (_is_rl(cfg) and metric in reward_metrics(cfg.task)):
        return
    other = next(a for a in AlgorithmName if a != algorithm)
    logged_by = CONDITIONAL_METRICS[metric][0] if metric in CONDITIONAL_METRICS else None
    logged_by = logged_by or loss_metrics().get(metric)
    if logged_by:
        why = f"this run does not log it (only runs with {logged_by} do)"
    else:
        why = f"algorithm={algorithm.name} does not log it" + (
            f" (only algorithm={other.name} does)"
            if metric in logged_metrics(other)
            else " (it is no metric of metrics.jsonl)"
        )
    why += f"; the metrics it logs are {', '.join(valid)}."
    yield Problem(
        "objective.metric",
        metric,
        f"names no metric this run logs: {why} Every job would return NaN to the sweeper.",
        fix(
            {"objective.metric": "auto"},
            f"{AUTO_METRIC[algorithm]} under algorithm={algorithm.name}",
            alt=fix(note=f"objective.metric=<one of {', '.join(valid)}>"),
        ),
    )


@validator
def objective_window_within_the_run(cfg: DictConfig) -> Iterator[Problem]:
    """A window longer than the run's logged steps reduces fewer values than asked. The
    run logs every logging.every_steps-th step and always its last one. A run sized by
    the data is checked by the world pre-flight on its count."""
    steps = known_steps(cfg)
    if steps is not None:
        yield from logged_steps_problems(cfg, steps)


def logged_steps_problems(cfg: DictConfig, steps: int) -> Iterator[Problem]:
    """A logging interval or objective window longer than the run's ``steps`` logs."""
    every = cfg.logging.every_steps
    logged = steps // every + (1 if steps % every else 0)
    window = cfg.objective.window
    if every > steps:
        yield _warning(
            "logging.every_steps",
            every,
            f"is longer than the run ({steps_named(cfg, steps)}): only the last step is "
            "logged (metrics.jsonl holds one line, the plot one point).",
            fix({"logging.every_steps": max(1, steps // 10)}),
        )
    elif window > logged:
        yield _warning(
            "objective.window",
            window,
            f"is longer than the {logged} step(s) the run logs ({steps_named(cfg, steps)}, "
            f"logging.every_steps={every}, and the last step): the objective "
            "reduces all of them.",
            fix({"objective.window": logged}),
        )


#: What the run itself keeps in its folder: a checkpoint folder of one of these names
#: would mix checkpoints into (and prune inside) another record.
_RUN_RECORDS = frozenset(
    {
        run_files.HYDRA_RECORD,
        run_files.RANKS,
        run_files.TENSORBOARD,
        run_files.TRACKERS,
        run_files.LOCK,
        run_files.RUN_CONFIG,
        run_files.RESUMES,
        run_files.METRICS,
        run_files.COMPLETIONS,
        run_files.EVAL_COMPLETIONS,
        *run_files.PLOTS,
        *run_files.SWEEP_FILES,
    }
)


def _checkpoint_dir_flaw(value: str) -> str | None:
    """Why ``checkpoint.dir`` would not name a folder of its own inside the run folder."""
    if not value.strip():
        return "is empty: the checkpoints would land in the run folder itself."
    if os.path.isabs(value) or value.startswith("~"):
        return (
            "is an absolute path (or starts with ~): checkpoints (and the pruning of old "
            "ones) would happen outside the run folder, where another run or your own files "
            "may be."
        )
    parts = os.path.normpath(value).split(os.sep)
    if parts[0] == "..":
        return (
            "climbs out of the run folder with '..': checkpoints (and the pruning of old "
            "ones) would happen outside it, where another run or your own files may be."
        )
    if parts[0] == ".":
        return "names the run folder itself: checkpoints need a folder of their own."
    if parts[0] in _RUN_RECORDS or parts[0].startswith(".hydra") or parts[0].endswith(".log"):
        return f"puts the checkpoints inside {parts[0]}, which holds another record of the run."
    return None


@validator
def checkpoints_stay_in_the_run_folder(cfg: DictConfig) -> Iterator[Problem]:
    """A run writes inside its own folder only: ``checkpoint.dir`` is a relative folder
    below the run folder (decided from the text alone, no file is looked at)."""
    value = str(cfg.checkpoint.dir)
    why = _checkpoint_dir_flaw(value)
    if why is not None:
        yield Problem(
            "checkpoint.dir",
            value,
            f"{why} It must be a folder inside the run folder (hydra.run.dir).",
            fix({"checkpoint.dir": default("checkpoint.dir")}),
        )


@validator
def report_to_names_known_trackers(cfg: DictConfig) -> Iterator[Problem]:
    """``logging.report_to`` names trackers art_hydra has (the nearest name offered for a
    misspelt one), ``none`` alone, each once; ``logging.tensorboard`` set against it
    keeps its old meaning, with a word about the contradiction."""
    names = [str(n) for n in cfg.logging.report_to or []]
    known = [*LIBRARIES, NONE]
    kept = [n for n in names if n in known]
    yield from _unknown_tracker_problems(names, known)
    yield from _tracker_list_problems(names, kept)
    yield from _tensorboard_switch_problems(cfg.logging.tensorboard, names, kept)


def _nearest_tracker(name: str, known: list[str]) -> str | None:
    """``name`` if known, else the closest known tracker name (None: nothing close)."""
    if name in known:
        return name
    near = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.5)
    return near[0] if near else None


def _unknown_tracker_problems(names: list[str], known: list[str]) -> Iterator[Problem]:
    """One error per unknown name in ``logging.report_to``, offering the nearest known
    name; the fix is the whole list with each name repaired (or dropped)."""
    repaired = [n for n in (_nearest_tracker(n, known) for n in names) if n is not None]
    for name in names:
        if name in known:
            continue
        near = [_nearest_tracker(name, known)] if _nearest_tracker(name, known) else []
        better = repaired
        yield Problem(
            "logging.report_to",
            name,
            f"is not a tracker art_hydra reports to; it knows {', '.join(known)}"
            + (f" (did you mean {near[0]}?)" if near else "")
            + ".",
            fix({"logging.report_to": list(dict.fromkeys(better)) or [TENSORBOARD]}),
        )


def _tracker_list_problems(names: list[str], kept: list[str]) -> Iterator[Problem]:
    """The known names (``kept``) as a list: ``none`` beside a tracker contradicts it
    (an error), a tracker named twice is opened once (a warning)."""
    if NONE in kept and len(set(kept)) > 1:
        others = list(dict.fromkeys(n for n in kept if n != NONE))
        yield Problem(
            "logging.report_to",
            names,
            f"names none together with {', '.join(others)}: none means no tracker at all.",
            fix({"logging.report_to": others}, alt=fix({"logging.report_to": [NONE]})),
        )
    duplicates = sorted({n for n in kept if kept.count(n) > 1})
    if duplicates:
        yield _warning(
            "logging.report_to",
            names,
            f"names {', '.join(duplicates)} more than once; each tracker is opened once.",
            fix({"logging.report_to": list(dict.fromkeys(kept))}),
        )


def _tensorboard_switch_problems(
    switch: bool | None, names: list[str], kept: list[str]
) -> Iterator[Problem]:
    """``logging.tensorboard`` (the older switch) set against ``logging.report_to``: it
    still wins, as it did, with a warning about the contradiction."""
    explicit = names != [TENSORBOARD]  # report_to as the user set it (not its default)
    if switch is True and TENSORBOARD not in kept:
        yield _warning(
            "logging.tensorboard",
            switch,
            f"adds TensorBoard to logging.report_to={names}, which leaves it out; "
            "logging.tensorboard=null follows report_to.",
            fix(
                {"logging.tensorboard": None},
                alt=fix(
                    {
                        "logging.tensorboard": None,
                        "logging.report_to": list(
                            dict.fromkeys([TENSORBOARD, *(n for n in kept if n != NONE)])
                        ),
                    }
                ),
            ),
        )
    elif switch is False and TENSORBOARD in kept and explicit:
        yield _warning(
            "logging.tensorboard",
            switch,
            f"drops TensorBoard from logging.report_to={names}, which names it; "
            "logging.tensorboard=null follows report_to.",
            fix({"logging.tensorboard": None}),
        )


def __getattr__(name: str) -> Any:
    """Names that left this module when the package got its rooms (:mod:`art_hydra.moved`)."""
    from art_hydra import moved

    return moved.old_attribute(__name__, name)
