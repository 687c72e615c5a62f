"""Settings the composed run never reads: no value the user set may do nothing silently.

A key can be inert because another choice makes the run skip it: LoRA settings under
``model.finetune=full``, ``rl.*`` under ``algorithm=sft`` (and ``sft.*`` under RL),
``task.num_examples``/``task.params``/``task.generator`` with a file task,
``model.tiny.*`` with a pretrained model, a hub revision or remote code with the tiny
model, ``eval.*`` with evaluation off, the rewards of an SFT run that does not evaluate,
a tracker project without a tracker that has projects, the collectives' settings on one
process, sharding's where nothing shards (``distributed.strategy=fsdp`` on one rank,
``distributed.fsdp.*`` under ``ddp``), vLLM's settings without the vLLM engine (and
those of them its own choices skip), a rollout engine under SFT, the importance-sampling
mode without a cap, the tool loop's settings (``task.tool_parser``, ``rl.max_tool_calls``,
``timeouts.tool_s``) without an environment or tools. Each such value *the user set* is
a warning naming the setting that makes it inert.
tests/config/test_every_key.py holds every schema key to that: read, warned or refused.
Where the ignored value is surely a mistake, a model or data path that would be ignored
(``task.path`` without a file task, ``model.name`` as a path or hub id under
``model.source=tiny``), it is an error: the run would train on something other than what
the user pointed at.

"The user set" means the command line (:mod:`art_hydra.config.trust`'s hand) or a config
file of the user's own (``--config-dir``, ``--config-name``); the schema's defaults and the
shipped group files never count, so a shipped config never warns (the tiny model's
``modules_to_save=[lm_head]`` is meant for ``model.finetune=lora`` and stays quiet under
``full``). Composition records who set what (:func:`tracing`); a config checked without
that record (``train(cfg)`` from Python) counts the command line's keys when there is a
command line, else every value that neither the schema nor a shipped file gives.

Nothing here imports torch, transformers, peft or unsloth.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from art_hydra.config import eval_rules
from art_hydra.config.bounds import schema_default
from art_hydra.config.distributed_rules import sharded  # also registers the sharding rules
from art_hydra.config.launch_plan import world_size
from art_hydra.config.problems import Kind, Problem, Severity, fix
from art_hydra.config.rollout_rules import is_vllm
from art_hydra.config.schema import (
    AlgorithmName,
    DistStrategy,
    FinetuneMethod,
    ModelSource,
    RunConfig,
    TaskSource,
)
from art_hydra.config.tracker_names import TENSORBOARD, chosen_trackers
from art_hydra.config.trust import Hand, current_hand
from art_hydra.config.validator_registry import validator

#: The group option whose settings the tiny model needs (conf/model/tiny.yaml and the
#: conf/training/tiny.yaml chosen with it).
TINY = "tiny"


@dataclass(frozen=True)
class Origins:
    """Who set what in one composed config."""

    #: The command line's keys (None: a Python caller's config).
    hand: Hand | None
    #: Leaf keys that config files of the user's own set (not shipped with art_hydra).
    own: frozenset[str] = frozenset()
    #: The option chosen for each group, and whether it is a shipped file.
    choices: Mapping[str, tuple[str, bool]] = field(default_factory=dict)

    def user_set(self, key: str) -> bool:
        return (self.hand is not None and self.hand.set(key)) or _under(key, self.own)

    def shipped_choice(self, group: str) -> str | None:
        """The shipped option chosen for ``group`` (None: none, or the user's own file)."""
        option, shipped = self.choices.get(group, (None, False))
        return option if shipped else None


_origins: ContextVar[Origins | None] = ContextVar("art_hydra_origins", default=None)


@contextmanager
def tracing(origins: Origins | None) -> Iterator[None]:
    """Check a config whose keys were set as ``origins`` says."""
    token = _origins.set(origins)
    try:
        yield
    finally:
        _origins.reset(token)


#: Keys and groups a sweep varies (set while its pre-flight checks the points).
_swept: ContextVar[frozenset[str]] = ContextVar("art_hydra_swept", default=frozenset())


@contextmanager
def sweeping(keys: frozenset[str]) -> Iterator[None]:
    """Check the points of a sweep that varies ``keys`` (keys and groups). A value made
    inert by a choice the sweep varies (``algorithm=rl,sft`` with ``rl.beta=0.1``), or
    one the sweep itself varies, is deliberate: the sweep crosses the two on purpose."""
    token = _swept.set(keys)
    try:
        yield
    finally:
        _swept.reset(token)


def swept_now() -> frozenset[str]:
    """The keys and groups of the sweep whose points are being checked (empty: none); each
    job's own command line sets them, so its checks count them as typed by the user."""
    return _swept.get()


def swept_keys(task_overrides: Any) -> frozenset[str]:
    """The keys and groups the sweep ``task_overrides`` (a master's
    ``hydra.overrides.task``) varies."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    found = set()
    for text in task_overrides or ():
        try:
            override = parser.parse_override(str(text))
        except Exception:
            continue
        if override.is_sweep_override():
            found.add(override.key_or_group.lstrip("+~"))
    return frozenset(found)


def _crossed(key: str, causes: tuple[str, ...]) -> bool:
    """Whether a sweep varies ``key`` (or a mapping above it) or one of ``causes``."""
    swept = _swept.get()
    return bool(swept) and (_under(key, swept) or any(c in swept for c in causes))


def _under(key: str, keys: frozenset[str]) -> bool:
    """Whether ``key`` or a mapping above it is in ``keys``."""
    parts = key.split(".")
    return any(".".join(parts[: i + 1]) in keys for i in range(len(parts)))


# ---- who set what --------------------------------------------------------------------


def origins_of(
    hand: Hand | None,
    choices: Mapping[str, str],
    load: Any,
    primary: Any = None,
) -> Origins:
    """The origins of a composed config: ``choices`` (group -> option, Hydra's
    ``hydra.runtime.choices``), ``load(group)`` the Hydra ``LoadedConfig`` of a group's
    chosen option (None if unreadable) and ``primary`` the primary config's."""
    own: set[str] = set()
    chosen: dict[str, tuple[str, bool]] = {}
    for group, option in choices.items():
        if option is None or group.startswith("hydra/"):
            continue
        loaded = load(group)
        shipped = loaded is not None and _is_shipped(loaded.path)
        chosen[group] = (str(option), shipped)
        if loaded is not None and not shipped:
            own |= set(_file_leaves(loaded, group))
    if primary is not None and not _is_shipped(primary.path):
        own |= set(_file_leaves(primary, ""))
    return Origins(hand, frozenset(own), chosen)


def _is_shipped(path: Any) -> bool:
    """Whether a config source is art_hydra's own conf/ (installed or a source checkout)."""
    text = str(path)
    return text == "pkg://art_hydra.conf" or text == f"file://{_conf_folder()}"


@functools.cache
def _conf_folder() -> str:
    """The shipped conf/ folder: the installed ``art_hydra.conf`` package, else the
    repository's (as composition.config_path finds it)."""
    if importlib.util.find_spec("art_hydra.conf") is not None:
        return str(importlib.resources.files("art_hydra.conf"))
    return str(Path(__file__).resolve().parents[2] / "conf")


def _file_leaves(loaded: Any, group: str) -> Iterator[str]:
    """The leaf keys a config file sets, at their place in the run config."""
    try:
        content = OmegaConf.to_container(loaded.config, resolve=False)
    except Exception:
        return
    if isinstance(content, dict):
        content.pop("defaults", None)
    package = (loaded.header or {}).get("package")
    if package is None:
        prefix = group.replace("/", ".")
    else:
        prefix = "" if package == "_global_" else package.replace("_group_", group)
    for key, _ in _leaves(content, prefix):
        yield key


def _leaves(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            if k == "defaults" and not prefix:
                continue
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix, node


@functools.cache
def shipped_values() -> dict[str, tuple[Any, ...]]:
    """Every value a shipped group file sets, by key (for a config checked without its
    origins: a value one of them gives is not the user's)."""
    root = Path(_conf_folder())
    found: dict[str, list[Any]] = {}
    for path in sorted(root.rglob("*.yaml")):
        relative = path.relative_to(root)
        if relative.parts[0] == "hydra" or len(relative.parts) < 2:
            continue
        first = path.read_text().splitlines()[:1]
        header = first[0].split() if first and first[0].startswith("# @package") else []
        package = header[-1] if header else ".".join(relative.parts[:-1])
        prefix = "" if package == "_global_" else package
        try:
            content = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except Exception:
            continue
        for key, value in _leaves(content, prefix):
            found.setdefault(key, []).append(_plain(value))
    return {k: tuple(v) for k, v in found.items()}


def _plain(value: Any) -> Any:
    """A value as YAML spells it: enums by name, containers plain (1 == 1.0 compares)."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def user_set(cfg: DictConfig, key: str) -> bool:
    """Whether the user set ``key``: by the record composition made; else by the command
    line's keys; else (a Python caller) a value neither the schema nor a shipped file gives."""
    origins = _origins.get()
    if origins is not None:
        return origins.user_set(key)
    hand = current_hand()
    if hand is not None:
        # A sweep's job: its pre-flight judged the point knowing what the sweep varies.
        return hand.set(key) and not _in_a_sweep_job()
    value = _plain(OmegaConf.select(cfg, key, throw_on_missing=False))
    try:
        if value == _plain(schema_default(RunConfig, key)):
            return False
    except (KeyError, TypeError, AttributeError):
        pass  # a key below a free mapping (task.params.*): no schema default
    return value not in shipped_values().get(key, ())


def _in_a_sweep_job() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


# ---- the rules -------------------------------------------------------------------------


def _warning(key: str, value: Any, reason: str, remedy: Any) -> Problem:
    return Problem(key, _plain(value), reason, remedy, Kind.rule, Severity.warning)


def _set_leaves(cfg: DictConfig, section: str) -> Iterator[tuple[str, Any]]:
    """The leaves below ``section`` (or ``section`` itself) that the user set."""
    node = OmegaConf.select(cfg, section, throw_on_missing=False)
    if isinstance(node, DictConfig):
        plain = OmegaConf.to_container(node, resolve=True)
        leaves = list(_leaves(plain, section)) if plain else [(section, {})]
    else:
        leaves = [(section, node)]
    for key, value in leaves:
        if user_set(cfg, key):
            yield key, value


def _inert(
    cfg: DictConfig,
    sections: list[str],
    because: str,
    what: str,
    remedy: Any,
    causes: tuple[str, ...],
) -> Iterator[Problem]:
    """A warning for each value below ``sections`` the user set, unless a sweep crosses
    it (or one of ``causes``, the keys and groups that make it inert) on purpose."""
    for section in sections:
        for key, value in _set_leaves(cfg, section):
            if _crossed(key, causes):
                continue
            yield _warning(
                key,
                value,
                f"is never read: {because}, so {what}. The value does nothing.",
                remedy(key, value) if callable(remedy) else remedy,
            )


def _drop(key: str, value: Any) -> Any:
    return fix(note=f"drop {key}={_plain(value)} from the command line or your config")


@validator
def lora_settings_under_full_finetuning(cfg: DictConfig) -> Iterator[Problem]:
    """model.finetune=full trains every weight: no adapter, no module saved beside one."""
    if cfg.model.finetune != FinetuneMethod.full:
        return
    yield from _inert(
        cfg,
        ["model.lora"],
        "model.finetune=full trains every weight with no adapter",
        "the LoRA settings (model.lora.*) are not used",
        lambda key, value: fix({"model.finetune": "lora"}, alt=_drop(key, value)),
        ("model.finetune", "model", "experiment"),
    )


@validator
def settings_of_the_other_algorithm(cfg: DictConfig) -> Iterator[Problem]:
    """RL reads rl.*, SFT reads sft.*; never the other's, except the rl.* settings an SFT
    run's evaluation samples with (:func:`read_by_evaluation`)."""
    rl = cfg.algorithm.name == AlgorithmName.rl
    other, name = ("sft", "sft") if rl else ("rl", "rl")
    this = "rl" if rl else "sft"
    read = () if rl else read_by_evaluation(cfg)
    yield from _inert(
        cfg,
        [f"{other}.{k}" for k in cfg[other] if f"{other}.{k}" not in read],
        f"algorithm={this} runs {'RL' if rl else 'supervised fine-tuning'}",
        f"the {other}.* settings (algorithm={name}'s) are not used",
        lambda key, value: fix({"algorithm": name}, alt=_drop(key, value)),
        ("algorithm", "algorithm.name", "experiment"),
    )


def read_by_evaluation(cfg: DictConfig) -> tuple[str, ...]:
    """The rl.* settings evaluation generates with (under either algorithm): its length
    where eval.max_completion_length leaves it to rl.max_completion_length, and the
    top-k/top-p filters of its sampled completions (engine/evaluation.py)."""
    if not eval_rules.enabled(cfg):
        return ()
    ev = cfg.eval
    read = ("rl.max_completion_length",) if ev.max_completion_length is None else ()
    return read + (("rl.top_k", "rl.top_p") if ev.num_samples > 0 else ())


#: The eval.* keys that turn evaluation on: each is read, on or off.
EVAL_SWITCHES = ("eval.fraction", "eval.path", "eval.split")


@validator
def eval_settings_without_evaluation(cfg: DictConfig) -> Iterator[Problem]:
    """Evaluation's settings do nothing while it is off (a forgotten switch, likely); its
    sampling temperature does nothing while it samples no completion."""
    causes = (*EVAL_SWITCHES, "eval", "experiment")
    if not eval_rules.enabled(cfg):
        yield from _inert(
            cfg,
            [f"eval.{k}" for k in cfg.eval if f"eval.{k}" not in EVAL_SWITCHES],
            "evaluation is off (eval.fraction=0, no eval.path or eval.split)",
            "nothing is evaluated",
            lambda key, value: fix(
                eval_rules.TURN_ON, "hold out 10% of the prompts", alt=_drop(key, value)
            ),
            causes,
        )
        return
    if cfg.eval.num_samples == 0:
        yield from _inert(
            cfg,
            ["eval.temperature"],
            "eval.num_samples=0 evaluates the greedy completion only",
            "no completion is sampled at this temperature",
            lambda key, value: fix({"eval.num_samples": 4}, alt=_drop(key, value)),
            ("eval.num_samples", *causes),
        )


@validator
def rewards_sft_never_calls(cfg: DictConfig) -> Iterator[Problem]:
    """Supervised fine-tuning trains on the reference answers: only its evaluation scores
    completions with the task's rewards."""
    if cfg.algorithm.name != AlgorithmName.sft or eval_rules.enabled(cfg):
        return
    yield from _inert(
        cfg,
        ["task.rewards", "task.reward"],
        "algorithm=sft trains on the reference answers and only evaluation scores "
        "completions, and evaluation is off (eval.fraction=0, no eval.path or eval.split)",
        "no reward is ever called",
        lambda key, value: fix(
            eval_rules.TURN_ON, "score held-out completions with it", alt=_drop(key, value)
        ),
        ("algorithm", "algorithm.name", *EVAL_SWITCHES, "task", "experiment"),
    )


@validator
def tracker_settings_without_a_tracker(cfg: DictConfig) -> Iterator[Problem]:
    """logging.project names the project of a tracker that keeps runs in projects (W&B,
    MLflow's experiment, Trackio), logging.trackers_dir the folder of their stores;
    TensorBoard writes into the run folder and has neither."""
    chosen = chosen_trackers(cfg.logging)
    given = cfg.logging.project is not None or cfg.logging.get("trackers_dir") is not None
    if not given or any(name != TENSORBOARD for name in chosen):
        return
    reports = "TensorBoard only (event files in the run folder)" if chosen else "no tracker"
    yield from _inert(
        cfg,
        ["logging.project", "logging.trackers_dir"],
        f"logging.report_to reports to {reports}, which has no projects or stores of its own",
        "neither the project name nor the trackers' folder is used",
        lambda key, value: fix(
            {key: None},
            "unset it",
            alt=fix({"logging.report_to": [*chosen, "wandb"]}, "or mlflow, trackio: a tracker"),
        ),
        ("logging.report_to", "logging.tensorboard", "experiment"),
    )


@validator
def distributed_settings_on_one_rank(cfg: DictConfig) -> Iterator[Problem]:
    """One process forms no process group: the collectives' backend and time limit are
    read only when a launcher starts several ranks (torchrun, a SLURM sweep)."""
    if world_size(cfg) > 1:
        return
    keys = ["distributed.backend", "distributed.timeout_s"]
    yield from _inert(
        cfg,
        [
            k
            for k in keys
            if _plain(OmegaConf.select(cfg, k)) != _plain(schema_default(RunConfig, k))
        ],
        "the run is one process (no torchrun WORLD_SIZE, no multi-rank launcher, "
        "distributed.world_size null or 1), which forms no process group",
        "no collective uses it",
        lambda key, value: fix(
            {key: schema_default(RunConfig, key)},
            "the default, what one process does",
            alt=fix(note="launch several ranks: torchrun --nproc_per_node=2 -m art_hydra ..."),
        ),
        ("distributed.world_size", "hydra/launcher", "experiment"),
    )


#: The settings FSDP2 is given (distributed.fsdp.*), read only by a sharded run.
FSDP_KEYS = ("distributed.fsdp.reshard_after_forward", "distributed.fsdp.cpu_offload")


@validator
def sharding_settings_nothing_shards(cfg: DictConfig) -> Iterator[Problem]:
    """distributed.strategy=fsdp shards over the ranks: one rank holds everything whole
    and trains as one process (engine/distributed.py shards only on several ranks), so
    the strategy and FSDP's settings do nothing there; under strategy=ddp on several
    ranks FSDP's settings do nothing."""
    causes = ("distributed.strategy", "distributed.world_size", "hydra/launcher", "experiment")
    if sharded(cfg):
        return
    if world_size(cfg) == 1:
        yield from _inert(
            cfg,
            _changed(cfg, ["distributed.strategy", *FSDP_KEYS]),
            "the run is one process (no torchrun WORLD_SIZE, no multi-rank launcher, "
            "distributed.world_size null or 1): FSDP shards over the ranks, and one rank "
            "holds the whole model and trains as one process",
            "nothing is sharded",
            lambda key, value: _back_to_default(
                key,
                value,
                fix(note="launch several ranks: torchrun --nproc_per_node=2 -m art_hydra ..."),
            ),
            causes,
        )
        return
    yield from _inert(
        cfg,
        _changed(cfg, list(FSDP_KEYS)),
        f"distributed.strategy={cfg.distributed.strategy.value} keeps a whole copy of the "
        "model on every rank",
        "FSDP's settings (distributed.fsdp.*) are not used",
        lambda key, value: fix(
            {"distributed.strategy": DistStrategy.fsdp.value}, alt=_back_to_default(key, value)
        ),
        causes,
    )


def _changed(cfg: DictConfig, keys: list[str]) -> list[str]:
    """The ``keys`` whose value differs from the schema's default: setting a key to what
    the run does without it is harmless, and the default is each rule's own fix."""
    return [
        k
        for k in keys
        if _plain(OmegaConf.select(cfg, k, throw_on_missing=False))
        != _plain(schema_default(RunConfig, k))
    ]


def _back_to_default(key: str, value: Any, alt: Any = None) -> Any:
    return fix({key: schema_default(RunConfig, key)}, "the default", alt=alt or _drop(key, value))


#: What makes the whole ``rollout`` section inert, and each of its keys.
_VLLM = "rollout.vllm"


@validator
def rollout_settings_the_run_never_reads(cfg: DictConfig) -> Iterator[Problem]:
    """The rollout engine samples RL's rollouts (and RL's evaluation): SFT samples nothing
    to train on, and its evaluation generates with the built-in sampler on the policy
    (engine/evaluation.py: an SFT run hands it no engine). rollout.vllm.* is read only by
    rollout.engine=vllm, and then each key only where its choice applies
    (:func:`vllm_settings_its_choices_skip`)."""
    vllm_keys = [f"{_VLLM}.{k}" for k in cfg.rollout.vllm]
    if cfg.algorithm.name != AlgorithmName.rl:
        yield from _inert(
            cfg,
            _changed(cfg, ["rollout.engine", *vllm_keys]),
            "algorithm=sft trains on the reference answers and samples no rollouts; its "
            "evaluation generates with the built-in sampler on the policy",
            "no rollout engine starts and its settings (rollout.*) are not used",
            lambda key, value: _back_to_default(key, value, fix({"algorithm": "rl"})),
            ("algorithm", "algorithm.name", "experiment"),
        )
        return
    if not is_vllm(cfg):
        yield from _inert(
            cfg,
            _changed(cfg, vllm_keys),
            f"rollout.engine={cfg.rollout.engine} samples the rollouts, not vLLM",
            "vLLM's settings (rollout.vllm.*) are not used",
            lambda key, value: _back_to_default(key, value, fix({"rollout.engine": "vllm"})),
            ("rollout.engine", "rollout", "experiment"),
        )
        return
    yield from vllm_settings_its_choices_skip(cfg)


def vllm_settings_its_choices_skip(cfg: DictConfig) -> Iterator[Problem]:
    """Under rollout.engine=vllm: the LoRA rank it serves where no adapter reaches it,
    the adapter's sync under full fine-tuning. (On a CPU vLLM reads the memory share
    too: the share of the machine's memory it reserves.)"""
    full = cfg.model.finetune == FinetuneMethod.full
    if full or cfg.rollout.vllm.lora_sync != "adapter":
        how = (
            "model.finetune=full trains no adapter"
            if full
            else "rollout.vllm.lora_sync=merged sends the engine weights with the adapter merged"
        )
        turn_on = {"model.finetune": "lora"} if full else {"rollout.vllm.lora_sync": "adapter"}
        yield from _inert(
            cfg,
            _changed(cfg, [f"{_VLLM}.max_lora_rank"]),
            f"{how}: no LoRA adapter reaches the engine",
            "the engine serves no LoRA and its largest rank is not used",
            lambda key, value: _back_to_default(key, value, fix(turn_on)),
            ("model.finetune", "model", f"{_VLLM}.lora_sync", "rollout", "experiment"),
        )
    if full:
        yield from _inert(
            cfg,
            _changed(cfg, [f"{_VLLM}.lora_sync"]),
            "model.finetune=full trains every weight with no adapter, and the engine is "
            "sent those weights after each step",
            "how an adapter would reach the engine is not used",
            lambda key, value: fix({"model.finetune": "lora"}, alt=_back_to_default(key, value)),
            ("model.finetune", "model", "experiment"),
        )


@validator
def importance_sampling_mode_without_a_cap(cfg: DictConfig) -> Iterator[Problem]:
    """rl.importance_sampling_mode says how rl.importance_sampling_cap corrects the
    sampler/trainer gap; with no cap there is no correction to shape (rl/losses.py reads
    the mode only with a cap). Under SFT the rl.* rule reports it."""
    if cfg.algorithm.name != AlgorithmName.rl or cfg.rl.importance_sampling_cap is not None:
        return
    yield from _inert(
        cfg,
        _changed(cfg, ["rl.importance_sampling_mode"]),
        "rl.importance_sampling_cap is null: no importance-sampling correction is applied "
        "(the sampling_mismatch metrics still report the gap)",
        "the correction's mode is not used",
        lambda key, value: fix(
            {"rl.importance_sampling_cap": 2.0},
            "correct the gap in this mode (TRL's default cap)",
            alt=_back_to_default(key, value),
        ),
        ("rl.importance_sampling_cap", "experiment"),
    )


@validator
def generator_settings_with_a_file_task(cfg: DictConfig) -> Iterator[Problem]:
    """A file task reads its examples from task.path: the generator's settings do nothing."""
    task = cfg.task
    if task.source == TaskSource.generated:
        return
    yield from _inert(
        cfg,
        ["task.num_examples", "task.params", "task.generator"],
        f"task.source={task.source.name} reads every example from task.path ({task.path})",
        "the generator's settings are not used",
        _drop,
        ("task", "task.source", "experiment"),
    )


@validator
def dataset_settings_without_a_dataset(cfg: DictConfig) -> Iterator[Problem]:
    """task.split and task.columns choose what task=dataset reads: other sources have
    fixed layouts (a generator's examples, a JSONL file's prompt/answer keys)."""
    task = cfg.task
    if task.source == TaskSource.dataset:
        return
    yield from _inert(
        cfg,
        ["task.split", "task.columns", "task.allow_remote_data"],
        f"task.source={task.source.name} has no splits, column mapping or remote data files "
        "(only task=dataset)",
        "the dataset's split, columns and remote files are not used",
        _drop,
        ("task", "task.source", "experiment"),
    )


@validator
def loss_settings_the_loss_does_not_read(cfg: DictConfig) -> Iterator[Problem]:
    """Each policy loss declares the ``rl.*`` settings it reads (its registration); the
    others of :data:`LOSS_SETTINGS` are inert under it (CISPO has no lower clip)."""
    from art_hydra.config.policy_losses import LOSS_SETTINGS, get_policy_loss, policy_losses

    loss = get_policy_loss(cfg.rl.loss_type) if cfg.algorithm.name == AlgorithmName.rl else None
    if loss is None:
        return
    for name in (s for s in LOSS_SETTINGS if s not in loss.settings):
        readers = [n for n, other in policy_losses().items() if name in other.settings]
        yield from _inert(
            cfg,
            [f"rl.{name}"],
            f"rl.loss_type={loss.name} reads only "
            + (", ".join(f"rl.{s}" for s in loss.settings) or "no clip setting")
            + (f" ({loss.help.rstrip('.')})" if loss.help else ""),
            f"rl.{name} is not used",
            lambda key, value, to=readers: (
                fix({"rl.loss_type": to[0]}, alt=_drop(key, value)) if to else _drop(key, value)
            ),
            ("rl.loss_type", "experiment"),
        )


@validator
def paths_that_would_be_ignored(cfg: DictConfig) -> Iterator[Problem]:
    """A data file or model folder the run would not read is surely a mistake: the run
    would train on the generator, or on the built-in tiny model, instead."""
    task, model = cfg.task, cfg.model
    if task.source == TaskSource.generated and task.path is not None:
        yield Problem(
            "task.path",
            task.path,
            f"names a data file the run never reads: task.source=generated (task="
            f"{task.name}) trains on the generator {task.generator}, not on this file.",
            fix({"task": "jsonl", "task.path": task.path}, "read the file"),
        )
    if model.source == ModelSource.tiny and looks_like_a_model_path(str(model.name)):
        yield Problem(
            "model.name",
            model.name,
            "is a path or hub id, but model.source=tiny builds the small built-in model and "
            "reads nothing from it (model.name is only its label). Choose the pretrained "
            "option, which loads it (and brings training settings for a real model).",
            fix({"model": "pretrained", "model.name": model.name}),
        )


def looks_like_a_model_path(name: str) -> bool:
    """A folder path or a hub id (``org/name``), not a label: a separator, a start that
    only a path has (``~``, ``.``), a model folder of that name right here, or a hub
    model of that name in the local cache."""
    if "/" in name or "\\" in name or name.startswith(("~", ".")):
        return True
    if os.path.isfile(os.path.join(name, "config.json")):
        return True
    # A hub id of the old, owner-less kind (gpt2, distilgpt2) that is in the local cache.
    home = os.environ.get("HF_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "huggingface"
    )
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")
    return os.path.isdir(os.path.join(cache, f"models--{name}", "snapshots"))


@validator
def model_settings_the_source_ignores(cfg: DictConfig) -> Iterator[Problem]:
    """model.tiny.* shapes only the built-in model; a hub revision or remote code only a
    pretrained one."""
    model = cfg.model
    if model.source == ModelSource.pretrained:
        yield from _inert(
            cfg,
            ["model.tiny"],
            f"model.source=pretrained loads {model.name}",
            "the built-in tiny model's shape (model.tiny.*) is not used",
            _drop,
            ("model", "model.source", "experiment"),
        )
        return
    for key in ("model.revision", "model.trust_remote_code"):
        value = OmegaConf.select(cfg, key)
        crossed = _crossed(key, ("model", "model.source", "experiment"))
        if value not in (None, False) and user_set(cfg, key) and not crossed:
            yield _warning(
                key,
                value,
                "is never read: model.source=tiny builds the model locally, with no hub "
                "download and no model code. The value does nothing.",
                _drop(key, value),
            )


#: The tiny model's output head (an untied Linear; conf/model/tiny.yaml saves it).
TINY_HEAD = "lm_head"


@validator
def lora_on_the_tiny_model_with_a_frozen_head(cfg: DictConfig) -> Iterator[Problem]:
    """The tiny model is built from random weights: LoRA adapters over it learn nothing
    through a head frozen at its random start (docs/run.md). model=tiny trains the head in
    full beside the adapters (modules_to_save=[lm_head]); a list without it cannot learn."""
    model = cfg.model
    if model.source != ModelSource.tiny or model.finetune != FinetuneMethod.lora:
        return
    saved = [str(m) for m in model.lora.modules_to_save]
    if TINY_HEAD in saved or _crossed("model.lora.modules_to_save", ("model", "experiment")):
        return
    yield _warning(
        "model.lora.modules_to_save",
        saved,
        f"leaves the tiny model's head ({TINY_HEAD}) frozen at its random initialisation: "
        "model.source=tiny builds the model from random weights, and LoRA adapters under a "
        "random frozen head cannot learn the task (its loss stays near where it starts).",
        fix(
            {"model.lora.modules_to_save": [*saved, TINY_HEAD]},
            "train the head in full beside the adapters",
            alt=fix({"model.finetune": "full"}),
        ),
    )


@validator
def tiny_settings_in_a_pretrained_run(cfg: DictConfig) -> Iterator[Problem]:
    """model=tiny with model.source=pretrained keeps the tiny model's training settings
    (a learning rate 100 times a LoRA one, full fine-tuning, 64 positions, a head trained
    in full): a real model would train with settings made for a 140k-parameter toy."""
    leaked = leaked_tiny_settings(cfg)
    if not leaked:
        return
    shown = ", ".join(f"{k}={_show(v)}" for k, v in leaked)
    name = cfg.model.name
    yield _warning(
        "model.source",
        "pretrained",
        f"trains {name} with the tiny model's settings (model=tiny): {shown}. They were "
        "chosen for a 140k-parameter model built from scratch, not for pretrained weights.",
        fix({"model": "pretrained", "model.name": name}, "a pretrained model's settings"),
    )


def leaked_tiny_settings(cfg: DictConfig) -> list[tuple[str, Any]]:
    """The tiny option's settings a pretrained run keeps (empty: none, or not a pretrained
    run on model=tiny), as ``(key, value)``, the ones the user set on purpose left out."""
    if cfg.model.source != ModelSource.pretrained:
        return []
    origins = _origins.get()
    if origins is not None and origins.shipped_choice("model") != TINY:
        return []
    leaked = [
        (key, value)
        for key, value in tiny_settings().items()
        if key not in ("model.name", "model.source")
        and _plain(OmegaConf.select(cfg, key, throw_on_missing=False)) == value
        and not _on_purpose(key)
    ]
    if (origins is None and len(leaked) < 3) or not leaked:
        return []  # without the record, only the tiny option's whole set tells
    if not _on_purpose("model.max_seq_length"):
        # Its positions follow the budgets (a resolver), from at least 64: the toy's room.
        leaked.append(("model.max_seq_length", cfg.model.max_seq_length))
    return leaked


def _on_purpose(key: str) -> bool:
    """Set by the command line or the user's own file (no guessing from values)."""
    hand = current_hand()
    origins = _origins.get()
    if origins is not None:
        return origins.user_set(key)
    return hand is not None and hand.set(key)


@functools.cache
def tiny_settings() -> dict[str, Any]:
    """What model=tiny (conf/model/tiny.yaml) and its training file set, by key."""
    root = Path(_conf_folder())
    found: dict[str, Any] = {}
    for path in (root / "model" / f"{TINY}.yaml", root / "training" / f"{TINY}.yaml"):
        try:
            content = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except Exception:
            continue
        for key, value in _leaves(content, ""):
            if not (isinstance(value, str) and "${" in value):
                found[key] = _plain(value)
    return found


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_show(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


#: The highest learning rate that looks meant for full fine-tuning of pretrained weights;
#: LoRA rates (1e-5 and up, the schema's default among them) are larger.
FULL_FINETUNING_RATE = 5e-6


@validator
def lora_rate_under_full_finetuning(cfg: DictConfig) -> Iterator[Problem]:
    """Full fine-tuning of pretrained weights at a rate made for LoRA adapters (the
    schema's default, when no training file of the model sets one) overwrites what the
    model knows within a few steps. The shipped options lower it by themselves
    (conf/training/); a rate the user chose is theirs."""
    model, rate = cfg.model, cfg.trainer.learning_rate
    if model.source != ModelSource.pretrained or model.finetune != FinetuneMethod.full:
        return
    if leaked_tiny_settings(cfg):
        return  # the tiny option's settings are reported as a whole
    if rate <= FULL_FINETUNING_RATE or user_set(cfg, "trainer.learning_rate"):
        return
    yield _warning(
        "trainer.learning_rate",
        rate,
        f"is a learning rate for LoRA adapters, and model.finetune=full trains every weight "
        f"of {model.name}: at {rate:g} full fine-tuning overwrites much of what the model "
        "knows; full fine-tuning of pretrained weights usually takes about 1e-6.",
        fix({"trainer.learning_rate": 1e-6}, alt=fix({"model.finetune": "lora"})),
    )


#: The keys only a multi-turn tool-using task reads.
TOOL_KEYS = ("task.tool_parser", "rl.max_tool_calls", "timeouts.tool_s")


@validator
def tool_settings_without_tools(cfg: DictConfig) -> Iterator[Problem]:
    """The tool-call format, the most tool calls and the tool time limit are read only by
    the multi-turn loop, which runs when the task has an environment or tools. (Under
    SFT, rl.max_tool_calls is reported by the rl.* rule.)"""
    if cfg.task.get("environment") or cfg.task.get("tools"):
        return
    rl = cfg.algorithm.name == AlgorithmName.rl
    keys = [k for k in TOOL_KEYS if rl or not k.startswith("rl.")]
    yield from _inert(
        cfg,
        _changed(cfg, keys),
        "the task has no environment and no tools (task.environment, task.tools): every "
        "completion is one turn with no tool call",
        "no tool is ever called",
        lambda key, value: _back_to_default(
            key, value, fix({"task.tools": ["my_module.my_tool"]}, "give the model a tool")
        ),
        ("task.environment", "task.tools", "task", "experiment"),
    )


@validator
def warm_start_rate_without_warm_start(cfg: DictConfig) -> Iterator[Problem]:
    """The warm start's learning rate is read only by a warm start (RL with
    rl.sft_warm_start_steps > 0; under SFT the rl.* rule reports it)."""
    if cfg.algorithm.name != AlgorithmName.rl or cfg.rl.sft_warm_start_steps > 0:
        return
    yield from _inert(
        cfg,
        _changed(cfg, ["rl.sft_warm_start_learning_rate"]),
        "rl.sft_warm_start_steps=0: the run has no SFT warm start",
        "no warm start runs at that rate",
        lambda key, value: _back_to_default(
            key, value, fix({"rl.sft_warm_start_steps": 100}, "warm-start on demonstrations")
        ),
        ("rl.sft_warm_start_steps", "experiment"),
    )
