"""A sweep's points as the pre-flight checks them, whichever plugin checks them: with the
user's hand from the command line, on the devices where the jobs will run, with the
ranks each job starts; and what a refused point leaves in its folder."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra import moved
from art_hydra.config.problems import Problem, errors, format_report
from art_hydra.config.trust import Hand, hand_of

log = moved.logger(__name__)  # the name it logged under before the move


def point_checker(loader: Any, config: DictConfig) -> Any:
    """The checker of a sweep's points (:class:`~art_hydra.sweeps.preflight.PointChecker`),
    with the user's hand from the command line; a SLURM job runs on the cluster's nodes,
    whose GPUs the job checks itself."""
    from art_hydra.sweeps.preflight import PointChecker

    here = not target_of(config.hydra.launcher).endswith("SlurmLauncher")
    return PointChecker(loader, config, sweep_hand(config), devices_here=here)


def sweep_hand(config: DictConfig) -> Hand:
    """What the user set by hand for the sweep: the command line, not sweeper params from a file."""
    given: Any = OmegaConf.to_container(config.hydra.overrides, resolve=False)
    choices = set(config.hydra.runtime.choices)
    return hand_of([*given["hydra"], *given["task"]], lambda name: name in choices)


def ranks_per_job(launcher: Any) -> int | None:
    """Processes a launcher starts for each job: nodes x tasks_per_node for submitit's
    launchers (each task one rank), None for launchers that run a job as one process."""
    if "hydra_submitit_launcher" not in target_of(launcher):
        return None
    nodes = OmegaConf.select(launcher, "nodes", default=1) or 1
    tasks = OmegaConf.select(launcher, "tasks_per_node", default=1) or 1
    return int(nodes) * int(tasks)


def target_of(node: Any) -> str:
    """The dotted class a Hydra plugin node names (empty: none)."""
    return str(OmegaConf.select(node, "_target_", default="") or "")


def checked_by_the_sweeper(config: DictConfig) -> bool:
    """Whether the sweep's sweeper is art_hydra's pre-flight sweeper, which checks the
    whole grid itself (and records the sweep)."""
    return "art_hydra_preflight" in target_of(config.hydra.sweeper)


def record_refusal(folder: str, num: int, point: list[str], problems: list[Problem]) -> None:
    """The refused point's folder records why it never ran (nothing else is written)."""
    from art_hydra.engine.result import write_refused_result

    causes = "; ".join(f"{p.key} = {p.value}" for p in errors(problems))
    header = f"Point #{num} was not launched ({causes}):"
    text = format_report(errors(problems), header=header, footer=None)
    try:
        write_refused_result(folder, point, text, num)
    except OSError as exc:
        log.warning("could not record the refusal of point #%d in %s: %s", num, folder, exc)
