"""The ``rollout`` section's rules: what an engine can run, decided from the config alone.

Each rule refuses a combination that would fail when the engine starts or first
generates, or warns where it works but not as the user may think. What only files and
the machine decide (the engine installed, the model's family and head size, its
positions, memory) is the world pre-flight's (:mod:`art_hydra.preflight.rollout_engine`).
The list of both, with the engine's own error each replaces, is in the README
("Rollout engines").

Plain Python on the compose path: no torch, no vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig

from art_hydra.config import eval_rules
from art_hydra.config.launch_plan import world_size
from art_hydra.config.problems import Problem, Severity, fix, placeholder
from art_hydra.config.rollout_engines import RolloutEngineDecl, get_rollout_engine
from art_hydra.config.schema import AlgorithmName, Device, FinetuneMethod, ModelSource
from art_hydra.config.validator_registry import validator

#: The LoRA ranks vLLM's engine accepts as ``max_lora_rank`` (its ``MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

#: The temperatures vLLM samples at as asked: it refuses one above the first and raises
#: one below the second to it (its SamplingParams checks, 0.32).
VLLM_MAX_TEMPERATURE, VLLM_MIN_TEMPERATURE = 2.0, 1e-2

#: The built-in engine: what a refused engine falls back to.
TORCH = "torch"


def engine_of(cfg: Any) -> RolloutEngineDecl | None:
    """The declaration of the engine ``rollout.engine`` names (None: not registered, which
    the bound walker reports)."""
    return get_rollout_engine(cfg.rollout.engine)


def is_vllm(cfg: Any) -> bool:
    return str(cfg.rollout.engine) == "vllm"


def rollout_budget(cfg: Any) -> int:
    """The longest sequence an engine must hold: the prompt budget plus the longest
    completion that training or evaluation asks for."""
    completion = cfg.rl.max_completion_length
    if eval_rules.enabled(cfg) and cfg.eval.max_completion_length is not None:
        completion = max(completion, cfg.eval.max_completion_length)
    return cfg.rl.max_prompt_length + completion


def engine_max_model_len(cfg: Any) -> int:
    """``rollout.vllm.max_model_len``, or what the run needs of it."""
    return cfg.rollout.vllm.max_model_len or rollout_budget(cfg)


def engine_lora_rank(cfg: Any) -> int:
    """``rollout.vllm.max_lora_rank``, or the smallest rank vLLM accepts that holds
    ``model.lora.r``."""
    chosen = cfg.rollout.vllm.max_lora_rank
    return int(chosen) if chosen is not None else engine_lora_rank_for(cfg.model.lora.r)


def sleeps(setting: bool | None, on_cuda: bool, overlap: bool) -> bool:
    """Whether the engine sleeps while the trainer steps: as set, or (null) where the
    device supports it and rollouts do not overlap training."""
    if setting is not None:
        return bool(setting)
    return on_cuda and not overlap


def _rl(cfg: DictConfig) -> bool:
    return cfg.algorithm.name == AlgorithmName.rl


def _back_to_torch() -> Any:
    return fix({"rollout.engine": TORCH}, "the built-in sampler, which has no such limit")


@validator
def engine_runs_this_setup(cfg: DictConfig) -> Iterator[Problem]:
    """What an engine's declaration says it cannot do: the built-in tiny model (an engine
    that loads a model folder), several ranks, overlapped rollouts, a backend it cannot
    run beside. Each is an error at engine start-up or a wrong run."""
    engine = engine_of(cfg)
    if engine is None or engine.in_process_policy:
        return
    key, name = "rollout.engine", engine.name
    if _rl(cfg) and engine.model_folder and cfg.model.source == ModelSource.tiny:
        yield Problem(
            key,
            name,
            f"{engine.words} loads the model from its folder, and model.source=tiny builds "
            "the tiny model in memory (its 16-wide heads are also below what the CPU "
            "attention kernel of vLLM runs).",
            fix(
                {"model": "pretrained", "model.name": placeholder("a model folder or hub id")},
                "a model folder, e.g. one art-hydra export wrote",
                alt=_back_to_torch(),
            ),
        )
    ranks = world_size(cfg)
    if _rl(cfg) and ranks > 1 and not engine.several_ranks:
        yield Problem(
            key,
            name,
            f"{engine.words} is colocated with one trainer process and syncs that "
            f"process's weights; this run has {ranks} ranks, each of which would start its "
            "own engine on the same device.",
            fix(
                {"rollout.engine": TORCH},
                "the built-in sampler, on every rank",
                alt=fix(note="launch one process (no torchrun; distributed.world_size=1)"),
            ),
        )
    if _rl(cfg) and cfg.rl.overlap_rollouts and not engine.overlap_rollouts:
        yield Problem(
            "rl.overlap_rollouts",
            True,
            f"overlapped rollouts need their old logprobs from a trainer-side copy of the "
            f"sampling policy, which {engine.words} (holding weights of its own) does not "
            "keep; the engine already samples apart from the trainer's weights.",
            fix({"rl.overlap_rollouts": False}, alt=_back_to_torch()),
        )
    for backend, why in engine.incompatible_backends:
        if str(cfg.backend.name) == backend and _rl(cfg):
            yield Problem(
                key,
                name,
                f"{engine.words} cannot run beside backend={backend}: {why}.",
                fix({"backend": TORCH}, alt=_back_to_torch()),
            )


@validator
def vllm_settings_fit_the_run(cfg: DictConfig) -> Iterator[Problem]:
    """vLLM's own limits that the config decides: the sequence it holds, the LoRA it
    serves, sleep mode's device, and the logprobs it reports."""
    if not is_vllm(cfg) or not _rl(cfg):
        return
    settings = cfg.rollout.vllm
    needed = rollout_budget(cfg)
    if settings.max_model_len is not None and settings.max_model_len < needed:
        yield Problem(
            "rollout.vllm.max_model_len",
            settings.max_model_len,
            f"a rollout holds up to {needed} tokens (rl.max_prompt_length + the longest "
            "completion of training or evaluation); vLLM refuses a prompt above its "
            "max_model_len and would cut completions short.",
            fix(
                {"rollout.vllm.max_model_len": needed},
                alt=fix({"rollout.vllm.max_model_len": None}),
            ),
        )
    yield from _lora_problems(cfg)
    if settings.sleep is True and cfg.backend.device == Device.cpu:
        yield Problem(
            "rollout.vllm.sleep",
            True,
            "vLLM's sleep mode frees GPU memory (CUDA only); on backend.device=cpu the "
            "engine refuses to start with it.",
            fix({"rollout.vllm.sleep": None}, "on where the device supports it"),
        )
    for key, temperature in _temperatures(cfg):
        if temperature > VLLM_MAX_TEMPERATURE or temperature < VLLM_MIN_TEMPERATURE:
            yield Problem(
                key,
                temperature,
                f"vLLM refuses a temperature above {VLLM_MAX_TEMPERATURE:g} at the first "
                f"generate, and raises one below {VLLM_MIN_TEMPERATURE:g} to that value "
                "without a word: it would sample from another distribution than the "
                "trainer's logprobs assume.",
                fix(
                    {key: min(max(temperature, VLLM_MIN_TEMPERATURE), VLLM_MAX_TEMPERATURE)},
                    alt=_back_to_torch(),
                ),
            )
    if cfg.rl.top_k > 0 or cfg.rl.top_p < 1.0:
        yield Problem(
            "rollout.engine",
            "vllm",
            f"with rl.top_k={cfg.rl.top_k} / rl.top_p={cfg.rl.top_p:g}, vLLM reports each "
            "token's logprob under the truncated distribution it drew from, while the "
            "trainer's is under the full one (see docs/precision.md): sampling_mismatch_* "
            "and rl.importance_sampling_cap see that gap too. It trains.",
            fix({"rl.top_k": 0, "rl.top_p": 1.0}, "no truncation: both sides agree"),
            severity=Severity.warning,
        )


def _lora_problems(cfg: DictConfig) -> Iterator[Problem]:
    """The adapter vLLM would serve (``lora_sync=adapter``): its rank within the engine's
    largest, which must be one vLLM accepts, and no modules trained in full beside it."""
    settings = cfg.rollout.vllm
    lora = cfg.model.finetune == FinetuneMethod.lora
    adapter = lora and settings.lora_sync == "adapter"
    rank = settings.max_lora_rank
    if adapter and rank is not None and rank not in VLLM_LORA_RANKS:
        above = engine_lora_rank_for(rank)
        yield Problem(
            "rollout.vllm.max_lora_rank",
            rank,
            f"vLLM accepts only {', '.join(map(str, VLLM_LORA_RANKS))} as its max_lora_rank.",
            fix(
                {"rollout.vllm.max_lora_rank": above}, alt=fix({"rollout.vllm.max_lora_rank": None})
            ),
        )
    elif adapter and rank is not None and rank < cfg.model.lora.r:
        yield Problem(
            "rollout.vllm.max_lora_rank",
            rank,
            f"the adapter has rank model.lora.r={cfg.model.lora.r}, above the engine's "
            "largest; vLLM refuses to load it at the first sync.",
            fix({"rollout.vllm.max_lora_rank": engine_lora_rank_for(cfg.model.lora.r)}),
        )
    if adapter and cfg.model.lora.r > VLLM_LORA_RANKS[-1]:
        yield Problem(
            "model.lora.r",
            cfg.model.lora.r,
            f"vLLM serves LoRA adapters up to rank {VLLM_LORA_RANKS[-1]}.",
            fix({"rollout.vllm.lora_sync": "merged"}, "load merged weights instead"),
        )
    if adapter and len(cfg.model.lora.modules_to_save):
        yield Problem(
            "model.lora.modules_to_save",
            list(cfg.model.lora.modules_to_save),
            "vLLM serves an adapter's low-rank layers only: modules trained in full beside "
            "it (modules_to_save) are refused when the adapter loads.",
            fix(
                {"rollout.vllm.lora_sync": "merged"},
                "send the base weights with the adapter merged, and the saved modules",
                alt=fix({"model.lora.modules_to_save": []}),
            ),
        )


def _temperatures(cfg: DictConfig) -> Iterator[tuple[str, float]]:
    """The temperatures the engine samples at: the rollouts', and sampled evaluation's."""
    yield "rl.temperature", cfg.rl.temperature
    if eval_rules.enabled(cfg) and cfg.eval.num_samples > 0:
        yield "eval.temperature", cfg.eval.temperature


def engine_lora_rank_for(r: int) -> int:
    """The smallest rank vLLM accepts that holds ``r``."""
    return next((v for v in VLLM_LORA_RANKS if v >= r), VLLM_LORA_RANKS[-1])
