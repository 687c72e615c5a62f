"""What a run's objective may name: the metrics each algorithm logs, and how ``auto``
resolves (metric and direction).

A sweeper that optimises (Optuna, Ax, Nevergrad) reads one number per job: the
``objective`` section chooses it from the run's logged metrics. The catalogue lives in
the config layer, so the validator that refuses a metric an algorithm never logs reads
the same list as the run that computes the value (a test checks the catalogue against
the keys a real run writes to ``metrics.jsonl``). Plain Python, on the compose path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from art_hydra.config.schema import AlgorithmName, ObjectiveDirection, ObjectiveReduce

#: Every metric a step's record holds (``metrics.jsonl``), in the order it is written.
STEP_METRICS = (
    "reward_mean",
    "reward_std",
    "loss",
    "grad_norm",
    "learning_rate",
    "kl",
    "entropy",
    "clip_fraction",
    "zero_std_groups",
    "completion_length",
    "real_token_share",
    "tokens_per_s",
    "step_time_s",
)

#: Statistics of the RL loss a step's record holds beside :data:`STEP_METRICS` (the
#: trainer's ``StepResult.stats``): how far the sampler's logprobs of the trained tokens
#: are from the training side's (mean and largest absolute difference, in nats).
RL_STAT_METRICS = ("sampling_mismatch_mean", "sampling_mismatch_max")

#: Metrics a step records only under some settings (they come with the loss's further
#: statistics, ``StepResult.stats``): name -> (the setting that logs it, in words; whether
#: a composed config has it).
CONDITIONAL_METRICS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    # CISPO's capped tokens of either sign (clip_fraction counts A > 0 only, as TRL).
    "cispo_capped_fraction": (
        "algorithm=rl rl.loss_type=cispo",
        lambda cfg: _name(cfg.algorithm.name) == "rl" and _name(cfg.rl.loss_type) == "cispo",
    ),
    # The share of trained tokens a masking importance-sampling mode gave weight 0.
    "importance_sampling_masked_fraction": (
        "algorithm=rl rl.importance_sampling_cap set and rl.importance_sampling_mode="
        "token_mask or sequence_mask",
        lambda cfg: _importance_masked(cfg),
    ),
    # Multi-turn tool rollouts (task.environment or task.tools): per trajectory, the
    # tool calls and turns, the share of completion tokens masked, errors and seconds.
    **{
        name: (
            "algorithm=rl with task.environment or task.tools",
            lambda cfg: (
                _name(cfg.algorithm.name) == "rl"
                and bool(cfg.task.get("environment") or cfg.task.get("tools"))
            ),
        )
        for name in (
            "tool_calls_mean",
            "turns_mean",
            "masked_token_share",
            "tool_errors",
            "tool_time_s",
        )
    },
    # 1 when float16 loss scaling skipped the step (an infinite gradient), else 0.
    "step_skipped": ("model.dtype=float16 on backend=torch", lambda cfg: _loss_scaled(cfg)),
}


def _importance_masked(cfg: Any) -> bool:
    """Whether the run corrects the sampler/trainer gap by masking: a cap is set (the
    mode is read only then) and the mode drops tokens rather than truncating them."""
    if _name(cfg.algorithm.name) != "rl" or cfg.rl.importance_sampling_cap is None:
        return False
    return _name(cfg.rl.importance_sampling_mode).endswith("_mask")


def _loss_scaled(cfg: Any) -> bool:
    """Whether the run may train with float16 loss scaling: a backend that leaves precision
    to the trainer (not one that declares ``own_precision``, as Unsloth, which trains
    without a scaler) with float16, or with ``auto`` on a pretrained folder,
    whose own dtype (float16 or not) only the loaded checkpoint tells."""
    from art_hydra.config.backends import get_backend

    backend = get_backend(_name(cfg.backend.name))
    if backend is None or backend.own_precision:
        return False
    dtype = _name(cfg.model.dtype)
    return dtype == "float16" or (dtype == "auto" and _name(cfg.model.source) == "pretrained")


#: A reward's metric name: kept plain, since it becomes a metrics.jsonl key
#: (``reward/<name>/mean``) and a TensorBoard tag.
REWARD_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def reward_name(target: Any, name: Any = None) -> str:
    """A reward's name in the metrics: its ``name``, else its function's own name (the
    last part of its dotted path). The validators and the run name rewards alike."""
    return str(name) if name else str(target).rpartition(".")[2] or str(target)


def reward_metrics(task: Any) -> set[str]:
    """Each reward's own metrics (``task.rewards``, else the one ``task.reward``):
    ``reward/<name>/mean``, ``/std`` and ``/count``."""
    if len(task.rewards):
        names = [reward_name(e._target_, e.name) for e in task.rewards]
    else:
        names = [reward_name(task.reward._target_)]
    if task.get("environment"):  # its get_reward(), where the class has one
        names.append("environment")
    return {f"reward/{n}/{part}" for n in names for part in ("mean", "std", "count")}


#: What an SFT step has no value for (no rollouts, no rewards, no reference policy, no
#: clipped ratio): nothing an objective could compare, and no key of an SFT metric line
#: (:func:`art_hydra.engine.metrics.metric_line` drops them).
NOT_IN_SFT = frozenset(
    {"reward_mean", "reward_std", "zero_std_groups", "completion_length", "kl", "clip_fraction"}
)

#: The metrics where lower is better; ``direction=auto`` maximises every other one.
LOWER_IS_BETTER = frozenset(
    {
        "loss",
        "kl",
        "grad_norm",
        "clip_fraction",
        "zero_std_groups",
        "step_time_s",
        *RL_STAT_METRICS,
        "cispo_capped_fraction",
        "importance_sampling_masked_fraction",
        "step_skipped",
        "eval/loss",
        "tool_errors",
        "tool_time_s",
        "masked_token_share",
    }
)

#: ``metric=auto`` under each algorithm.
AUTO_METRIC = {AlgorithmName.rl: "reward_mean", AlgorithmName.sft: "loss"}


def logged_metrics(algorithm: AlgorithmName, cfg: Any = None) -> tuple[str, ...]:
    """The metrics ``algorithm`` logs with a value an objective can compare; with the
    composed ``cfg``, also the :data:`CONDITIONAL_METRICS` its settings log."""
    if algorithm == AlgorithmName.sft:
        return tuple(m for m in STEP_METRICS if m not in NOT_IN_SFT) + _conditional(cfg)
    return (*STEP_METRICS, *RL_STAT_METRICS, *_conditional(cfg))


def loss_metrics() -> dict[str, str]:
    """Statistics the registered policy losses declare -> the setting that logs each
    (``algorithm=rl rl.loss_type=<the first loss declaring it>``)."""
    from art_hydra.config.policy_losses import policy_losses

    found: dict[str, str] = {}
    for name, loss in policy_losses().items():
        for metric in loss.metrics:
            found.setdefault(metric, f"algorithm=rl rl.loss_type={name}")
    return found


def _conditional(cfg: Any) -> tuple[str, ...]:
    """The :data:`CONDITIONAL_METRICS` a composed ``cfg`` logs (none without one)."""
    if cfg is None:
        return ()
    found = [m for m, (_, logs) in CONDITIONAL_METRICS.items() if logs(cfg)]
    if _name(cfg.algorithm.name) == "rl":  # and those the chosen policy loss declares
        from art_hydra.config.policy_losses import get_policy_loss

        loss = get_policy_loss(cfg.rl.loss_type)
        found += [m for m in (loss.metrics if loss else ()) if m not in found]
    return tuple(found)


@dataclass(frozen=True)
class ObjectiveSpec:
    """The objective of one run, with ``auto`` resolved: plain values, as result.json
    records them."""

    metric: str
    reduce: str
    window: int
    direction: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "reduce": self.reduce,
            "window": self.window,
            "direction": self.direction,
        }


def _name(value: Any) -> str:
    return value.name if hasattr(value, "name") else str(value)


def resolve(objective: Any, algorithm: Any) -> ObjectiveSpec:
    """The objective section (``cfg.objective``) of a run of ``algorithm``, with
    ``metric=auto`` (reward_mean for RL, loss for SFT) and ``direction=auto`` (minimise
    :data:`LOWER_IS_BETTER`, maximise the rest) resolved."""
    algo = algorithm if isinstance(algorithm, AlgorithmName) else AlgorithmName(_name(algorithm))
    metric = str(objective.metric)
    if metric == "auto":
        metric = AUTO_METRIC[algo]
    direction = _name(objective.direction)
    if direction == ObjectiveDirection.auto.name:
        lower = metric in LOWER_IS_BETTER
        direction = (ObjectiveDirection.minimize if lower else ObjectiveDirection.maximize).name
    return ObjectiveSpec(metric, _name(objective.reduce), int(objective.window), direction)


def reduce_values(values: list[float], how: str) -> float:
    """``values`` (oldest first) reduced as ``objective.reduce`` says; NaN when empty."""
    if not values:
        return float("nan")
    if how == ObjectiveReduce.last.name:
        return values[-1]
    if how == ObjectiveReduce.mean.name:
        return sum(values) / len(values)
    if how == ObjectiveReduce.max.name:
        return max(values)
    if how == ObjectiveReduce.min.name:
        return min(values)
    names = [r.name for r in ObjectiveReduce]
    raise ValueError(f"objective.reduce={how!r}: expected one of {names}")
