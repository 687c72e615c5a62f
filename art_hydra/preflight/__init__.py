"""The world pre-flight: what only files and the environment can decide, before any model.

It runs after composition (in the CLI before Hydra creates the run folder, in each sweep
point's pre-flight, in every job and in ``train(cfg)``), imports no torch, and reports
in the same format as composition: the reward and generator resolve through the
allowlist, are functions and accept their arguments; the data streams cleanly, every
line with what the algorithm and reward need; the tiny model's character tokenizer
says whether prompts and answers fit their budgets; a local model folder holds a model
with safetensors weights; Unsloth is installed when chosen; a GPU asked for is there;
and the run folder is in the state the run expects (fresh, or resumable with the same
config; under ``resume=auto`` either, or finished). A sweep's folder is checked once
before its first job (:func:`sweep_folder_problems`), and a sweep job's fixes name
``hydra.sweep.dir``, the key that chooses its folder.

This is the front its callers import from; each part lives in the module named for it:

- :mod:`.runner`: the registered world checks run on a config, and the report built;
- :mod:`.world_check_registry`: how a check registers (``@world_check``);
- :mod:`.task` (with :mod:`.rewards`, :mod:`.generator`, :mod:`.lengths`),
  :mod:`.model` (with :mod:`.hub`), :mod:`.devices`, :mod:`.trackers`,
  :mod:`.evaluation`: art_hydra's own checks, in the order they report;
- :mod:`.common`: what those checks share;
- :mod:`.folders` and :mod:`.resume`: the run folder, and what ``resume`` expects of it;
- :mod:`.sweep_folder`: a sweep's folder, checked once before its first job.
"""

from __future__ import annotations

from art_hydra.preflight.devices import backend_problems, cuda_present, declared_backend_problems
from art_hydra.preflight.folders import (
    busy_folder_problems,
    creation_refusal,
    for_sweep,
    run_folder_problems,
)
from art_hydra.preflight.runner import (
    ENVIRONMENT_SECTIONS,
    add_world_problems,
    environment_problems,
    environment_sections,
    folder_problems,
    strictly,
    world_problems,
)
from art_hydra.preflight.sweep_folder import sweep_folder_problems, sweep_signature
from art_hydra.preflight.world_check_registry import (
    WorldCheck,
    registered_world_checks,
    world_check,
)

__all__ = [
    "ENVIRONMENT_SECTIONS",
    "WorldCheck",
    "add_world_problems",
    "backend_problems",
    "busy_folder_problems",
    "creation_refusal",
    "cuda_present",
    "declared_backend_problems",
    "environment_problems",
    "environment_sections",
    "folder_problems",
    "for_sweep",
    "registered_world_checks",
    "run_folder_problems",
    "strictly",
    "sweep_folder_problems",
    "sweep_signature",
    "world_check",
    "world_problems",
]
