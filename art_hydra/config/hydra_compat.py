"""Every private Hydra and OmegaConf call art_hydra makes, in one place.

Hydra 1.3 has no public API for composing exactly as its own entry point does, for
applying one override to a composed config, for telling a group from a key, or for
resolving ``${hydra:...}`` the way a job will see it. The functions below wrap the
internals that do it. They were written for the versions in :data:`WRITTEN_FOR`;
``tests/config/test_hydra_compat.py`` fails loudly on any other version, so an upgrade
is a deliberate act, not a silent breakage.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import hydra
import omegaconf
from hydra.core.config_loader import ConfigLoader
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

#: Release series this module was written and tested against.
WRITTEN_FOR = {"hydra-core": "1.3.", "omegaconf": "2.3."}

#: The private names used below, by module (the compatibility test checks each exists).
PRIVATE_NAMES = {
    "hydra._internal.utils": ("get_args_parser", "create_config_search_path"),
    "hydra._internal.config_loader_impl": ("ConfigLoaderImpl",),
    "hydra._internal.core_plugins.basic_sweeper": ("BasicSweeper",),
}


def installed_versions() -> dict[str, str]:
    return {"hydra-core": hydra.__version__, "omegaconf": omegaconf.__version__}


def unsupported_versions() -> list[str]:
    """Installed packages outside the series this module was written for."""
    return [
        f"{name} {version} (written for {WRITTEN_FOR[name]}x)"
        for name, version in installed_versions().items()
        if not version.startswith(WRITTEN_FOR[name])
    ]


def args_parser() -> Any:
    """Hydra's own command-line parser (the same flags and overrides its entry point reads)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


@functools.lru_cache(maxsize=8)
def make_loader(primary: str, config_dir: str | None = None) -> ConfigLoader:
    """A config loader with the search path Hydra's entry point builds (``config_dir`` is
    an absolute ``--config-dir``)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.utils import JobRuntime, setup_globals

    setup_globals()  # Hydra's resolvers (now:, hydra:), as inside a Hydra app
    search_path = create_config_search_path(primary)
    if config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{config_dir}",
            anchor=SearchPathQuery(provider="schema"),
        )
    runtime = JobRuntime.instance()
    if OmegaConf.is_missing(runtime.conf, "name"):
        runtime.set("name", "art_hydra")
    return ConfigLoaderImpl(config_search_path=search_path)


def is_group(loader: ConfigLoader, name: str) -> bool:
    """Whether an override's key names a config group (rather than a config value)."""
    return name == "hydra.searchpath" or bool(loader.repository.group_exists(name))  # type: ignore[attr-defined]


def apply_override(cfg: DictConfig, override: Override) -> None:
    """Apply one parsed value override to a composed config, as Hydra's loader does."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config([override], cfg)


def raw_value(node: DictConfig | Any, key: Any) -> Any:
    """A value as written, interpolations unresolved (for reports)."""
    child = node._get_node(key)
    return child._value() if child is not None else None


def run_mode(loader: ConfigLoader, config_name: str | None, overrides: list[str]) -> RunMode:
    """RUN or MULTIRUN, decided as Hydra's entry point decides it (``hydra.mode`` in the
    config or an override), when ``--multirun`` is not given."""
    try:
        cfg = loader.load_configuration(
            config_name, overrides, run_mode=RunMode.MULTIRUN, validate_sweep_overrides=False
        )
    except Exception:
        return RunMode.RUN  # composition fails either way; the check reports why
    mode = cfg.hydra.mode
    return mode if isinstance(mode, RunMode) else RunMode.RUN


def basic_sweeper() -> type:
    """Hydra's basic sweeper class (the pre-flight sweeper extends it)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper


@contextlib.contextmanager
def as_job(cfg: DictConfig, job_num: int | None) -> Iterator[DictConfig]:
    """``cfg`` (a freshly composed config, changed in place) as its job will see it, with
    ``${hydra:...}`` resolvable.

    Launchers number sweep jobs (``hydra.job.num``, and ``hydra.job.id`` for the basic
    launcher) and ``run_job`` sets ``hydra.runtime.output_dir`` before the task runs; a
    single run has no job number. Inside the block Hydra's global config is ``cfg``, so
    interpolations read the values the job will read; the previous one is restored.
    """
    state = HydraConfig.instance()
    previous = state.cfg
    try:
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            if job_num is not None:
                cfg.hydra.job.num = job_num
                cfg.hydra.job.id = str(job_num)
            # HydraConfig.get() reads state.cfg.hydra; set_config would copy the node.
            state.cfg = cfg  # type: ignore[assignment]
            if job_num is None:
                out = str(cfg.hydra.run.dir)
            else:
                out = os.path.join(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir))
            cfg.hydra.runtime.output_dir = os.path.abspath(out)
        yield cfg
    finally:
        state.cfg = previous
