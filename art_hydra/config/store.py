"""Registration of the schema (and the pre-flight sweeper's settings) in Hydra's ConfigStore.

``conf/config.yaml`` starts its defaults list with ``art_hydra_schema``, so every
composed config is typed by :class:`~art_hydra.config.schema.RunConfig` and a wrong type
in any YAML file or override fails at composition; it also selects
``hydra/sweeper=preflight``, whose settings node is defined here. The sweeper class
itself lives in the ``hydra_plugins`` namespace (Hydra loads sweepers only from there)
and is registered by the entry points that launch jobs (the CLI and ``conf/__init__``),
never by this package.
"""

from __future__ import annotations

import functools
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from art_hydra.config.fields import key_help_text
from art_hydra.config.schema import RunConfig

#: Name of the schema node that ``conf/config.yaml`` puts first in its defaults list.
SCHEMA_NAME = "art_hydra_schema"


@dataclass
class PreflightSweeperConf:
    """Settings of ``hydra/sweeper=preflight`` (the default in art_hydra's conf)."""

    # The sweeper class Hydra instantiates.
    _target_: str = "hydra_plugins.art_hydra_preflight.preflight_sweeper.PreflightSweeper"
    # Jobs handed to the launcher at once; null launches all valid points in one batch.
    max_batch_size: int | None = None
    # Sweep definitions kept in config, e.g. {trainer.learning_rate: "1e-5,1e-4"}.
    params: dict[str, str] = field(default_factory=dict)
    # Launch the valid points and name the skipped ones, instead of launching nothing.
    skip_invalid: bool = False


_registered = False


def register_configs() -> None:
    """Store the schema and the sweeper settings once per process; later calls are free."""
    global _registered
    if _registered:
        return
    _registered = True
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=RunConfig, provider="art_hydra")
    store.store(
        group="hydra/sweeper", name="preflight", node=PreflightSweeperConf, provider="art_hydra"
    )


def job_record_name() -> str:
    """A job's ``hydra.output_subdir`` (``${art_hydra.job_record:}`` in
    conf/hydra/output/outputs.yaml): Hydra writes the job's record into this folder of
    the run folder, one per process, and the job renames it to ``.hydra`` only once it
    holds the folder's lock (art_hydra.runs.run_folder.adopt_hydra_record), so a job refused
    for a busy folder never overwrites the running job's record."""
    return f".hydra-pending-{os.getpid()}"


@functools.cache
def unique_name() -> str:
    """This process's mark in default folder names (``${art_hydra.unique:}`` in
    conf/hydra/output/outputs.yaml): its pid and a short random part, so two runs or
    sweeps started in the same second (on one host or several sharing a disk) never
    share a folder. Fixed for the life of the process, so every composition in it (the
    CLI's check, then Hydra's) names the same folder; the resolver is also cached per
    config, and Hydra copies that cache from the sweep's master config to each job's
    (pickled with it to joblib and SLURM workers), so a sweep's jobs all land in the
    one folder the master resolved."""
    return f"{os.getpid()}-{secrets.token_hex(2)}"


def _name(value: Any) -> str:
    """An enum's name or a plain value's text (a typed config passes enums to resolvers)."""
    return str(getattr(value, "name", value))


def sequence_room(algorithm: Any, prompt: Any, completion: Any, sft_length: Any, floor: Any) -> int:
    """``${art_hydra.room:...}`` (conf/model/tiny.yaml): the positions a locally built
    model needs for the run's token budgets, and at least ``floor``. RL needs prompt plus
    completion; SFT its longest example. The tiny model has no position limit of its own,
    so it grows to fit a file task's budgets instead of refusing them."""
    needed = int(sft_length) if _name(algorithm) == "sft" else int(prompt) + int(completion)
    return max(int(floor), needed)


def by_finetune(finetune: Any, lora: Any, full: Any) -> Any:
    """``${art_hydra.by_finetune:${model.finetune},<lora value>,<full value>}``
    (conf/training/): a value that follows the fine-tuning method, such as a learning
    rate (LoRA adapters take a rate about ten times higher than full fine-tuning)."""
    return full if _name(finetune) == "full" else lora


# At import: a launcher's worker process resolves the job's hydra node before any
# entry point runs, and it has imported this module with the task function.
OmegaConf.register_new_resolver("art_hydra.job_record", job_record_name, replace=True)
# ``art-hydra --help`` lists every key with its help (hydra.help.template in
# conf/config.yaml), read from the schema's field metadata.
OmegaConf.register_new_resolver("art_hydra.unique", unique_name, replace=True, use_cache=True)
OmegaConf.register_new_resolver("art_hydra.keys", key_help_text, replace=True)
# Values that follow other keys (conf/model/tiny.yaml, conf/training/).
OmegaConf.register_new_resolver("art_hydra.room", sequence_room, replace=True)
OmegaConf.register_new_resolver("art_hydra.by_finetune", by_finetune, replace=True)
