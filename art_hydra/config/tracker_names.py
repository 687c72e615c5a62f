"""The trackers ``logging.report_to`` may name, the library each needs and its extra: the
one list of tracker names, which the schema's help and default, the validators, the
pre-flight and :mod:`art_hydra.trackers` (one class registered per name here) all read.

On the compose/validate path: it imports no tracker library, and nothing of art_hydra
(the schema imports it for ``logging.report_to``'s help and default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

#: ``logging.report_to``'s word for "no tracker" (TensorBoard included).
NONE = "none"

#: The default tracker, which ``logging.tensorboard`` (the older switch) adds or drops.
TENSORBOARD = "tensorboard"

#: Tracker name -> (the module its library installs, the art-hydra extra that brings it;
#: None: a core dependency), in the order reports list them.
LIBRARIES: dict[str, tuple[str, str | None]] = {
    TENSORBOARD: ("tensorboard", None),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "trackio": ("trackio", "trackio"),
}


class LoggingSection(Protocol):
    """What is read here of the ``logging`` section: the typed one, or its DictConfig
    node (the schema imports this module, so it is not named by its class)."""

    @property
    def report_to(self) -> Sequence[Any] | None: ...

    @property
    def tensorboard(self) -> bool | None: ...

    @property
    def project(self) -> str | None: ...


def install_hint(name: str) -> str:
    """The pip command that installs tracker ``name``'s library with art-hydra."""
    module, extra = LIBRARIES[name]
    return f'pip install "art-hydra[{extra}]"' if extra else f"pip install {module}"


def chosen_trackers(logging_cfg: LoggingSection) -> list[str]:
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


def project_name(logging_cfg: LoggingSection, task_name: str) -> str:
    """``logging.project``, else ``art-hydra-<task>``."""
    return str(logging_cfg.project) if logging_cfg.project else f"art-hydra-{task_name}"
