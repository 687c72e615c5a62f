"""The backend's world check: what the chosen backend needs of this machine (its modules
installed, a GPU where it is made for one, its own declared checks), and whether the
ranks the environment announces can meet, decided without importing torch.

A launcher that runs jobs elsewhere (SLURM from a login node) passes
``devices_here=False``: the devices are then the job's to check.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from art_hydra.config import fields
from art_hydra.config.backends import get_backend
from art_hydra.config.problems import Problem, fix
from art_hydra.config.schema import Device, DistBackend
from art_hydra.preflight.common import world_problem
from art_hydra.preflight.world_check_registry import WorldCheck, crashed


def cuda_present() -> bool:
    """Whether torch would see a CUDA GPU, decided without importing torch: a CUDA build
    of torch, visible devices, and an NVIDIA driver with a device node."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    version = Path(spec.origin).with_name("version.py")
    try:
        match = re.search(r"^cuda\b[^=]*=\s*(\S+)", version.read_text(), re.MULTILINE)
    except OSError:
        return False
    if match is None or match.group(1) == "None":
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


def declared_backend_problems(cfg: DictConfig, devices_here: bool = True) -> list[Problem]:
    """What the selected backend's declaration asks of this environment: the modules it
    requires are installed, a backend made for CUDA alone finds a GPU, and its own world
    checks (``register_backend(..., checks=...)``)."""
    backend = get_backend(cfg.backend.name)
    if backend is None:  # composition refused the name
        return []
    torch_backend = get_backend(fields.default("backend.name")) or backend
    instead = backend.override_to(torch_backend)
    problems: list[Problem] = []
    if not backend.installed:
        missing = [m for m in backend.requires if importlib.util.find_spec(m) is None]
        problems.append(
            world_problem(
                next(iter(backend.choose())),
                backend.name,
                f"{backend.words} is not installed in this environment"
                + (f" (no module {', '.join(missing)})." if not backend.title else "."),
                fix(instead, alt=fix(note=backend.install) if backend.install else None),
            )
        )
    elif (
        devices_here
        and "cpu" not in backend.devices
        and cfg.backend.device != Device.cuda
        and not cuda_present()
    ):
        problems.append(
            world_problem(
                "backend.device",
                cfg.backend.device.name,
                "no CUDA GPU is visible: "
                + (backend.cpu_note or f"{backend.words} is made for CUDA GPUs, not the CPU."),
                fix(instead, f"the same run without {backend.words}"),
                warning=True,
            )
        )
    for check in backend.checks:
        try:
            problems += check(cfg, devices_here) or ()
        except OmegaConfBaseException:
            raise  # a value no check could read: reported by the caller
        except Exception as exc:  # a plugin backend's bug is reported, art_hydra's own raises
            if backend.builtin:
                raise
            name = f"{backend.name}: {getattr(check, '__name__', check)}"
            problems.append(crashed(WorldCheck(name, check, ()), exc))
    return problems


def backend_problems(cfg: DictConfig, devices_here: bool = True) -> list[Problem]:
    backend = cfg.backend
    problems: list[Problem] = declared_backend_problems(cfg, devices_here)
    if devices_here and backend.device == Device.cuda and not cuda_present():
        problems.append(
            world_problem(
                "backend.device",
                "cuda",
                "no CUDA GPU is visible here (no CUDA build of torch, no NVIDIA device, or "
                "CUDA_VISIBLE_DEVICES hides them).",
                fix(
                    {"backend.device": fields.default("backend.device")},
                    "the GPU when there is one, else the CPU",
                ),
            )
        )
    problems += _collective_problems(cfg, devices_here)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if devices_here and backend.cpu_threads is not None and cores and backend.cpu_threads > cores:
        problems.append(
            world_problem(
                "backend.cpu_threads",
                backend.cpu_threads,
                f"this process may use {cores} core(s): more threads than cores take turns "
                "on them, and every parallel op waits for the one left out.",
                fix(
                    {"backend.cpu_threads": cores},
                    alt=fix({"backend.cpu_threads": fields.default("backend.cpu_threads")}),
                ),
                warning=True,
            )
        )
    return problems


#: What torch's env:// rendezvous reads besides WORLD_SIZE (torchrun and the SLURM
#: launcher's tasks set them all).
_RENDEZVOUS = ("RANK", "MASTER_ADDR", "MASTER_PORT")


def _collective_problems(cfg: DictConfig, devices_here: bool) -> list[Problem]:
    """The ranks the environment announces can meet: a WORLD_SIZE above 1 comes with the
    rest of torchrun's variables, and NCCL has CUDA devices to run on."""
    from art_hydra.config.launch_plan import torchrun_world_size, world_size

    problems: list[Problem] = []
    ranks = torchrun_world_size() or 1
    absent = [name for name in _RENDEZVOUS if not os.environ.get(name)]
    if ranks > 1 and absent:
        problems.append(
            world_problem(
                "distributed.world_size",
                f"WORLD_SIZE={ranks} (environment)",
                f"the environment says {ranks} ranks, but {', '.join(absent)} "
                f"{'is' if len(absent) == 1 else 'are'} not set: this process was not started "
                "by torchrun (or a SLURM task), so it cannot find the other ranks.",
                fix(
                    note=f"run without WORLD_SIZE (env -u WORLD_SIZE art-hydra ...), or start "
                    f"the ranks with torchrun --nproc_per_node={ranks} -m art_hydra ..."
                ),
            )
        )
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if ranks > 1 and value and not (value.isdigit() and int(value) < ranks):
            problems.append(
                world_problem(
                    "distributed.world_size",
                    f"{name}={value} (environment)",
                    f"is not a rank of WORLD_SIZE={ranks} (0 to {ranks - 1}): the launch "
                    "that set it did not describe this process's place among the ranks.",
                    fix(note=f"start the ranks with torchrun --nproc_per_node={ranks} ..."),
                )
            )
    nccl = cfg.distributed.backend == DistBackend.nccl
    if devices_here and nccl and cfg.backend.device == Device.auto and not cuda_present():
        # One process runs no collective: there the setting is only a trap for later.
        alone = world_size(cfg) == 1
        problems.append(
            world_problem(
                "distributed.backend",
                "nccl",
                "NCCL runs collectives between CUDA devices, and no CUDA GPU is visible here: "
                "backend.device=auto trains on the CPU"
                + (" (this run has one process, so nothing uses it yet)." if alone else "."),
                fix({"distributed.backend": "auto"}, "gloo on the CPU, nccl on GPUs"),
                warning=alone,
            )
        )
    return problems
