"""Only code the user chose, by the user's own hand.

A config file may come from elsewhere (a shared experiment, a colleague's
``--config-dir``), so what it says may not widen what runs. "The user's hand" is the
command line (and ``compose(overrides=...)``, its Python twin): :func:`hand_of` reads
from the overrides which keys the user set (``key=v``, ``+key=v``, ``++key=v``) and which
groups they chose (``hydra/job_logging=x`` chooses that logging config's content; a
group like ``task=x`` or ``experiment=x`` chooses a file, not the code it names, so its
targets still need their markers). ``train(cfg)`` called from Python is the user's own
code: no hand is recorded there (None), and everything counts as chosen.

:func:`trust_problems` refuses, unless set by hand: ``model.trust_remote_code=true``
(the model folder's Python would run), a non-empty ``task.allowed_modules`` (it widens
which functions may run), a reward or generator whose source has no marker,
``hydra.callbacks`` (Hydra instantiates each ``_target_``), logging factories in
``hydra.job_logging``/``hydra.hydra_logging`` (``()`` keys, classes other than
logging's local sinks, ``ext://`` objects other than the standard streams:
``logging.config`` imports and calls them; and log files not named ``*.log``, since a
log line whose format a file chose, appended to ``~/.bashrc`` or a ``.pth`` file, is
code), submitit's ``hydra.launcher.setup`` shell lines (and any
launcher value with a line break, which would become its own line of the job script),
``hydra.job.env_set`` variables other than thread counts and device visibility, any
``_target_`` nested in the launcher's or sweeper's settings (Hydra instantiates them
recursively), a ``hydra.output_subdir`` other than art_hydra's pending record, and log
files outside the run folder or opened other than for appending. Beyond these named
cases, what a config file may set under ``hydra`` at all is an allowlist of bounded keys
(:mod:`art_hydra.config.hydra_section`): anything else is refused by key. Every check
reads the values as Hydra will act on them, interpolations resolved. It runs at composition
for every entry (the CLI, the sweep master, every sweep point, ``compose``), before
Hydra runs any callback or logging config. :func:`outside_code` lists, for a dry run,
every piece of code outside art_hydra the run would import or execute.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from art_hydra.config import hydra_compat, hydra_section
from art_hydra.config.problems import Kind, Problem, fix
from art_hydra.config.targets import (
    ART_HYDRA_ENVIRONMENTS,
    ART_HYDRA_GENERATORS,
    ART_HYDRA_REWARDS,
    ART_HYDRA_TOOLS,
    key_role,
    marker_in_source,
    module_origin,
    not_marked,
    refusal,
)

#: Environment variables a config file may set through ``hydra.job.env_set``: thread
#: counts and device visibility. Any other variable may change what the job loads or
#: where it connects (``LD_PRELOAD``, ``PYTHONPATH``, torch.distributed's ``MASTER_ADDR``
#: and ``RANK``, ``HF_ENDPOINT``, proxies, ...), so only the command line sets it.
SAFE_VARIABLES = hydra_section.SAFE_VARIABLES
#: The record Hydra writes for each job goes here (conf/config.yaml): renamed to
#: ``.hydra`` under the run folder's lock.
JOB_RECORD = "${art_hydra.job_record:}"
#: Logging classes a config file may name: local sinks and formatters (Hydra's own
#: defaults use these); the network handlers (socket, HTTP, SMTP, syslog) would send the
#: run's log elsewhere.
LOGGING_CLASSES = frozenset(
    {
        "logging.StreamHandler", "logging.FileHandler", "logging.NullHandler",
        "logging.Formatter", "logging.Filter", "logging.handlers.RotatingFileHandler",
        "logging.handlers.TimedRotatingFileHandler", "logging.handlers.WatchedFileHandler",
        "logging.handlers.MemoryHandler",
    }
)  # fmt: skip
#: ``ext://`` objects a logging config may name: the standard streams.
_STREAMS = frozenset({"ext://sys.stdout", "ext://sys.stderr"})


@dataclass(frozen=True)
class Hand:
    """What the user set with their own hand: keys and chosen groups."""

    keys: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def set(self, key: str) -> bool:
        """Whether ``key`` (or a mapping above it) was set by hand."""
        parts = key.split(".")
        return any(".".join(parts[: i + 1]) in self.keys for i in range(len(parts)))

    def chose(self, group: str) -> bool:
        return group in self.groups


def hand_of(overrides: Sequence[str], is_group: Callable[[str], bool]) -> Hand:
    """The keys and groups ``overrides`` set by hand (deletions widen nothing)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    keys: set[str] = set()
    groups: set[str] = set()
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception:
            continue  # composition reports it
        if override.is_delete():
            continue
        name = override.key_or_group
        if "/" in name or is_group(name):
            groups.add(name)
        else:
            keys.update(_leaves(name, override.value()))
    return Hand(frozenset(keys), frozenset(groups))


def _leaves(key: str, value: Any) -> Iterator[str]:
    """The keys a value sets: a mapping sets its leaves (``task.reward={}`` sets none),
    anything else the key itself."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(f"{key}.{k}", v)
    else:
        yield key


_current: ContextVar[Hand | None] = ContextVar("art_hydra_hand", default=None)


def current_hand() -> Hand | None:
    """The hand of the config being checked or run (None: a Python caller's config)."""
    return _current.get()


@contextmanager
def by_hand(hand: Hand | None) -> Iterator[None]:
    """Check and run a config whose hand-set keys are ``hand``."""
    token = _current.set(hand)
    try:
        yield
    finally:
        _current.reset(token)


def _select(cfg: Any, key: str, default: Any = None) -> Any:
    try:
        return OmegaConf.select(cfg, key, default=default)
    except Exception:
        try:
            return OmegaConf.select(cfg, key, default=default, throw_on_resolution_failure=False)
        except Exception:
            return default


def _view(cfg: Any, key: str) -> Any:
    """``key``'s value as Hydra will act on it: plain data with every interpolation that
    can be resolved now resolved (a handler written as ``${task.params.p}`` is checked as
    the mapping it becomes); one that cannot be resolved yet (Hydra's runtime values)
    stays as its text."""
    try:
        node = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
    except Exception:
        return None
    return _resolved(node)


def _resolved(node: Any) -> Any:
    if isinstance(node, DictConfig):
        return {k: _resolved(_child(node, k)) for k in node}
    if OmegaConf.is_list(node):
        return [_resolved(_child(node, i)) for i in range(len(node))]
    return node


def _child(node: Any, key: Any) -> Any:
    try:
        return node[key]
    except Exception:  # missing or not resolvable yet: the text Hydra will resolve later
        return hydra_compat.raw_value(node, key)


def _refused(key: str, value: Any, reason: str, remedy: Any) -> Problem:
    return Problem(key, value, reason, remedy, Kind.override)


#: The content of the option a group has in a composed config (None: unknown).
GroupContent = Callable[[str], Any]


def trust_problems(
    cfg: Any, hand: Hand | None, chosen: GroupContent | None = None
) -> list[Problem]:
    """Everything in ``cfg`` (composed, with its ``hydra`` node if any) that would run
    code a config file chose and the user did not set by hand. ``chosen(group)`` gives
    the file of a group's option alone: of a logging config chosen by hand, only what
    that file says is trusted, not what another config file merged into it."""
    if hand is None:
        return []
    found = _run_config_problems(cfg, hand)
    if _select(cfg, "hydra") is not None:
        found += _hydra_problems(cfg, hand, chosen)
    return found


def _run_config_problems(cfg: Any, hand: Hand) -> list[Problem]:
    found: list[Problem] = []
    if _select(cfg, "model.trust_remote_code") is True and not hand.set("model.trust_remote_code"):
        name = _select(cfg, "model.name")
        found.append(
            _refused(
                "model.trust_remote_code",
                True,
                f"is set by a config file: it would run the Python code that comes with the "
                f"model '{name}' (its modeling files), and only you may decide that.",
                fix(
                    {"model.trust_remote_code": True},
                    f"on the command line, if you trust the code of '{name}'",
                    alt=fix({"model.trust_remote_code": False}),
                ),
            )
        )
    found += _chat_template_problems(cfg, hand)
    modules = _view(cfg, "task.allowed_modules") or []
    hand_modules = hand.set("task.allowed_modules")
    if modules and not hand_modules:
        found.append(
            _refused(
                "task.allowed_modules",
                modules,
                "is set by a config file; a config file cannot widen which functions may run "
                "as a reward or generator.",
                fix(
                    {"task.allowed_modules": list(modules)},
                    "on the command line, if you trust every function in these modules; or mark "
                    "the functions @reward / @generator",
                ),
            )
        )
    found += _reward_shorthand_problems(cfg, hand)
    keys = reward_keys(cfg)
    if str(_select(cfg, "task.source")) in ("generated", "TaskSource.generated"):
        keys.append("task.generator")
    keys += agent_keys(cfg)
    for key in keys:
        path = _select(cfg, key)
        if path is None or refusal(path, key) is not None or hand.set(key):
            continue
        module = str(path).rpartition(".")[0]
        if hand_modules and any(module == m or module.startswith(f"{m}.") for m in modules):
            continue
        if marker_in_source(str(path), key_role(key)) is not True:
            found.append(
                _refused(
                    key,
                    path,
                    not_marked(str(path), key),
                    fix(
                        {key: path},
                        f"on the command line, if you trust it; or mark it @{key_role(key)}",
                    ),
                )
            )
    return found


def _chat_template_problems(cfg: Any, hand: Hand) -> list[Problem]:
    """A config file may name a shipped chat template or a ``.jinja`` file, not any
    readable file: a template's text goes into every prompt and into the tokenizer saved
    with checkpoints, so ``model.chat_template=~/.ssh/id_rsa`` in an experiment from
    elsewhere would copy a secret into the run's outputs. The command line may name any."""
    value = _select(cfg, "model.chat_template")
    if not value or hand.set("model.chat_template"):
        return []
    text = str(value)
    # A shipped template's name (art_hydra.templates.is_shipped_name: the config layer
    # imports no floor above it) or a .jinja file.
    if re.fullmatch(r"[A-Za-z0-9_\-]+", text) or text.endswith(".jinja"):
        return []
    return [
        _refused(
            "model.chat_template",
            text,
            "is set by a config file, which may name a shipped template or a .jinja file "
            "only: a template's text goes into every prompt and into the saved tokenizer.",
            fix(
                {"model.chat_template": text},
                "on the command line, if that file is a chat template; or name it *.jinja",
            ),
        )
    ]


def agent_keys(cfg: Any) -> list[str]:
    """The keys of the agent code the run imports: ``task.environment._target_`` when an
    environment names a class, and each ``task.tools.N``."""
    keys = []
    environment = _view(cfg, "task.environment")
    if isinstance(environment, dict) and environment.get("_target_"):
        keys.append("task.environment._target_")
    tools = _view(cfg, "task.tools")
    keys += [f"task.tools.{i}" for i in range(len(tools))] if isinstance(tools, list) else []
    return keys


def _reward_entries(cfg: Any) -> list[Any]:
    """``task.rewards`` as plain data (an empty list when absent or not a list)."""
    entries = _view(cfg, "task.rewards")
    return entries if isinstance(entries, list) else []


def reward_keys(cfg: Any) -> list[str]:
    """The keys of the rewards that run: every ``task.rewards.N._target_`` when the list
    is not empty (it replaces the shorthand), else ``task.reward._target_``."""
    entries = _reward_entries(cfg)
    if entries:
        return [f"task.rewards.{i}._target_" for i in range(len(entries))]
    return ["task.reward._target_"]


def _reward_shorthand_problems(cfg: Any, hand: Hand) -> list[Problem]:
    """``task.reward._target_`` set by hand while ``task.rewards`` is not empty would do
    nothing (the list replaces it): refused, whoever set the list."""
    entries = _reward_entries(cfg)
    key = "task.reward._target_"
    if not entries or not hand.set(key):
        return []
    mine = _select(cfg, key)
    shown = ", ".join(
        f"{{_target_: {e.get('_target_')}, weight: {e.get('weight', 1.0)}}}"
        for e in entries
        if isinstance(e, dict)
    )
    by = "on the command line too" if hand.set("task.rewards") else "by a config file"
    return [
        _refused(
            key,
            mine,
            f"is set by hand, but task.rewards is set {by} and, not empty, replaces "
            f"task.reward: {mine} would not run. Name every reward in one place.",
            fix(
                note=f"drop {key}={mine} and list it with the others: "
                f"'task.rewards=[{{_target_: {mine}, weight: 1.0}}, {shown}]'",
                alt=fix(note=f"keep {key}={mine} alone with task.rewards=[]"),
            ),
        )
    ]


def _hydra_problems(cfg: Any, hand: Hand, chosen: GroupContent | None) -> list[Problem]:
    found: list[Problem] = []
    callbacks = _view(cfg, "hydra.callbacks") or {}
    for name, entry in callbacks.items() if isinstance(callbacks, dict) else []:
        key = f"hydra.callbacks.{name}"
        if entry and not hand.set(f"{key}._target_"):
            target = entry.get("_target_") if isinstance(entry, dict) else entry
            found.append(
                _refused(
                    key,
                    target,
                    "is a Hydra callback set by a config file: Hydra imports and calls its "
                    "_target_ around the run, before art_hydra's checks could stop it.",
                    fix(
                        note=f"set {key} on the command line (+{key}._target_={target} and "
                        "its arguments), if you trust it"
                    ),
                )
            )
    for node in ("job_logging", "hydra_logging"):
        trusted = _hand_chosen_spots(f"hydra/{node}", hand, chosen)
        if trusted is None:
            continue
        logging = _view(cfg, f"hydra.{node}")
        run_dir = _view(cfg, "hydra.runtime.output_dir")
        for where, value, why in [*logging_code(logging), *logging_files(logging, run_dir)]:
            key = f"hydra.{node}.{where}"
            if (where, value) not in trusted and not hand.set(key):
                found.append(
                    _refused(
                        key,
                        value,
                        f"{why}, in a logging config a config file chose: logging.config "
                        "acts on it when Hydra sets up logging, before any check of art_hydra.",
                        fix(
                            note=f"choose the logging config on the command line "
                            f"(hydra/{node}=<name>), or set {key} there, if you trust it"
                        ),
                    )
                )
    found += _launcher_problems(cfg, hand, chosen)
    found += _sweeper_setting_problems(cfg, hand)
    found += _launcher_place_problems(cfg, hand, chosen)
    found += _env_problems(cfg, hand)
    found += _output_subdir_problems(cfg, hand)
    # The design: an allowlist of what a file may set, each value bounded; the checks
    # above name the worst cases in their own words, and this one everything else.
    return found + hydra_section.problems(cfg, hand, chosen, {p.key for p in found}, _view_of(cfg))


def _view_of(cfg: Any) -> Callable[[str], Any]:
    return lambda key: _view(cfg, key)


def _env_problems(cfg: Any, hand: Hand) -> list[Problem]:
    found = []
    env = _view(cfg, "hydra.job.env_set") or {}
    for name, value in env.items() if isinstance(env, dict) else []:
        key = f"hydra.job.env_set.{name}"
        if str(name) not in SAFE_VARIABLES and not hand.set(key):
            found.append(
                _refused(
                    key,
                    value,
                    f"sets {name} for the job from a config file; a config file may set only "
                    f"thread counts and device visibility ({', '.join(sorted(SAFE_VARIABLES))}): "
                    "other variables can make the job load code or connect elsewhere.",
                    fix(note=f"+{key}={value} on the command line, if you trust it"),
                )
            )
    return found


def _output_subdir_problems(cfg: Any, hand: Hand) -> list[Problem]:
    """Hydra writes each job's record under ``hydra.output_subdir``: it must stay inside
    the run folder, and only the command line may move it from art_hydra's pending
    record (which is renamed to ``.hydra`` only under the folder's lock)."""
    hydra = _select(cfg, "hydra")
    raw = (
        hydra_compat.raw_value(hydra, "output_subdir")
        if isinstance(hydra, DictConfig) and "output_subdir" in hydra
        else None
    )
    if raw is None or raw == JOB_RECORD:
        return []
    key = "hydra.output_subdir"
    text = str(raw)
    parts = Path(os.path.normpath(text)).parts
    if text.startswith(("/", "~")) or (parts and parts[0] == ".."):
        reason = "would put Hydra's record of the job outside the run folder."
    elif not hand.set(key):
        reason = (
            "is set by a config file; Hydra would write the job's record there before the "
            "job holds the run folder's lock (a refused job could overwrite a running one's)."
        )
    else:
        return []
    return [_refused(key, raw, reason, fix(note=f"drop {key} (art_hydra's own: {JOB_RECORD})"))]


def _hand_chosen_spots(
    group: str, hand: Hand, chosen: GroupContent | None
) -> set[tuple[str, str]] | None:
    """The code spots of the logging config the user chose by hand (None: trust the whole
    node, when its file cannot be read alone; empty: not chosen by hand)."""
    if not hand.chose(group):
        return set()
    content = chosen(group) if chosen is not None else None
    if content is None:
        return None
    return {(w, v) for w, v, _ in [*logging_code(content), *logging_files(content)]}


def _launcher_problems(cfg: Any, hand: Hand, chosen: GroupContent | None = None) -> list[Problem]:
    found: list[Problem] = []
    setup = _view(cfg, "hydra.launcher.setup")
    if setup and not hand.set("hydra.launcher.setup"):
        found.append(
            _refused(
                "hydra.launcher.setup",
                setup,
                "holds shell lines set by a config file; submitit runs them in each job's "
                "script before the job starts.",
                fix(note="hydra.launcher.setup=[...] on the command line, if you trust them"),
            )
        )
    launcher = _view(cfg, "hydra.launcher")
    for where, value in _strings(launcher if isinstance(launcher, dict) else {}):
        key = f"hydra.launcher.{where}"
        if "\n" in value and not where.startswith("setup") and not hand.set(key):
            found.append(
                _refused(
                    key,
                    value,
                    "has a line break: in a job script a value with a line break becomes a "
                    "line of its own, a command the shell runs.",
                    fix(note=f"write {key} on one line"),
                )
            )
    for plugin in ("launcher", "sweeper"):
        node = _view(cfg, f"hydra.{plugin}")
        # The plugin's own config, chosen by hand (hydra/sweeper=optuna), is the user's
        # choice as a whole: its sampler's _target_ is the plugin's, not a config file's.
        trusted = _plugin_targets(plugin, hand, chosen)
        for where, target in _nested_targets(node if isinstance(node, dict) else {}):
            key = f"hydra.{plugin}.{where}"
            if (where, target) not in trusted and not hand.set(key):
                found.append(
                    _refused(
                        key,
                        target,
                        f"is a _target_ inside the {plugin}'s settings: Hydra instantiates "
                        f"everything below the {plugin}, so a config file would choose code "
                        "that runs before any check of art_hydra.",
                        fix(
                            note=f"remove it from the {plugin} config, or set {key} on the "
                            "command line, if you trust it"
                        ),
                    )
                )
    return found


#: Sweeper settings that name code or a place the sweeper writes to or connects to, by
#: another name than ``_target_``: Optuna imports and calls ``custom_search_space``
#: (``module.function``) for every trial, and opens ``storage`` (a database URL: a file
#: anywhere, or another machine that receives every trial and can feed trials back).
SWEEPER_CODE_AND_PLACES = {
    "custom_search_space": "names a function the sweeper imports and calls for every trial",
    "storage": "is where the sweeper writes its study (a database file anywhere, or a server "
    "that receives every trial)",
}


#: submitit launcher settings that become lines of every job's batch script (``#SBATCH
#: --export=...,LD_PRELOAD=...``, ``--output=~/.bashrc``) or choose where it writes.
LAUNCHER_PLACES = ("additional_parameters", "srun_args", "submitit_folder")


def _launcher_place_problems(cfg: Any, hand: Hand, chosen: GroupContent | None) -> list[Problem]:
    """Those settings as the launcher's own config file has them (a launcher option the
    user chose by hand, or one that comes with an installed package) or set by hand;
    anything a config file put there instead is refused."""
    launcher = _select(cfg, "hydra.launcher")
    if not isinstance(launcher, DictConfig):
        return []
    group = "hydra/launcher"
    own = None
    installed = getattr(chosen, "installed", None)
    if chosen is not None and (hand.chose(group) or (installed is not None and installed(group))):
        own = chosen(group)
    found = []
    for name in LAUNCHER_PLACES:
        if name not in launcher:
            continue
        node = hydra_compat.child_node(launcher, name)
        raw = (
            OmegaConf.to_container(node, resolve=False)
            if isinstance(node, (DictConfig, ListConfig))
            else hydra_compat.raw_value(launcher, name)
        )
        key = f"hydra.launcher.{name}"
        if raw in (None, "", {}, []) or hand.set(key):
            continue
        mine = own.get(name) if isinstance(own, dict) else None
        if mine == raw:
            continue
        if isinstance(raw, dict):  # entries the launcher's file has, or typed by hand, pass
            mine = mine if isinstance(mine, dict) else {}
            raw = {k: v for k, v in raw.items() if mine.get(k) != v and not hand.set(f"{key}.{k}")}
            if not raw:
                continue
        found.append(
            _refused(
                key,
                raw,
                "is set by a config file: it becomes part of every job's batch script (its "
                "environment, its output files), and only the command line may choose that.",
                fix(note=f"drop it from the config file, or set {key}=... on the command line"),
            )
        )
    return found


def _sweeper_setting_problems(cfg: Any, hand: Hand) -> list[Problem]:
    found = []
    for name, what in SWEEPER_CODE_AND_PLACES.items():
        key = f"hydra.sweeper.{name}"
        value = _view(cfg, key)
        if value in (None, "", "???") or hand.set(key):
            continue
        found.append(
            _refused(
                key,
                value,
                f"is set by a config file and {what}: only the command line may choose that.",
                fix(note=f"drop it from the config file, or set {key}=... on the command line"),
            )
        )
    return found


def _plugin_targets(plugin: str, hand: Hand, chosen: GroupContent | None) -> set[tuple[str, str]]:
    """The ``_target_`` spots of a launcher or sweeper the user chose by hand
    (``hydra/sweeper=optuna``): its config file's own, and those of the options its
    sub-groups take from the installed plugin (Optuna's ``sampler: tpe``) or that the
    user chose by hand too (``hydra/sweeper/sampler=mine``)."""
    group = f"hydra/{plugin}"
    if chosen is None or not hand.chose(group):
        return set()
    own = chosen(group)
    trusted = set(_nested_targets(own)) if isinstance(own, dict) else set()
    installed = getattr(chosen, "installed", None)
    for sub in getattr(chosen, "choices", {}):
        if not sub.startswith(f"{group}/"):
            continue
        if not hand.chose(sub) and (installed is None or not installed(sub)):
            continue  # an option a config file chose from a folder of config files
        content = chosen(sub)
        if isinstance(content, dict):
            trusted |= set(_nested_targets({sub.removeprefix(f"{group}/"): content}))
    return trusted


def _nested_targets(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """``_target_`` keys below the top of a plugin's settings (the plugin's own class,
    which Hydra restricts to plugins, is at the top)."""
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{where}.{k}" if where else str(k)
            if k in ("_target_", "_partial_") and where:
                yield path, str(v)
            else:
                yield from _nested_targets(v, path)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _nested_targets(v, f"{where}[{i}]")


def _strings(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{where}[{i}]")
    elif isinstance(node, str):
        yield where, node


def logging_files(
    node: Any, run_dir: Any = None, where: str = ""
) -> Iterator[tuple[str, str, str]]:
    """Each log file of a ``dictConfig`` mapping that a config file may not choose: one
    outside the run folder (``run_dir``, or Hydra's ``${hydra.runtime.output_dir}``), one
    not named ``*.log`` (a log line whose format a file chose, appended to a shell's
    start-up file or a ``.pth`` file, is code), or opened other than for appending (it
    would truncate the file)."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            yield from logging_files(v, run_dir, f"{where}[{i}]")
    elif isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key == "filename":
                why = _log_file_refusal(value, run_dir)
                if why is not None:
                    yield path, str(value), why
            elif key == "mode" and "filename" in node and str(value) != "a":
                yield path, str(value), f"opens the log file with mode {value!r}, not 'a'"
            else:
                yield from logging_files(value, run_dir, path)


def _log_file_refusal(value: Any, run_dir: Any) -> str | None:
    text = str(value)
    if not text.endswith(".log"):
        return f"writes the log to {value}, a file not named *.log"
    folder, _, name = text.rpartition("/")
    inside = folder == "${hydra.runtime.output_dir}" or (
        isinstance(run_dir, str)
        and "${" not in run_dir
        and os.path.normpath(folder) == os.path.normpath(run_dir)
    )
    plain = name.replace("${hydra.job.name}", "job").replace("${hydra.job.num}", "0")
    if not inside or not name or "${" in plain:
        return f"writes the log to {value}, outside the run folder"
    return None


def logging_code(node: Any, where: str = "") -> Iterator[tuple[str, str, str]]:
    """Each place of a ``logging.config.dictConfig`` mapping that names code:
    ``(key path, value, what it is)``."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            yield from logging_code(v, f"{where}[{i}]")
        return
    if not isinstance(node, dict):
        if isinstance(node, str) and node.startswith("ext://") and node not in _STREAMS:
            yield where, node, f"names the object {node[6:]}"
        return
    for key, value in node.items():
        path = f"{where}.{key}" if where else str(key)
        if key == "()":
            yield path, str(value), f"is a factory, {value}"
        elif key == "class" and str(value) not in LOGGING_CLASSES:
            yield path, str(value), f"is the class {value}, not one of logging's local sinks"
        elif key in ("queue", "listener") and isinstance(value, str):
            yield path, value, f"names the object {value}"
        else:
            yield from logging_code(value, path)


# ---- the dry run's account ----------------------------------------------------------


def outside_code(cfg: Any, hydra: Any = None) -> list[tuple[str, str, str]]:
    """Every piece of code outside art_hydra the run would import or execute, as
    ``(what, name, file)``; ``hydra`` is the run's ``hydra`` node (or None)."""
    found: list[tuple[str, str, str]] = []
    for key in reward_keys(cfg):
        reward = _select(cfg, key)
        if reward and reward not in ART_HYDRA_REWARDS:
            found.append(("reward", str(reward), _file_of(str(reward))))
    for key in agent_keys(cfg):
        code = _select(cfg, key)
        if code and code not in ART_HYDRA_ENVIRONMENTS | ART_HYDRA_TOOLS:
            found.append((key_role(key), str(code), _file_of(str(code))))
    generator = _select(cfg, "task.generator")
    generated = str(_select(cfg, "task.source")) in ("generated", "TaskSource.generated")
    if generated and generator and generator not in ART_HYDRA_GENERATORS:
        found.append(("generator", str(generator), _file_of(str(generator))))
    if _select(cfg, "model.trust_remote_code") is True:
        found += _remote_code(str(_select(cfg, "model.name")))
    if hydra is None:
        return found
    callbacks = _view(hydra, "callbacks") or {}
    for name, entry in callbacks.items() if isinstance(callbacks, dict) else []:
        target = entry.get("_target_") if isinstance(entry, dict) else None
        if target:
            found.append((f"hydra callback {name}", str(target), _file_of(str(target))))
    for node in ("job_logging", "hydra_logging"):
        for where, value, _ in logging_code(_view(hydra, node)):
            name = value[6:] if value.startswith("ext://") else value
            found.append((f"logging {node}.{where}", value, _file_of(name)))
    for plugin in ("launcher", "sweeper"):
        for where, target in _nested_targets(_view(hydra, plugin) or {}):
            found.append((f"hydra {plugin} {where}", target, _file_of(target)))
    for line in _view(hydra, "launcher.setup") or []:
        found.append(("launcher setup line", str(line), "(shell, in each job's script)"))
    return found


def _file_of(path: str) -> str:
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        origin = module_origin(".".join(parts[:cut]))
        if origin is not None:
            return origin
    return "(not found: not installed, and not a module the command line named)"


def _remote_code(name: str) -> list[tuple[str, str, str]]:
    folder = Path(os.path.expanduser(name))
    if not folder.is_dir():
        return [
            (
                "remote model code",
                name,
                "(the model's *.py files, downloaded from the Hugging Face hub when it loads)",
            )
        ]
    found = [("remote model code", name, str(p)) for p in sorted(folder.glob("*.py"))]
    try:
        auto_map = json.loads((folder / "config.json").read_text()).get("auto_map") or {}
    except (OSError, ValueError, AttributeError):
        auto_map = {}
    for kind, ref in sorted(auto_map.items()) if isinstance(auto_map, dict) else []:
        found.append((f"remote model code ({kind})", str(ref), str(folder / "config.json")))
    if not found:
        found.append(("remote model code", name, f"(no *.py file in {folder})"))
    return found


def outside_code_report(cfg: Any, hydra: Any = None) -> str:
    """The dry run's account of code outside art_hydra (inside a Hydra job, the job's
    ``hydra`` node is read when none is given): what the config names, and what the
    check itself imported or ran, read from the process (:func:`ran_outside`), so "no
    code outside art_hydra" is said only when none was found."""
    if hydra is None:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get() if HydraConfig.initialized() else None
    found = outside_code(cfg, hydra)
    for entry in ran_outside():
        if entry[2] not in {file for _, _, file in found}:
            found.append(entry)
    if not found:
        return "No code outside art_hydra runs: only art_hydra's own code is imported or executed."
    lines = [f"  {what}: {name}\n      {file}" for what, name, file in found]
    head = "Code outside art_hydra that this run would import or execute (with its file):"
    return head + "\n" + "\n".join(lines)


def ran_outside() -> list[tuple[str, str, str]]:
    """Code outside art_hydra this process has already imported, as ``(what, name,
    file)``: every plugin loaded through an entry point, and every module whose file lies
    outside art_hydra, the standard library and the environment's installed packages (a
    module of the working folder or of a ``PYTHONPATH`` folder)."""
    from art_hydra.config.plugin_registry import LOADED
    from art_hydra.import_path import outside_modules

    found = []
    for group, name, value in LOADED:
        module = value.partition(":")[0].strip()
        found.append((f"plugin {group}:{name}", value, module_origin(module) or "(not found)"))
    for name, file in outside_modules():
        found.append(("module from outside the standard library and site-packages", name, file))
    return found
