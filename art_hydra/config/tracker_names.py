"""The trackers ``logging.report_to`` may name, the library each needs and its extra.

On the compose/validate path: the validators and the pre-flight read these names
without importing any tracker library (the engine's :mod:`art_hydra.trackers` holds the
code that does, and registers one class per name listed here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from art_hydra.config.schema import LoggingConfig

#: ``logging.report_to``'s word for "no tracker" (TensorBoard included).
NONE = "none"

#: Tracker name -> (the module its library installs, the art-hydra extra that brings it;
#: None: a core dependency).
LIBRARIES: dict[str, tuple[str, str | None]] = {
    "tensorboard": ("tensorboard", None),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "trackio": ("trackio", "trackio"),
}

TENSORBOARD = "tensorboard"


def install_hint(name: str) -> str:
    """The pip command that installs tracker ``name``'s library with art-hydra."""
    extra = LIBRARIES[name][1]
    return f'pip install "art-hydra[{extra}]"' if extra else "pip install tensorboard"


def chosen_trackers(logging_cfg: LoggingConfig) -> list[str]:
    """The trackers a run reports to: ``logging.report_to`` in its order, without
    ``none`` and duplicates, with ``logging.tensorboard`` true adding TensorBoard and
    false dropping it (its meaning before report_to existed; null follows report_to)."""
    names: list[str] = []
    for name in logging_cfg.report_to or []:
        name = str(name)
        if name != NONE and name not in names:
            names.append(name)
    switch = logging_cfg.tensorboard
    if switch is True and TENSORBOARD not in names:
        names.insert(0, TENSORBOARD)
    elif switch is False and TENSORBOARD in names:
        names.remove(TENSORBOARD)
    return names


def project_name(logging_cfg: LoggingConfig, task_name: str) -> str:
    """``logging.project``, else ``art-hydra-<task>``."""
    return str(logging_cfg.project) if logging_cfg.project else f"art-hydra-{task_name}"
