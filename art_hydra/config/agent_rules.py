"""The agent keys' rules (``task.environment``, ``task.tools``, ``task.tool_parser``),
decided from the config alone: no files, no imports of the user's code, no torch.

What only the code and the tokenizer decide (the class can be made, ``reset`` runs on
the first rows, every tool has a schema, the chat template renders tool turns and keeps
earlier turns unchanged, the budgets hold a tool call) is the world pre-flight's
(:mod:`art_hydra.preflight.environments`). Keys that do nothing without an environment or
tools are warned about by :mod:`art_hydra.config.inert`.
"""

from __future__ import annotations

from collections.abc import Iterator

from omegaconf import DictConfig

from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.targets import ART_HYDRA_ENVIRONMENTS, ART_HYDRA_TOOLS, refusal
from art_hydra.config.validator_registry import validator

#: Where the tool-call formats register (torch-free: json and re). Loaded by name, as a
#: plugin registry loads its built-in modules: the config layer imports no engine module.
PARSERS_MODULE = "art_hydra.engine.envs.parsers"


def tool_parser_names() -> tuple[str, ...]:
    """Every value ``task.tool_parser`` takes (the parsers module's ``parser_names()``:
    the registered formats, ``auto`` and ``transformers``)."""
    import importlib

    return tuple(importlib.import_module(PARSERS_MODULE).parser_names())


def _own_fix(key: str, role: str, own: frozenset[str]) -> object:
    shape = "Class" if role == "environment" else "function"
    return fix(
        {key: placeholder(f"my_module.My{shape}: your own, marked @{role}")},
        f"art_hydra's own: {', '.join(sorted(own))}",
    )


@validator
def agent_code_is_eligible(cfg: DictConfig) -> Iterator[Problem]:
    """``task.environment`` names its class in ``_target_`` (an entry without one makes
    nothing); the class and each ``task.tools`` entry may be named at all (never the
    standard library, a library such as numpy, or art_hydra's other code: decided
    without importing anything, as for rewards)."""
    task = cfg.task
    environment = task.get("environment") or {}
    if environment and not environment.get("_target_"):
        yield Problem(
            "task.environment",
            {str(k): v for k, v in environment.items()},
            "is set without _target_: the run makes one environment per rollout from the "
            "class _target_ names (the entry's other keys are its constructor's arguments).",
            fix(
                {"task.environment._target_": placeholder("my_module.MyEnv")},
                alt=fix({"task.environment": {}}, "no environment"),
            ),
        )
    elif environment:
        key = "task.environment._target_"
        why = refusal(environment._target_, key)
        if why is not None:
            yield Problem(
                key,
                environment._target_,
                f"the environment {why}",
                _own_fix(key, "environment", ART_HYDRA_ENVIRONMENTS),
            )
    for i, path in enumerate(task.get("tools") or ()):
        key = f"task.tools.{i}"
        why = refusal(path, key)
        if why is not None:
            yield Problem(key, path, f"the tool {why}", _own_fix(key, "tool", ART_HYDRA_TOOLS))


@validator
def tool_parser_is_known(cfg: DictConfig) -> Iterator[Problem]:
    """``task.tool_parser`` is one of the registered tool-call formats (the registry is
    torch-free: :mod:`art_hydra.engine.envs.parsers`)."""
    name = str(cfg.task.tool_parser)
    names = tool_parser_names()
    if name in names:
        return
    import difflib

    near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    yield Problem(
        "task.tool_parser",
        name,
        f"is not a tool-call format art_hydra knows (known: {', '.join(names)}); a parser "
        "of your own registers with art_hydra.engine.envs.parsers.register_tool_parser.",
        fix({"task.tool_parser": near[0] if near else "auto"}),
    )


@validator
def warm_start_under_a_lora_kl_anchor(cfg: DictConfig) -> Iterator[Problem]:
    """With LoRA the KL's reference is the base model with the adapters disabled, and
    the SFT warm start trains the adapters: rl.beta then pulls RL back towards the model
    *before* the warm start (full fine-tuning re-anchors the reference after it, as TRL's
    SFT-then-RL pipeline does). It runs, so it is a warning."""
    from art_hydra.config.problems import Kind, Severity
    from art_hydra.config.schema import AlgorithmName, FinetuneMethod

    rl = cfg.rl
    if cfg.algorithm.name != AlgorithmName.rl or not rl.sft_warm_start_steps or not rl.beta:
        return
    if cfg.model.finetune != FinetuneMethod.lora:
        return
    yield Problem(
        "rl.beta",
        rl.beta,
        f"anchors the policy to the reference, which under model.finetune=lora is the base "
        f"model with the adapters disabled; rl.sft_warm_start_steps={rl.sft_warm_start_steps} "
        "trains the adapters, so the KL pulls RL back towards the model before the warm "
        "start.",
        fix({"rl.beta": 0.0}, alt=fix({"model.finetune": "full"})),
        Kind.rule,
        Severity.warning,
    )
