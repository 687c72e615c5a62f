"""Hydra's own settings from a config file: an allowlist of keys, each with a typed bound.

What a config file from elsewhere may set under ``hydra`` is data: where the run's
folders go (inside the launch folder), a job name, thread-count variables, the sweep's
parameters and the documented settings of the installed sweeper and launcher plugins.
Everything else Hydra reads there names code, a place or a connection (callbacks,
logging configs, search paths, a plugin's fields typed ``Any``), so a config file may
not set it: it is refused by key, with the fix (the same setting on the command line,
which is the user's own hand).

"A config file set it" is decided from the files composition merged
(:func:`hydra_compat.files_of`): a leaf below ``hydra`` that a file other than Hydra's
own, art_hydra's shipped ``conf/`` or an installed plugin's config sets, to a value other
than theirs, and that the command line did not set. A ``hydra/...`` group option chosen
on the command line is the user's (its own package only), unless a folder of config
files shadows an installed option of that name. Logging settings are never taken from
a file: choose a named preset (``hydra/job_logging=default``) instead.

The folders Hydra writes to are bounded whoever set them, except by hand: ``run.dir`` and
``sweep.dir`` stay inside the launch folder, ``sweep.subdir`` inside the sweep folder,
``job.name`` is a plain name (it names the log file), all with interpolations resolved.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.config import hydra_compat
from art_hydra.config.problems import Kind, Problem, fix

#: Environment variables a config file may set through ``hydra.job.env_set``: thread
#: counts and device visibility. Any other variable may change what the job loads or
#: where it connects (``LD_PRELOAD``, ``PYTHONPATH``, torch.distributed's ``MASTER_ADDR``
#: and ``RANK``, ``HF_ENDPOINT``, proxies, ...), so only the command line sets it.
SAFE_VARIABLES = frozenset(
    {
        "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
        "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
        "CUBLAS_WORKSPACE_CONFIG",
    }
)  # fmt: skip

#: A check of one value: why a config file may not give it (None: it may).
Check = Callable[[Any, tuple], "str | None"]

#: How long a text value from a config file may be.
MAX_TEXT = 256


def _plain(value: Any) -> Any:
    return value.name if isinstance(value, Enum) else value


def _text(pattern: str | None = None, max_len: int = MAX_TEXT) -> Check:
    compiled = re.compile(pattern) if pattern else None

    def check(value: Any, path: tuple) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            return f"is {type(value).__name__}, not text"
        if "\n" in value or "\r" in value:
            return (
                "has a line break: in a job script a value with a line break becomes a line "
                "of its own, a command the shell runs"
            )
        if any(ord(c) < 32 for c in value) or len(value) > max_len:
            return f"is not plain text of at most {max_len} characters"
        if compiled is not None and not compiled.fullmatch(value):
            return f"is not of the form {pattern}"
        return None

    return check


def _number(lo: float, hi: float, integer: bool = True) -> Check:
    def check(value: Any, path: tuple) -> str | None:
        kinds = (int,) if integer else (int, float)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
            kind = "a whole number" if integer else "a number"
            return f"is not {kind} from {lo:g} to {hi:g}"
        return None

    return check


def _flag(value: Any, path: tuple) -> str | None:
    return None if value is None or isinstance(value, bool) else "is not true or false"


def _one_of(*allowed: Any) -> Check:
    def check(value: Any, path: tuple) -> str | None:
        values = value if isinstance(value, list) else [value]
        bad = [v for v in values if _plain(v) not in allowed]
        return f"is not one of {', '.join(map(str, allowed))}" if bad else None

    return check


def _mapping(key: Check, value: Check, most: int = 256) -> Check:
    def check(node: Any, path: tuple) -> str | None:
        if node is None:
            return None
        if not isinstance(node, dict) or len(node) > most:
            return f"is not a mapping of at most {most} entries"
        for k, v in node.items():
            why = key(k, path) or value(v, (*path, str(k)))
            if why is not None:
                return f"{k}: {why}"
        return None

    return check


def _items(item: Check, most: int = 64) -> Check:
    def check(node: Any, path: tuple) -> str | None:
        if node is None:
            return None
        if not isinstance(node, list) or len(node) > most:
            return f"is not a list of at most {most} items"
        return next((why for v in node if (why := item(v, path)) is not None), None)

    return check


def _sweep_value(value: Any, path: tuple) -> str | None:
    if isinstance(value, list):
        return _items(_sweep_value, 1024)(value, path)
    if value is None or isinstance(value, (bool, int, float)):
        return None
    return _text(max_len=4096)(value, path)


def _never(reason: str) -> Check:
    return lambda value, path: reason


def _ok(value: Any, path: tuple) -> None:
    return None


_KEY = _text(r"[+~]*[\w.\-/@]+", 200)


def _variable(value: Any, path: tuple) -> str | None:
    name = path[-1] if path and path[-1] not in ("env_copy",) else value
    if str(name) not in SAFE_VARIABLES:
        return (
            f"sets {name} for the job; a config file may set only thread counts and device "
            f"visibility ({', '.join(sorted(SAFE_VARIABLES))}): other variables can make the "
            "job load code or connect elsewhere"
        )
    return _text()(value if isinstance(value, str) else str(value), path)


_LOGGING = (
    "is a logging setting a config file wrote: logging.config acts on every key (a "
    "handler's '.' mapping sets attributes, a format string and a file name choose what "
    "is written where) before any check of art_hydra; only a named preset may be chosen"
)
_SEARCHPATH = (
    "adds places Hydra reads configs from (a pkg:// entry imports that package, a folder "
    "may shadow any config); a config file may not widen where configs come from"
)
_TARGET = "names the class Hydra instantiates; a config file may choose a plugin only by name"
_PLACE = "is a place the plugin writes to or a line of its job script"
_CODE = "holds an object Hydra instantiates (a _target_), which only the command line may choose"

SAMPLERS: dict[str, dict[str, Check]] = {
    "optuna.samplers.TPESampler": {
        "seed": _number(0, 2**32),
        "consider_prior": _flag,
        "prior_weight": _number(0, 1e6, False),
        "consider_magic_clip": _flag,
        "consider_endpoints": _flag,
        "n_startup_trials": _number(0, 10**6),
        "n_ei_candidates": _number(1, 10**6),
        "multivariate": _flag,
        "warn_independent_sampling": _flag,
    },
    "optuna.samplers.RandomSampler": {"seed": _number(0, 2**32)},
    "optuna.samplers.CmaEsSampler": {
        "seed": _number(0, 2**32),
        "x0": _mapping(_KEY, _number(-1e12, 1e12, False)),
        "sigma0": _number(0, 1e12, False),
        "warn_independent_sampling": _flag,
        "consider_pruned_trials": _flag,
        "inc_popsize": _number(1, 1000),
        "use_separable_cma": _flag,
        "independent_sampler": _never(_CODE),
        "restart_strategy": _never(_CODE),
        "source_trials": _never(_CODE),
    },
    "optuna.samplers.NSGAIISampler": {
        "seed": _number(0, 2**32),
        "population_size": _number(2, 10**6),
        "mutation_prob": _number(0, 1, False),
        "crossover_prob": _number(0, 1, False),
        "swapping_prob": _number(0, 1, False),
        "constraints_func": _never("names a function the sampler calls for every trial"),
    },
    "optuna.samplers.MOTPESampler": {
        "seed": _number(0, 2**32),
        "consider_prior": _flag,
        "prior_weight": _number(0, 1e6, False),
        "consider_magic_clip": _flag,
        "consider_endpoints": _flag,
        "n_startup_trials": _number(0, 10**6),
        "n_ehvi_candidates": _number(1, 10**6),
    },
    "optuna.samplers.GridSampler": {},
}
_DISTRIBUTION = {
    "type": _one_of("int", "float", "categorical"),
    "choices": _items(_sweep_value, 1024),
    "low": _number(-1e300, 1e300, False),
    "high": _number(-1e300, 1e300, False),
    "log": _flag,
    "step": _number(0, 1e300, False),
}
_SWEEP = {"max_batch_size": _number(1, 10**6), "params": _mapping(_KEY, _sweep_value, 4096)}
_QUEUE = {
    "timeout_min": _number(1, 10**6),
    "cpus_per_task": _number(1, 4096),
    "gpus_per_node": _number(0, 1024),
    "tasks_per_node": _number(1, 1024),
    "mem_gb": _number(0, 10**6),
    "nodes": _number(1, 10**5),
    "name": _text(r"[\w.+-]+", 128),
    "stderr_to_stdout": _flag,
    "submitit_folder": _never(_PLACE),
}
_SLURM_TEXT = ("partition", "qos", "comment", "constraint", "exclude", "gres", "account")
PLUGINS: dict[str, dict[str, Any]] = {
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper": _SWEEP,
    "hydra_plugins.art_hydra_preflight.preflight_sweeper.PreflightSweeper": {
        **_SWEEP,
        "skip_invalid": _flag,
    },
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper": {
        "sampler": SAMPLERS,
        "direction": _one_of("minimize", "maximize"),
        "study_name": _text(r"[\w.+-]+", 128),
        "n_trials": _number(1, 10**6),
        "n_jobs": _number(1, 4096),
        "max_failure_rate": _number(0, 1, False),
        "params": _mapping(_KEY, _sweep_value, 4096),
        "search_space": _mapping(_KEY, _mapping(_text(max_len=16), _sweep_value)),
        "storage": _never(
            "is where the sweeper writes its study (a database anywhere, or a server)"
        ),
        "custom_search_space": _never("names a function the sweeper calls for every trial"),
    },
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher": {},
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": {
        "n_jobs": _number(-1024, 4096),
        "backend": _one_of(None, "loky", "threading", "multiprocessing"),
        "prefer": _one_of(None, "processes", "threads"),
        "require": _one_of(None, "sharedmem"),
        "verbose": _number(0, 100),
        "timeout": _number(0, 1e9, False),
        "pre_dispatch": _text(r"all|\d+|(\d+\s*\*\s*)?n_jobs", 32),
        "batch_size": _text(r"auto|\d+", 16),
        "max_nbytes": _text(r"\d+[KMG]?", 16),
        "mmap_mode": _one_of(None, "r+", "r", "w+", "c"),
        "temp_folder": _never(_PLACE),
    },
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher": _QUEUE,
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": {
        **_QUEUE,
        **{name: _text(r"[\w.,:=+\-/%@\[\] ]*", 128) for name in _SLURM_TEXT},
        "cpus_per_gpu": _number(1, 4096),
        "gpus_per_task": _number(0, 1024),
        "mem_per_gpu": _text(r"\d+[KMGT]?", 16),
        "mem_per_cpu": _text(r"\d+[KMGT]?", 16),
        "signal_delay_s": _number(0, 10**6),
        "max_num_timeout": _number(0, 1000),
        "array_parallelism": _number(1, 10**6),
        "setup": _never("holds shell lines the job script runs"),
        "additional_parameters": _never(_PLACE),
    },
}


class _Plugin:
    """The settings of the plugin a ``_target_`` names (``hydra.sweeper``, ...)."""

    def __init__(self, table: dict[str, dict[str, Any]]) -> None:
        self.table = table

    def fields(self, target: Any) -> dict[str, Any]:
        return {"_target_": _ok, "_partial_": _ok, **self.table.get(str(target), {})}


SAMPLERS_OF = _Plugin(SAMPLERS)
PLUGINS["hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"]["sampler"] = SAMPLERS_OF
#: The keys below ``hydra`` a config file may set, each with its bound.
ALLOWED: dict[str, Any] = {
    "run": {"dir": _ok},
    "sweep": {"dir": _ok, "subdir": _ok},
    "mode": _one_of(None, "RUN", "MULTIRUN"),
    "verbose": lambda v, p: (
        None if isinstance(v, bool) else _items(_KEY)(v if isinstance(v, list) else [v], p)
    ),
    "job": {
        "name": _ok,
        "chdir": _flag,
        "env_set": {"*": _variable},
        "env_copy": _items(_variable),
        "config": {
            "override_dirname": {
                "kv_sep": _text(r"[=:_,+-]{1,3}", 3),
                "item_sep": _text(r"[=:_,+-]{1,3}", 3),
                "exclude_keys": _items(_KEY, 256),
            }
        },
    },
    "sweeper": _Plugin(PLUGINS),
    "launcher": _Plugin(PLUGINS),
    "job_logging": _never(_LOGGING),
    "hydra_logging": _never(_LOGGING),
    "searchpath": _never(_SEARCHPATH),
    "callbacks": {"*": _never("is a Hydra callback: Hydra imports and calls its _target_")},
}


# ---- who set what ----------------------------------------------------------------------


@functools.cache
def _shipped_sources() -> frozenset[str]:
    """art_hydra's shipped ``conf/`` as a config source: the installed package, or a
    source checkout's folder."""
    folder = Path(__file__).resolve().parents[2] / "conf"
    return frozenset({"pkg://art_hydra.conf", f"file://{folder}"})


def _trusted_source(file: hydra_compat.ConfigFile) -> bool:
    """Hydra's own configs, an installed plugin's, art_hydra's shipped ``conf/``."""
    if file.source in ("structured://", "pkg://hydra.conf") or file.source in _shipped_sources():
        return True
    by_file = file.provider in ("main", "command-line") or file.provider.startswith("hydra.")
    return file.source.startswith("pkg://") and not by_file


def _hand_chosen(file: hydra_compat.ConfigFile, hand: Any, choices: dict) -> tuple | None:
    """The package (a path below ``hydra``) of a ``hydra/...`` option the user chose on
    the command line (None: not one)."""
    group, _, option = file.config_path.rpartition("/")
    if group.startswith("hydra/") and hand.chose(group) and str(choices.get(group)) == option:
        return tuple(group.split("/")[1:])
    return None


def file_set(cfg: Any, hand: Any, files: Any, choices: dict) -> dict[tuple, Any]:
    """Leaf paths below ``hydra`` that a config file from elsewhere set, to a value other
    than the trusted configs give, and that the command line did not set; each with the
    file that set it."""
    trusted: dict[tuple, Any] = {}
    untrusted: dict[tuple, Any] = {}
    for file in files:
        own = None if _trusted_source(file) else _hand_chosen(file, hand, choices)
        for path, value in file.hydra.items():
            if _trusted_source(file) or (own is not None and path[: len(own)] == own):
                trusted[path] = value
            else:
                untrusted[path] = file
    if not untrusted:
        return {}
    try:
        final = OmegaConf.to_container(cfg.hydra, resolve=False)
    except Exception:
        final = {}
    found = {}
    for path, file in untrusted.items():
        key = ".".join(("hydra", *path))
        if hand.set(key) or hand.chose(key):  # (hydra.searchpath counts as a group)
            continue
        missing = object()
        value = _at(final, path, missing)
        if value is missing or (path in trusted and trusted[path] == value):
            continue
        found[path] = file
    return found


def _at(node: Any, path: tuple, default: Any) -> Any:
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def verdict(cfg: Any, path: tuple, view: Callable[[str], Any]) -> tuple[tuple, str | None]:
    """``(the unit path the setting at path belongs to, why a file may not set it)``:
    walked down :data:`ALLOWED`, a plugin's table chosen by its ``_target_``."""
    spec: Any = ALLOWED
    for i, part in enumerate(path):
        if isinstance(spec, _Plugin):
            target = view(".".join(("hydra", *path[:i], "_target_")))
            if str(target) not in spec.table:
                unknown = f"is a setting of {target}, a plugin art_hydra has no table of"
                return path[: i + 1], _TARGET if part == "_target_" else unknown
            spec = spec.fields(target)
        if callable(spec):
            return path[:i], spec(view(".".join(("hydra", *path[:i]))), path[:i])
        if part in spec or "*" in spec:
            spec = spec.get(part, spec.get("*"))
            continue
        return path[: i + 1], "is not a setting a config file may give"
    if isinstance(spec, _Plugin):
        return path, "chooses a plugin by a mapping; a config file may choose one only by name"
    if callable(spec):
        if path[-1] == "_target_" and str(view(".".join(("hydra", *path)))) not in _CLASSES:
            return path, _TARGET
        return path, spec(view(".".join(("hydra", *path))), path)
    return path, "is a section of settings; a config file may set only its keys"


_CLASSES = frozenset({*PLUGINS, *SAMPLERS})


# ---- the problems ----------------------------------------------------------------------


def problems(
    cfg: Any, hand: Any, chosen: Any, flagged: set[str], view: Callable[[str], Any]
) -> list[Problem]:
    """Every ``hydra.*`` setting a config file may not give (one problem per unit, none
    for a unit another check already named), every output folder out of its bound, and
    every ``hydra/...`` option chosen by hand that a folder of config files shadows."""
    found = folder_problems(cfg, hand, view)
    files = getattr(chosen, "files", None)
    if files is None:
        return found
    choices = dict(getattr(chosen, "choices", {}) or {})
    units: dict[tuple, tuple[str, Any]] = {}
    for path, file in file_set(cfg, hand, files, choices).items():
        unit, why = verdict(cfg, path, view)
        if why is not None and unit not in units:
            units[unit] = (why, file)
    for unit, (why, file) in units.items():
        key = ".".join(("hydra", *unit))
        if any(_overlap(key, k) for k in flagged):
            continue
        found.append(_file_problem(key, _shown(view(key)), why, file))
    return found + _shadow_problems(hand, chosen, choices, files)


def _shown(value: Any) -> Any:
    """A value for the report: a large mapping by its keys."""
    if isinstance(value, dict) and len(repr(value)) > 120:
        return "{" + ", ".join(f"{k}: ..." for k in value) + "}"
    return value


#: Who ships an option, by the provider of its config source.
_OWNERS = {"schema": "an installed plugin", "hydra": "Hydra", "main": "art_hydra"}


def _overlap(key: str, other: str) -> bool:
    return key == other or other.startswith(f"{key}.") or key.startswith(f"{other}.")


def _file_name(file: hydra_compat.ConfigFile) -> str:
    scheme, _, root = file.source.partition("://")
    if scheme == "file":
        return os.path.join(root, f"{file.config_path}.yaml")
    return f"{file.source}/{file.config_path}"


def _file_problem(key: str, value: Any, why: str, file: hydra_compat.ConfigFile) -> Problem:
    logging = key.startswith(("hydra.job_logging", "hydra.hydra_logging"))
    if logging:
        group = key.split(".")[1]
        remedy = fix(
            note=f"choose a logging config by name on the command line (hydra/{group}=default, "
            f"disabled, none, ...), or set {key}... there, if you trust it"
        )
    else:
        remedy = fix(
            note=f"drop it from that file, or set {key}=... on the command line, if you trust it"
        )
    return Problem(
        key,
        value,
        f"is set by the config file {_file_name(file)} and {why}. (A config file may set "
        "only Hydra's output folders, job name, thread-count variables and the documented "
        "settings of an installed sweeper or launcher.)",
        remedy,
        Kind.override,
    )


def _shadow_problems(hand: Any, chosen: Any, choices: dict, files: Any) -> list[Problem]:
    """A ``hydra/...`` option typed on the command line that an installed plugin (or
    Hydra, or art_hydra) ships under that name, but that a folder of config files
    shadows with a file of its own: the user asked for the installed one."""
    found = []
    shadowed = getattr(chosen, "shadowed", None)
    for file in files:
        own = None if _trusted_source(file) else _hand_chosen(file, hand, choices)
        if own is None or shadowed is None:
            continue
        owner = shadowed(file.config_path)
        if owner is None:
            continue
        owner = _OWNERS.get(owner, owner)
        group, _, option = file.config_path.rpartition("/")
        found.append(
            Problem(
                group,
                option,
                f"is chosen on the command line by the name of the option {owner} ships, but "
                f"the config file {_file_name(file)} has the same name and Hydra would take it "
                "instead: a file could put code where you chose the installed one.",
                fix(
                    note=f"remove or rename {_file_name(file)} (then {group}={option} is "
                    f"{owner}'s), or choose the file by its new name"
                ),
                Kind.group,
            )
        )
    return found


# ---- output folders --------------------------------------------------------------------

#: Values Hydra sets for each job, unknown while composing (a stand-in is checked).
_RUNTIME = re.compile(r"\$\{hydra[.:]job\.(num|id)\}")
_MAX_PATH = 1024


def folder_problems(cfg: Any, hand: Any, view: Callable[[str], Any]) -> list[Problem]:
    """The folders Hydra writes to, resolved, within their bounds unless set by hand."""
    if not isinstance(cfg, DictConfig) or "hydra" not in cfg:
        return []
    root = os.path.abspath(str(view("hydra.runtime.cwd") or os.getcwd()))
    found = []
    for key, check in (
        ("hydra.run.dir", _inside(root)),
        ("hydra.sweep.dir", _inside(root)),
        ("hydra.sweep.subdir", _relative),
        ("hydra.job.name", _job_name),
    ):
        if hand.set(key):
            continue
        value = _folder_value(cfg, key)
        why = check(value) if isinstance(value, str) else None
        if why is not None:
            found.append(
                Problem(
                    key,
                    value,
                    f"{why}: a config file may not choose where Hydra writes.",
                    fix(note=f"drop it from the config file, or set {key}=... on the command line"),
                    Kind.override,
                )
            )
    return found


def _folder_value(cfg: DictConfig, key: str) -> Any:
    """The value at ``key`` resolved, a job's number standing in as 0 where it is not
    known yet; None where it cannot be resolved (another check names that)."""
    try:
        return str(OmegaConf.select(cfg, key, throw_on_missing=True))
    except Exception:
        pass
    try:
        parent, _, leaf = key.rpartition(".")
        raw = hydra_compat.raw_value(OmegaConf.select(cfg, parent), leaf)
        text = _RUNTIME.sub("0", str(raw))
        return text if "${" not in text else str(hydra_compat.resolve_text(cfg, text))
    except Exception:
        return None


def _bad_text(value: str) -> str | None:
    if "\x00" in value or len(value) > _MAX_PATH or not value.strip():
        return f"is {value!r}, not a folder name of 1 to {_MAX_PATH} characters"
    return None


def _inside(root: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        bad = _bad_text(value)
        if bad:
            return bad
        full = os.path.normpath(os.path.join(root, value))
        if os.path.commonpath([root, full]) != root:
            return f"is {value}, outside the folder the command was started in ({root})"
        return None

    return check


def _relative(value: str) -> str | None:
    bad = _bad_text(value)
    if bad:
        return bad
    parts = os.path.normpath(value).split(os.sep)
    if os.path.isabs(value) or parts[0] == "..":
        return f"is {value}, which leads out of the sweep folder"
    return None


def _job_name(value: str) -> str | None:
    if re.fullmatch(r"[\w][\w.+-]{0,127}", value) is None:
        return f"is {value!r}, not a plain name (it names the job's log file)"
    return None
