"""The trackers' pre-flight: every tracker ``logging.report_to`` chose has its library
installed (looked up with ``importlib.util.find_spec``: nothing is imported), and W&B
has a way to run (offline, or online with an API key), before any model loads."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from omegaconf import DictConfig

from art_hydra.config.problems import Problem, fix
from art_hydra.config.tracker_names import LIBRARIES, NONE, chosen_trackers, install_hint
from art_hydra.preflight.common import world_problem

#: WANDB_MODE values that need no account.
_WANDB_LOCAL = ("offline", "disabled", "dryrun")


def _without(cfg: DictConfig, name: str) -> list[str]:
    rest = [n for n in chosen_trackers(cfg.logging) if n != name]
    return rest or [NONE]


def _wandb_key_known() -> bool:
    """Whether wandb can find an API key: WANDB_API_KEY, or an entry for W&B in the
    netrc file ``wandb login`` writes (read, never written)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return "wandb" in netrc.read_text(errors="replace")
    except OSError:
        return False


def tracker_problems(cfg: DictConfig) -> list[Problem]:
    """A missing tracker library (with the pip command that brings it), and W&B online
    with no API key."""
    problems: list[Problem] = []
    for name in chosen_trackers(cfg.logging):
        if name not in LIBRARIES:
            continue  # composition names it
        module = LIBRARIES[name][0]
        if importlib.util.find_spec(module) is None:
            problems.append(
                world_problem(
                    "logging.report_to",
                    name,
                    f"{name} is chosen, but its library ({module}) is not installed in this "
                    f"environment: install it with {install_hint(name)}.",
                    fix(
                        {"logging.report_to": _without(cfg, name)},
                        alt=fix(note=install_hint(name)),
                    ),
                )
            )
        elif name == "wandb":
            mode = os.environ.get("WANDB_MODE", "").lower()
            if mode not in _WANDB_LOCAL and not _wandb_key_known():
                problems.append(
                    world_problem(
                        "logging.report_to",
                        name,
                        "W&B would run online (WANDB_MODE is "
                        + (f"{mode!r}" if mode else "unset")
                        + ") but no API key is set (WANDB_API_KEY, or `wandb login`): wandb "
                        "would fail, or wait for one, at start. Offline runs need no "
                        "account and are uploaded later with `wandb sync`.",
                        fix(
                            {"logging.report_to": _without(cfg, name)},
                            alt=fix(
                                note="export WANDB_MODE=offline, or export WANDB_API_KEY=<key>"
                            ),
                        ),
                    )
                )
    return problems
