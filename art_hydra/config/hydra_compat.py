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
import copy
import dataclasses
import functools
import io
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import hydra
import omegaconf
import yaml
from hydra.core.config_loader import ConfigLoader
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.nodes import ValueNode

#: Release series this module was written and tested against.
WRITTEN_FOR = {"hydra-core": "1.3.", "omegaconf": "2.3."}

#: The private names used below, by module (the compatibility test checks each exists).
PRIVATE_NAMES = {
    "hydra._internal.utils": (
        "get_args_parser",
        "create_config_search_path",
        "run_and_report",
        "compute_search_path_dir",
    ),
    "hydra._internal.callbacks": ("Callbacks",),
    "hydra._internal.config_loader_impl": ("ConfigLoaderImpl", "get_overrides_dirname"),
    "hydra._internal.defaults_list": ("create_defaults_list",),
    "hydra._internal.core_plugins.basic_sweeper": ("BasicSweeper",),
    "hydra._internal.config_repository": ("CachingConfigRepository", "ConfigRepository"),
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


def primary_search_dir(config_path: str, calling_module: str) -> str:
    """The primary config folder Hydra's entry point makes of ``--config-path``: an
    absolute or ``pkg://`` one as given, a relative one against ``calling_module``'s
    package (``conf`` from ``art_hydra.__main__`` is ``pkg://art_hydra/conf``)."""
    from hydra._internal.utils import compute_search_path_dir

    return str(compute_search_path_dir(None, calling_module, config_path))


def args_parser() -> Any:
    """Hydra's own command-line parser (the same flags and overrides its entry point reads)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


@functools.lru_cache(maxsize=8)
def make_loader(primary: str, config_dir: str | None = None) -> ConfigLoader:
    """A caching config loader (:func:`caching_loader`) with the search path Hydra's entry
    point builds (``config_dir`` is an absolute ``--config-dir``)."""
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
    return caching_loader(search_path)


def is_group(loader: ConfigLoader, name: str) -> bool:
    """Whether an override's key names a config group (rather than a config value)."""
    return name == "hydra.searchpath" or bool(loader.repository.group_exists(name))  # type: ignore[attr-defined]


def apply_override(cfg: DictConfig, override: Override) -> None:
    """Apply one parsed value override to a composed config, as Hydra's loader does."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config([override], cfg)


def raw_list(node: Any) -> list[Any]:
    """A list's items as written (``${...}`` in an override's text is not resolved)."""
    return list(OmegaConf.to_container(node, resolve=False))


def child_node(node: DictConfig | Any, key: Any) -> Any:
    """The node at ``key`` itself (a container or a value node), nothing resolved."""
    return node._get_node(key)


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


def as_single_run(cfg: DictConfig) -> None:
    """``cfg``, composed for a run, as Hydra's entry point composes a single run: with no
    ``hydra.mode`` in the config it adds the override ``hydra.mode=RUN``."""
    if cfg.hydra.mode is None:
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            cfg.hydra.mode = RunMode.RUN
            cfg.hydra.overrides.hydra.append("hydra.mode=RUN")


def run_composed(
    cfg: DictConfig,
    config_name: str | None,
    loader: ConfigLoader,
    task_function: Callable[[DictConfig], Any],
) -> Any:
    """Run a single run's job from ``cfg``, composed already (:func:`as_single_run`), as
    Hydra's ``Hydra.run`` does once it has composed: its logging config, the ``hydra``
    callbacks, and ``run_job`` (the run folder, ``.hydra/``, the job's logging, the working
    folder); unexpected errors are reported as Hydra reports them. Returns the job's value
    (raising its exception, as Hydra does)."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import run_and_report
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext

    def run() -> Any:
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=config_name)
        ret = run_job(
            hydra_context=HydraContext(config_loader=loader, callbacks=callbacks),
            task_function=task_function,
            config=cfg,
            job_dir_key="hydra.run.dir",
            job_subdir_key=None,
            configure_logging=True,
        )
        callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
        return ret.return_value

    return run_and_report(run)


def wrap_launchers(wrap: Any) -> None:
    """Give every sweeper its launcher as ``wrap(launcher)``: sweepers build their launcher
    through ``Plugins.instantiate_launcher`` (Hydra has no hook between a sweeper and its
    launcher). Idempotent."""
    from hydra.core.plugins import Plugins

    original = Plugins.instantiate_launcher
    if getattr(original, "_art_hydra_wrapped", False):
        return

    def instantiate_launcher(self: Any, hydra_context: Any, task_function: Any, config: Any) -> Any:
        launcher = original(self, hydra_context, task_function, config)
        wrapped = wrap(launcher)
        wrapped.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        return wrapped

    instantiate_launcher._art_hydra_wrapped = True  # type: ignore[attr-defined]
    Plugins.instantiate_launcher = instantiate_launcher  # type: ignore[method-assign]


#: The Optuna sweeper's private step :func:`wrap_optuna_trials` wraps (plugin 1.3: the
#: trials of a batch, their search space and fixed params -> each trial's overrides).
OPTUNA_TRIALS = (
    "hydra_plugins.hydra_optuna_sweeper._impl",
    "OptunaSweeperImpl",
    "_configure_trials",
)


def wrap_optuna_trials(wrap: Any) -> None:
    """Give the Optuna sweeper's ``_configure_trials`` (which fixes each asked trial's
    point) as ``wrap(original, sweeper, trials, space, fixed)``: the sweeper counts every
    trial it asked for against ``n_trials`` and has no hook before it launches them, so
    this is where a trial whose point cannot run is swapped for another. Idempotent;
    called only once the Optuna sweeper was chosen (its module is then imported)."""
    import importlib

    module, name, method = OPTUNA_TRIALS
    impl = getattr(importlib.import_module(module), name)
    original = getattr(impl, method)
    if getattr(original, "_art_hydra_wrapped", False):
        return

    @functools.wraps(original)
    def configure(self: Any, trials: Any, space: Any, fixed: Any) -> Any:
        return wrap(original, self, trials, space, fixed)

    configure._art_hydra_wrapped = True  # type: ignore[attr-defined]
    setattr(impl, method, configure)


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


@contextlib.contextmanager
def read_write_open(cfg: DictConfig) -> Iterator[DictConfig]:
    """``cfg`` writable, new keys allowed, for the block."""
    with read_write(cfg), open_dict(cfg):
        yield cfg


@contextlib.contextmanager
def point_view(cfg: DictConfig, parsed: list[Override]) -> Iterator[DictConfig]:
    """``cfg``, composed for another point of the same sweep, with the ``hydra`` node's
    record of the overrides (``overrides.task``/``overrides.hydra``, ``job.override_dirname``)
    and the job's number and folder as Hydra sets them for ``parsed``; restored after."""
    from hydra._internal.config_loader_impl import get_overrides_dirname

    hydra = cfg.hydra
    saved = {
        "task": raw_list(hydra.overrides.task),
        "hydra": raw_list(hydra.overrides.hydra),
        "dirname": raw_value(hydra.job, "override_dirname"),
        "num": raw_value(hydra.job, "num"),
        "id": raw_value(hydra.job, "id"),
        "out": raw_value(hydra.runtime, "output_dir"),
    }
    try:
        with read_write(hydra), open_dict(hydra):
            hydra.overrides.task = [o.input_line for o in parsed if not o.is_hydra_override()]
            hydra.overrides.hydra = [o.input_line for o in parsed if o.is_hydra_override()]
            hydra.job.override_dirname = get_overrides_dirname(
                overrides=[o for o in parsed if not o.is_hydra_override()],
                kv_sep=hydra.job.config.override_dirname.kv_sep,
                item_sep=hydra.job.config.override_dirname.item_sep,
                exclude_keys=hydra.job.config.override_dirname.exclude_keys,
            )
        yield cfg
    finally:
        with read_write(hydra), open_dict(hydra):
            hydra.overrides.task = saved["task"]
            hydra.overrides.hydra = saved["hydra"]
            hydra.job.override_dirname = saved["dirname"]
            hydra.job.num = saved["num"]
            hydra.job.id = saved["id"]
            hydra.runtime.output_dir = saved["out"]


def caching_loader(search_path: Any) -> ConfigLoader:
    """Hydra's config loader, composing once per distinct group selection.

    Hydra rebuilds the defaults tree and re-reads every YAML file for each composition
    (about 90 ms here), although most compositions of a sweep, a test suite or a notebook
    differ only in values. This loader keeps, per config name, search path and group
    choices, the config Hydra composed before any value override, and gives each call a
    copy with its value overrides applied by Hydra's own code and the ``hydra`` node
    filled as Hydra fills it: the same config, about 8x faster. A change to any file on
    the search path (size or modification time) starts afresh; anything the cache does
    not recognise goes to Hydra's own path.
    """
    return _caching_loader_class()(config_search_path=search_path)


@functools.cache
def _caching_loader_class() -> type:
    """:class:`_CachingLoaderMixin` on Hydra's own (private) loader, built on first use:
    importing ``hydra._internal`` only when a loader is wanted keeps this module
    importable on a Hydra release that moved it, so the compatibility test can say so."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    return type("CachingConfigLoader", (_CachingLoaderMixin, ConfigLoaderImpl), {})


class _ComposedSelection:
    """One group selection, composed: the config before any value override."""

    def __init__(
        self, cfg: DictConfig, choices: dict, sources: list, signature: Any, files: tuple = ()
    ):
        self.cfg, self.choices, self.sources, self.signature = cfg, choices, sources, signature
        #: Every config file composed, in merge order (:class:`ConfigFile`).
        self.files = files


class _CachingLoaderMixin:
    """The caching part of :func:`caching_loader`, placed before Hydra's
    ``ConfigLoaderImpl`` (which provides ``repository``, ``_process_config_searchpath``,
    ``_compose_config_from_defaults_list`` and the sweep checks) by
    :func:`_caching_loader_class`."""

    def __init__(self, config_search_path: Any) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        super().__init__(config_search_path=config_search_path)  # type: ignore[call-arg]
        self._parser = OverridesParser.create()
        self._parsed: dict[str, Override] = {}
        self._repos: dict[tuple, Any] = {}
        self._bases: dict[tuple, _ComposedSelection] = {}

    def load_configuration(
        self,
        config_name: str | None,
        overrides: list[str],
        run_mode: RunMode,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> DictConfig:
        """Hydra's ``load_configuration``, served from the cache where it can be; an
        OmegaConf error becomes Hydra's composition error, as Hydra's own raises it."""
        from hydra.errors import ConfigCompositionException
        from omegaconf.errors import OmegaConfBaseException

        try:
            return self._load_cached(
                config_name, list(overrides), run_mode, from_shell, validate_sweep_overrides
            )
        except OmegaConfBaseException as e:
            raise ConfigCompositionException().with_traceback(sys.exc_info()[2]) from e

    def parse(self, overrides: list[str]) -> list[Override]:
        """Overrides parsed as Hydra parses them (each text once per loader)."""
        return self._parse(overrides)

    def split(
        self, config_name: str | None, parsed: list[Override]
    ) -> tuple[list[Override], list[Override]]:
        """``(group choices, value overrides)``, as Hydra's defaults list tells them
        apart (sweep overrides are in neither)."""
        repo, _ = self._repo(config_name, parsed, fresh=False)
        return self._split(repo, parsed)

    @staticmethod
    def _split(repo: Any, parsed: list[Override]) -> tuple[list[Override], list[Override]]:
        groups: list[Override] = []
        values: list[Override] = []
        known = repo.__dict__.setdefault("_art_hydra_groups", {})
        for o in parsed:
            if o.is_sweep_override():
                continue
            if o.key_or_group not in known:
                known[o.key_or_group] = repo.group_exists(o.key_or_group)
            is_group = known[o.key_or_group]
            (values if isinstance(o.value(), dict) or not is_group else groups).append(o)
        return groups, values

    def _parse(self, overrides: list[str]) -> list[Override]:
        missing = [o for o in overrides if o not in self._parsed]
        if missing:  # parsed together, so a bad one raises Hydra's own error
            found = self._parser.parse_overrides(missing)
            self._parsed.update(zip(missing, found, strict=True))
        return [self._parsed[o] for o in overrides]

    def _repo(self, config_name: str | None, parsed: list[Override], fresh: bool = True) -> Any:
        """The repository of a config name and search path; ``fresh`` reads the files'
        sizes and times first and starts afresh on any change (a composition does;
        telling a group from a value for the next point of a sweep need not)."""
        from hydra._internal.config_repository import CachingConfigRepository

        searchpath = next(
            (o.input_line for o in parsed if o.get_key_element() == "hydra.searchpath"), None
        )
        key = (config_name, searchpath)
        repo = self._repos.get(key)
        if repo is None or (fresh and _signature(repo) != repo._art_hydra_signature):
            repo = CachingConfigRepository(self.repository)  # type: ignore[attr-defined]
            self._process_config_searchpath(config_name, parsed, repo)  # type: ignore[attr-defined]
            repo._art_hydra_signature = _signature(repo)
            self._repos[key] = repo
            self._bases = {k: v for k, v in self._bases.items() if k[0] != key}
        return repo, key

    def _load_cached(
        self,
        config_name: str | None,
        overrides: list[str],
        run_mode: RunMode,
        from_shell: bool,
        validate_sweep_overrides: bool,
    ) -> DictConfig:
        self.ensure_main_config_source_available()  # type: ignore[attr-defined]
        parsed = self._parse(overrides)
        repo, repo_key = self._repo(config_name, parsed)
        if validate_sweep_overrides:
            self.validate_sweep_overrides_legal(  # type: ignore[attr-defined]
                overrides=parsed, run_mode=run_mode, from_shell=from_shell
            )
        groups, values = self._split(repo, parsed)
        key = (repo_key, run_mode == RunMode.MULTIRUN, tuple(o.input_line for o in groups))
        base = self._bases.get(key)
        if base is None or base.signature != repo._art_hydra_signature:
            cfg, base = self._compose_selection(config_name, parsed, values, run_mode, key)
        else:
            cfg = copy.deepcopy(base.cfg)
        cfg = self._finish(cfg, base, config_name, parsed, values)
        remember_files(cfg, base.files)
        return cfg

    def _compose_selection(
        self,
        config_name: str | None,
        parsed: list[Override],
        values: list[Override],
        run_mode: RunMode,
        key: tuple,
    ) -> tuple[DictConfig, _ComposedSelection]:
        """Compose the group selection ``key`` as Hydra does (the config, before value
        overrides) and keep it for the next composition of the same selection."""
        from hydra._internal.config_repository import CachingConfigRepository
        from hydra._internal.defaults_list import create_defaults_list
        from hydra.conf import ConfigSourceInfo

        # A fresh repository per composition, as Hydra has: composing merges into
        # the configs it cached, so a shared one would carry one run's values over.
        repo = CachingConfigRepository(self.repository)  # type: ignore[attr-defined]
        self._process_config_searchpath(config_name, parsed, repo)  # type: ignore[attr-defined]
        defaults = create_defaults_list(
            repo=repo,
            config_name=config_name,
            overrides_list=parsed,
            prepend_hydra=True,
            skip_missing=run_mode == RunMode.MULTIRUN,
        )
        files = _config_files(repo, defaults.defaults)  # before composing merges into them
        cfg = self._compose_config_from_defaults_list(  # type: ignore[attr-defined]
            defaults=defaults.defaults, repo=repo
        )
        OmegaConf.set_struct(cfg, True)
        OmegaConf.set_readonly(cfg.hydra, False)
        sources = [
            ConfigSourceInfo(path=x.path, schema=x.scheme(), provider=x.provider)
            for x in repo.get_sources()
        ]
        same_split = [o.input_line for o in defaults.config_overrides] == [
            o.input_line for o in values
        ]
        base = _ComposedSelection(
            copy.deepcopy(cfg) if same_split else cfg,
            dict(defaults.overrides.known_choices),
            sources,
            self._repos[key[0]]._art_hydra_signature,
            files,
        )
        # Kept from the first composition of a selection on: a copy costs a few percent
        # of composing, and the command line's refused single run composes its fixes
        # with the same selection again (:func:`~art_hydra.config.composition.revealed_by_fixes`).
        if same_split:
            self._bases[key] = base
        return cfg, base

    @staticmethod
    def _finish(
        cfg: DictConfig,
        base: _ComposedSelection,
        config_name: str | None,
        parsed: list[Override],
        values: list[Override],
    ) -> DictConfig:
        """What Hydra's ``_load_configuration_impl`` does after composing the
        defaults list (hydra 1.3.2-1.3.x), step for step."""
        from hydra import __version__, version
        from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
        from hydra.core.utils import JobRuntime

        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        app_overrides = []
        for override in parsed:
            if override.is_hydra_override():
                cfg.hydra.overrides.hydra.append(override.input_line)
            else:
                cfg.hydra.overrides.task.append(override.input_line)
                app_overrides.append(override)
        with open_dict(cfg.hydra):
            cfg.hydra.runtime.choices.update(base.choices)
            for key in cfg.hydra.job.env_copy:
                cfg.hydra.job.env_set[key] = os.environ[key]
        cfg.hydra.runtime.version = __version__
        cfg.hydra.runtime.version_base = version.getbase()
        cfg.hydra.runtime.cwd = os.getcwd()
        cfg.hydra.runtime.config_sources = list(base.sources)
        if "name" not in cfg.hydra.job:
            cfg.hydra.job.name = JobRuntime().get("name")
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=app_overrides,
            kv_sep=cfg.hydra.job.config.override_dirname.kv_sep,
            item_sep=cfg.hydra.job.config.override_dirname.item_sep,
            exclude_keys=cfg.hydra.job.config.override_dirname.exclude_keys,
        )
        cfg.hydra.job.config_name = config_name
        return cfg


def _signature(repo: Any) -> tuple:
    """Size and modification time of every file on a repository's search path: a loader
    keeps what it composed only while these stay the same."""
    import importlib.util

    found: list[tuple] = []
    for source in repo.get_sources():
        scheme = source.scheme()
        if scheme == "file":
            roots = [source.path]
        elif scheme == "pkg":
            try:
                spec = importlib.util.find_spec(source.path.replace("/", "."))
            except (ImportError, ValueError):
                spec = None
            roots = list(spec.submodule_search_locations or []) if spec else []
        else:
            continue
        for root in roots:
            found.append((root, *_tree_stamp(root)))
    return tuple(found)


def _tree_stamp(root: str) -> tuple:
    stamp: list[tuple] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            stamp.append((folder, None))
            continue
        for entry in entries:
            try:
                if entry.is_dir():
                    stack.append(entry.path)
                elif entry.name.endswith((".yaml", ".yml")):
                    info = entry.stat()
                    stamp.append((entry.path, info.st_mtime_ns, info.st_size))
            except OSError:
                stamp.append((entry.path, None))
    return tuple(sorted(stamp, key=str))


# ---- every config file Hydra reads, read within bounds --------------------------------

#: Hydra's own search-path step (:func:`_own_searchpath_only` calls it).
_hydras_searchpath: Any = None
#: Files refused by the bounded read during the current composition (None: no record).
_refused: ContextVar[list | None] = ContextVar("art_hydra_refused_reads", default=None)


@contextlib.contextmanager
def refused_reads() -> Iterator[list]:
    """The config files refused while composing in the block (``YamlRefused`` each):
    Hydra wraps a config source's error in its own, so composition learns of a refused
    file here rather than from the exception it sees."""
    token = _refused.set([])
    try:
        yield _refused.get()  # type: ignore[misc]
    finally:
        _refused.reset(token)


def guard_config_reads() -> None:
    """Make Hydra read each YAML file of a file or package config source through
    :mod:`art_hydra.config.yaml_guard` (a regular file, its size, nesting and alias
    expansion bounded) and only inside its config folder: at the one point where Hydra's
    repository asks a source for a config, so a linked file, a folder of decoys, a
    search-path folder or a defaults entry that climbs (``- ../../elsewhere/x``) are all
    read the same way. (The sources' own classes are re-created by Hydra's plugin scan,
    so the repository, which is not, is where the read is taken over.) Any loader, Hydra's
    own included, also leaves a primary config file's ``hydra.searchpath`` unfollowed
    (:func:`_own_searchpath_only`). Idempotent."""
    from hydra._internal.config_repository import ConfigRepository

    global _hydras_searchpath
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    if getattr(ConfigRepository.load_config, "_art_hydra_bounded", False):
        return
    _bounded_repo_load._art_hydra_bounded = True  # type: ignore[attr-defined]
    ConfigRepository.load_config = _bounded_repo_load  # type: ignore[method-assign]
    _hydras_searchpath = ConfigLoaderImpl._process_config_searchpath
    ConfigLoaderImpl._process_config_searchpath = _own_searchpath_only  # type: ignore[method-assign]


def _own_searchpath_only(
    self: Any, config_name: str | None, parsed_overrides: list[Override], repo: Any
) -> None:
    """Hydra's ``ConfigLoaderImpl._process_config_searchpath``, except that a primary
    config file's own ``hydra.searchpath`` is not followed: a ``pkg://`` entry imports
    that package, and a folder it adds could shadow any config. Only the command line
    (``hydra.searchpath=[...]``, ``--config-dir``) widens where configs come from; the
    trust check refuses the file's setting by name (:mod:`art_hydra.config.hydra_section`,
    or composition's report where nothing composes without it)."""
    by_hand = any(o.get_key_element() == "hydra.searchpath" for o in parsed_overrides)
    if not by_hand and config_name is not None:
        try:
            loaded = repo.load_config(config_path=config_name)
            wanted = OmegaConf.select(loaded.config, "hydra.searchpath") if loaded else None
        except Exception:
            wanted = None  # Hydra's own call below reports an unreadable primary config
        if wanted:
            self.ignored_searchpath = (config_name, OmegaConf.to_container(wanted))
            return
    _hydras_searchpath(self, config_name, parsed_overrides, repo)


def _bounded_repo_load(self: Any, config_path: str) -> Any:
    """Hydra's ``ConfigRepository.load_config`` (1.3), the source's read made bounded."""
    from hydra.core.object_type import ObjectType

    source = self._find_object_source(config_path=config_path, object_type=ObjectType.CONFIG)
    if source is None:
        return None
    scheme = source.scheme()
    if scheme == "file":
        ret = _bounded_file_load(source, config_path)
    elif scheme == "pkg":
        ret = _bounded_pkg_load(source, config_path)
    else:
        ret = source.load_config(config_path=config_path)
    ret.is_schema_source = (
        source.__class__.__name__ == "StructuredConfigSource" and source.provider == "schema"
    )
    raw_defaults = self._extract_defaults_list(config_path, ret.config)
    ret.defaults_list = self._create_defaults_list(config_path, raw_defaults)
    return ret


def _refuse(path: str, reason: str) -> Exception:
    from art_hydra.config.yaml_guard import YamlRefused

    refused = YamlRefused(path, reason)
    found = _refused.get()
    if found is not None and all(r.path != refused.path for r in found):
        found.append(refused)
    return refused


def _bounded_result(source: Any, text: str, where: str) -> Any:
    """Hydra's ``ConfigResult`` for the YAML ``text`` of the file ``where``, once within
    the bounds, built as Hydra's own sources build it (header from the first 512
    characters, ``OmegaConf.load``)."""
    import io

    from hydra.plugins.config_source import ConfigResult

    from art_hydra.config.yaml_guard import text_refusal

    why = text_refusal(text)
    if why is not None:
        raise _refuse(where, why)
    parsed = _PARSED.get((where, text))
    if parsed is None:
        parsed = _shipped_load(text) if _shipped(where) else OmegaConf.load(io.StringIO(text))
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[where, text] = parsed
    return ConfigResult(
        config=copy.deepcopy(parsed),  # composing merges into what the repository holds
        path=f"{source.scheme()}://{source.path}",
        provider=source.provider,
        header=source._get_header_dict(text[:512]),
    )


def _shipped(where: str) -> bool:
    """Whether the file ``where`` is one of art_hydra's own config files."""
    folder = _shipped_folder()
    return folder is not None and where.startswith(folder + os.sep)


@functools.cache
def _shipped_folder() -> str | None:
    """art_hydra's own config folder (``art_hydra.conf``, installed or in a checkout)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("art_hydra.conf")
    except ImportError:
        return None
    if spec is None or spec.origin is None:
        return None
    return os.path.realpath(os.path.dirname(spec.origin))


def _shipped_load(text: str) -> Any:
    """``OmegaConf.load`` of one of art_hydra's own config files, read by libyaml (five
    times faster than PyYAML's Python reader) with OmegaConf's own resolvers and its
    duplicate-key check; a user's file keeps OmegaConf's reader, errors and all. A text
    libyaml does not take goes to OmegaConf's reader, whose error is the one reported."""
    loader = _libyaml_loader()
    try:
        obj = yaml.load(text, Loader=loader) if loader is not None else None
    except Exception:
        loader = None
    if loader is None or not isinstance(obj, (dict, list, type(None))):
        return OmegaConf.load(io.StringIO(text))
    return OmegaConf.create() if obj is None else OmegaConf.create(obj)


@functools.cache
def _libyaml_loader() -> Any:
    """OmegaConf's YAML loader (``omegaconf._utils.get_yaml_loader``) on libyaml's reader:
    the same implicit resolvers (its floats, no timestamps) and duplicate keys refused."""
    from omegaconf._utils import get_yaml_loader

    if not getattr(yaml, "__with_libyaml__", False):
        return None
    pure = get_yaml_loader()

    class Loader(yaml.CSafeLoader):  # type: ignore[misc,name-defined]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            keys = set()  # OmegaConfLoader.construct_mapping's check, word for word
            for key_node, _ in node.value:
                if key_node.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    continue
                if key_node.value in keys:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value}",
                        key_node.start_mark,
                    )
                keys.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    Loader.yaml_implicit_resolvers = {
        key: list(found) for key, found in pure.yaml_implicit_resolvers.items()
    }
    return Loader


#: Each config file's text as parsed, by its place and its whole text (a changed file is
#: another key): a refused config's diagnosis and its fixes compose again, a sweep once
#: per group selection, and parsing YAML costs about ten times copying what it gave.
_PARSED: dict[tuple[str, str], Any] = {}
_PARSED_MAX = 512


def _bounded_file_load(self: Any, config_path: str) -> Any:
    from hydra.plugins.config_source import ConfigLoadError

    from art_hydra.config.yaml_guard import YamlRefused, read_text_bounded

    full = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
    if not os.path.exists(full):
        raise ConfigLoadError(f"Config not found : {full}")
    root = os.path.realpath(self.path)
    if os.path.commonpath([root, full]) != root:
        raise _refuse(
            full, f"is outside the config folder {self.path} ('{config_path}' leads out of it)"
        )
    try:
        text = read_text_bounded(full)
    except YamlRefused as exc:
        raise _refuse(full, exc.reason) from None
    return _bounded_result(self, text, full)


def _bounded_pkg_load(self: Any, config_path: str) -> Any:
    from importlib import resources

    from hydra.plugins.config_source import ConfigLoadError

    from art_hydra.config.yaml_guard import MAX_BYTES, YamlRefused, read_text_bounded

    name = self._normalize_file_name(config_path)
    root = resources.files(self.path)
    res = root.joinpath(name)
    if not res.exists():
        raise ConfigLoadError(f"Config not found : {name}")
    where = f"pkg://{self.path}/{name}"
    if isinstance(res, os.PathLike) and isinstance(root, os.PathLike):
        full, top = os.path.realpath(res), os.path.realpath(root)
        if os.path.commonpath([top, full]) != top:
            raise _refuse(full, f"is outside the package {self.path} ('{config_path}' leads out)")
        try:
            return _bounded_result(self, read_text_bounded(full), full)
        except YamlRefused as exc:
            raise _refuse(full, exc.reason) from None
    with res.open("rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise _refuse(where, f"is more than {MAX_BYTES:,} bytes, more than a config file may be")
    try:
        return _bounded_result(self, data.decode("utf-8"), where)
    except UnicodeDecodeError:
        raise _refuse(where, "is not UTF-8 text") from None


guard_config_reads()


# ---- an interpolation's text parsed once per process -----------------------------------

#: OmegaConf's parse trees by ``(text, rule, mode)``: OmegaConf parses an interpolation's
#: text with ANTLR each time a node holding it is made (to validate it, every load, merge
#: and copy of a composition) and each time it resolves one; the same dozen texts come
#: back at every composition.
_TREES: dict[tuple[str, str, str], Any] = {}
_TREES_MAX = 4096


def parse_interpolations_once() -> None:
    """Serve OmegaConf's ``grammar_parser.parse`` from :data:`_TREES`. A tree is only
    read after its parse (OmegaConf's resolver visits it, and validation drops it), and
    its tokens keep their own input, so one tree serves every node holding that text; a
    text that does not parse raises each time, as before. Idempotent."""
    import omegaconf._utils
    import omegaconf.base
    from omegaconf import grammar_parser

    if getattr(omegaconf.base.parse, "_art_hydra_once", False):
        return
    original = grammar_parser.parse

    @functools.wraps(original)
    def parse(value: str, parser_rule: str = "configValue", lexer_mode: str = "DEFAULT_MODE"):  # type: ignore[no-untyped-def]
        key = (value, parser_rule, lexer_mode)
        tree = _TREES.get(key)
        if tree is None:
            tree = original(value, parser_rule, lexer_mode)
            if len(_TREES) >= _TREES_MAX:
                _TREES.clear()
            _TREES[key] = tree
        return tree

    parse._art_hydra_once = True  # type: ignore[attr-defined]
    omegaconf._utils.parse = parse  # type: ignore[attr-defined]
    omegaconf.base.parse = parse  # type: ignore[attr-defined]


parse_interpolations_once()


# ---- which file set what ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConfigFile:
    """One config Hydra merged into a composition: where it came from and what it set
    under ``hydra`` (leaf paths below ``hydra``, as tuples of keys, to their raw values)."""

    config_path: str
    #: Its source: ``structured://``, ``pkg://hydra.conf``, ``file:///a/folder``, ...
    source: str
    provider: str
    hydra: dict


#: Config sources whose settings need no record when they are the only ones composed:
#: Hydra's own, installed plugins' (structured) and art_hydra's shipped ``conf/``.
_OWN_SOURCES = ("structured://", "pkg://hydra.conf", "pkg://art_hydra.conf")


def _config_files(repo: Any, defaults: list) -> tuple[ConfigFile, ...]:
    loaded_files = []
    for default in defaults:
        if default.config_path is None:
            continue
        try:
            loaded = repo.load_config(config_path=default.config_path)
        except Exception:
            continue  # composing reports it
        if loaded is not None:
            loaded_files.append((default, loaded))
    # What the trusted configs set matters only beside a file from elsewhere.
    plain = all(str(loaded.path) in _OWN_SOURCES for _, loaded in loaded_files)
    return tuple(
        ConfigFile(
            default.config_path,
            str(loaded.path),
            loaded.provider,
            {} if plain else dict(_hydra_leaves(loaded.config, default.package or "")),
        )
        for default, loaded in loaded_files
    )


def _hydra_leaves(config: Any, package: str) -> Iterator[tuple[tuple, Any]]:
    """The leaves a config sets below ``hydra`` once placed at ``package``."""
    parts = tuple(package.split(".")) if package else ()
    if parts and parts[0] != "hydra":
        return
    try:
        content = OmegaConf.to_container(config, resolve=False)
    except Exception:
        return
    if not isinstance(content, dict):
        return
    content.pop("defaults", None)
    if not parts:
        if "hydra" not in content:
            return
        content, parts = content["hydra"], ("hydra",)
    yield from _leaves_of(content, parts[1:])


def _leaves_of(node: Any, path: tuple) -> Iterator[tuple[tuple, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():  # an empty mapping merges nothing
            yield from _leaves_of(value, (*path, str(key)))
    elif path:
        yield path, node


_files_of: dict[int, tuple[ConfigFile, ...]] = {}


def remember_files(cfg: Any, files: tuple[ConfigFile, ...]) -> None:
    """Keep which files composed ``cfg`` for as long as ``cfg`` lives."""
    import weakref

    if id(cfg) not in _files_of:
        weakref.finalize(cfg, _files_of.pop, id(cfg), None)
    _files_of[id(cfg)] = files


def files_of(cfg: Any) -> tuple[ConfigFile, ...] | None:
    """The files that composed ``cfg`` (None: not composed by art_hydra's loader)."""
    return _files_of.get(id(cfg))


def resolve_text(cfg: DictConfig, text: str) -> Any:
    """``text`` resolved as a value of ``cfg``'s ``hydra`` node would be."""
    probe = "_art_hydra_probe"
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra[probe] = text
        try:
            return OmegaConf.select(cfg, f"hydra.{probe}", throw_on_missing=True)
        finally:
            cfg.hydra.pop(probe, None)


# Read tracing (art_hydra.sweeps.read_trace): a sweep check's verdict is remembered by the
# config values it read, which OmegaConf reaches through private methods only.

#: The key recorded for a write into a container (or into a value node of it).
TRACE_WRITE = "\0write"
#: The key recorded for a container read as a whole without ``_get_node`` (its text).
TRACE_WHOLE = "\0whole"


@dataclasses.dataclass(frozen=True, eq=False)
class CopyOf:
    """The key recorded for a container made as a copy of ``source`` (``deepcopy``, which
    ``OmegaConf.merge`` starts from, or ``OmegaConf.create(source)``): a read of the copy
    is a read of what it was copied from."""

    source: Any


#: Thread id -> its running traces, innermost last (a thread's reads feed only its own).
_TRACES: dict[int, list[list[tuple[Any, Any]]]] = {}
_TRACE_LOCK = threading.Lock()
_TRACE_ORIGINALS: dict[tuple[type, str], Any] = {}
_ABSENT = object()


def _sinks() -> list[list[tuple[Any, Any]]]:
    """The traces a read of the calling thread feeds: its own innermost one, or, from a
    thread that is not tracing, every tracing thread's innermost one (a check may read
    through a worker thread; a read of another config altogether is told apart later by
    the container read). A bound method kept past every trace records nothing."""
    stack = _TRACES.get(threading.get_ident())
    if stack:
        return stack[-1:]
    if not _TRACES:
        return []
    with _TRACE_LOCK:  # another thread may be starting or ending its trace
        return [s[-1] for s in _TRACES.values() if s]


def _recording_read(original: Any) -> Callable[..., Any]:
    def _get_node(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        for reads in _sinks():
            reads.append((self, key))
        return original(self, key, *args, **kwargs)

    return _get_node


def _recording_write(original: Any) -> Callable[..., Any]:
    def write(self: Any, *args: Any, **kwargs: Any) -> Any:
        sinks = _sinks()
        if sinks:
            owner = self._get_parent() if isinstance(self, ValueNode) else self
            # A container set from another (``OmegaConf.create(cfg)``) copies it, without
            # ``_get_node``.
            source = args[0] if args and isinstance(args[0], (DictConfig, ListConfig)) else None
            for reads in sinks:
                reads.append((owner, TRACE_WRITE))
                if source is not None:
                    reads.append((self, CopyOf(source)))
        return original(self, *args, **kwargs)

    return write


def _recording_whole(original: Any) -> Callable[..., Any]:
    def whole(self: Any, *args: Any, **kwargs: Any) -> Any:
        for reads in _sinks():
            reads.append((self, TRACE_WHOLE))
        return original(self, *args, **kwargs)

    return whole


def _recording_copy(original: Any) -> Callable[..., Any]:
    def __deepcopy__(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = original(self, *args, **kwargs)
        for reads in _sinks():
            reads.append((made, CopyOf(self)))  # each container below is copied the same way
        return made

    return __deepcopy__


def _traced_methods() -> Iterator[tuple[type, str, str]]:
    from omegaconf.basecontainer import BaseContainer

    for cls in (DictConfig, ListConfig):
        yield cls, "_get_node", "read"
        for name in ("_set_value", "__delitem__", "pop"):
            yield cls, name, "write"
        for name in ("__str__", "__repr__", "__format__"):
            yield cls, name, "whole"  # they read ``_content`` directly
        yield cls, "__deepcopy__", "copy"
    # ``copy.copy`` and pickling: a shallow copy shares the children, a pickle is text.
    yield BaseContainer, "__getstate__", "whole"
    yield ValueNode, "_set_value", "write"
    yield BaseContainer, "_set_item_impl", "write"
    yield ListConfig, "insert", "write"
    yield ListConfig, "append", "write"


_WRAPPERS = {
    "read": _recording_read,
    "write": _recording_write,
    "whole": _recording_whole,
    "copy": _recording_copy,
}


def _patch_traced_methods(on: bool) -> None:
    if on:
        for cls, name, what in _traced_methods():
            _TRACE_ORIGINALS[(cls, name)] = cls.__dict__.get(name, _ABSENT)
            wrap = _WRAPPERS[what]
            setattr(cls, name, wrap(getattr(cls, name)))
        return
    for (cls, name), original in reversed(list(_TRACE_ORIGINALS.items())):
        if original is _ABSENT:
            delattr(cls, name)
        else:
            setattr(cls, name, original)
    _TRACE_ORIGINALS.clear()


@contextlib.contextmanager
def traced_reads() -> Iterator[list[tuple[Any, Any]]]:
    """The (container, key) pairs this thread reads while inside: every ``_get_node`` call
    (attributes, ``select``, ``to_container`` and interpolations all go through it), a
    container's text as ``(container, TRACE_WHOLE)``, a copy as ``(copy,
    CopyOf(source))`` and a write as ``(owner, TRACE_WRITE)``. Nested traces feed their
    outer one; the methods are patched while any thread traces. A tracing thread's reads
    feed its own trace only; a thread that is not tracing feeds every thread's that is
    (:func:`_sinks`)."""
    me = threading.get_ident()
    reads: list[tuple[Any, Any]] = []
    with _TRACE_LOCK:
        if not _TRACES:
            _patch_traced_methods(True)
        stack = _TRACES.setdefault(me, [])
        stack.append(reads)
    try:
        yield reads
    finally:
        with _TRACE_LOCK:
            stack.pop()
            if stack:
                stack[-1].extend(reads)
            else:
                del _TRACES[me]
                if not _TRACES:
                    _patch_traced_methods(False)


def node_children(node: Any) -> Any:
    """A container's own content, untraced and unresolved: a dict or list of child nodes,
    or None / ``???`` / an interpolation's text. Setting a container to one of those (or to
    a new dict) swaps this object and keeps the node, so its identity tells a swap."""
    return node.__dict__["_content"]


def node_value(node: Any) -> Any:
    """A node's value as written, interpolations unresolved."""
    return node._value()


def node_is_special(node: Any) -> bool:
    """A container holding no children: None, ``???`` or an interpolation."""
    return bool(node._is_none() or node._is_missing() or node._is_interpolation())


def node_key(container: Any, key: Any) -> Any:
    """``key`` as ``container`` stores it (a dict with Enum keys is read by the member's
    name, and stores the member); ``key`` itself where it cannot be told."""
    normalize = getattr(container, "_validate_and_normalize_key", None)
    if normalize is None:
        return key
    try:
        return normalize(key)
    except Exception:
        return key


def node_parent(node: Any) -> Any:
    """The container a node lies in (None for a root)."""
    return node._get_parent()
