"""Whether a sweep's folder may take this sweep, checked once by the sweeper before it
writes ``multirun.yaml`` or launches a job: two sweeps in one folder would share job
folders and mislabel each other's results, so a folder holding another sweep (or
entries of no sweep) is refused, and the same sweep again continues only under
``resume=auto`` or ``resume=true``. The sweep's process then holds the folder's lock
(``.sweep.lock``) until it exits: a second sweep started into the same folder while the
first runs (same overrides or not, even in the same second) is refused before any job,
instead of each skipping the other's jobs as finished or busy.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.config import fields, run_files
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.preflight.common import world_problem
from art_hydra.preflight.folders import creation_refusal, shown
from art_hydra.runs import run_folder
from art_hydra.safe_paths import path_refusal

log = logging.getLogger(__name__)

#: Overrides that do not make a sweep another sweep: the switches of one invocation,
#: the folders (a sweep continued names its folder by hand), and how the same points
#: are launched (keys starting with these).
_SWEEP_SWITCHES = (
    "resume",
    "dry_run",
    "strict",
    "hydra.sweep.dir",
    "hydra.run.dir",
    "hydra/launcher",
    "hydra.launcher.",
    "hydra.sweeper.max_batch_size",
    "hydra.sweeper.skip_invalid",
)
#: The largest multirun.yaml read (real ones are a few kilobytes).
_MULTIRUN_MAX_BYTES = 4 << 20


def _override_key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def _switch(key: str) -> bool:
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in _SWEEP_SWITCHES)


def sweep_signature(cfg: Any) -> dict[str, Any]:
    """What makes a sweep this sweep: its command-line overrides (task and hydra, in
    order: the order numbers the points) without the switches and folders, and the
    sweeper's own ``params``. ``cfg`` is a sweep's master config, or its saved
    ``multirun.yaml``."""
    overrides = OmegaConf.select(cfg, "hydra.overrides", default=None)
    given = OmegaConf.to_container(overrides, resolve=False) if overrides is not None else {}
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None)
    assert isinstance(given, dict)
    return {
        part: [
            str(o)
            for o in given.get(part) or []
            if not _switch(_override_key(str(o))) and not _may_change(str(o))
        ]
        for part in ("task", "hydra")
    } | {"params": OmegaConf.to_container(params, resolve=False) if params is not None else {}}


def _may_change(override: str) -> bool:
    """A fixed value of a key a resume may change (``trainer.max_steps=60`` raised to 80
    to extend every point): the same sweep, continued; each job's resume checks it."""
    key, _, value = override.partition("=")
    key = key.lstrip("+~")
    if "," in value or "(" in value:  # a swept key numbers the points
        return False
    return fields.may_change(key)


def _sweep_folder(value: str, reason: str, remedy: Any) -> Problem:
    return world_problem("hydra.sweep.dir", value, reason, remedy)


_NEW_SWEEP = fix({"hydra.sweep.dir": placeholder("a new folder")})


def sweep_folder_problems(
    sweep_dir: str | Path, master_cfg: Any, resume_mode: Any = None
) -> list[Problem]:
    """Whether ``sweep_dir`` may take this sweep: called once by the sweeper, before it
    writes ``multirun.yaml`` or launches a job. A folder that is absent or empty is
    fresh. One that holds another sweep (a ``multirun.yaml`` whose overrides differ, the
    switches and folders aside), or entries without any ``multirun.yaml``, is refused:
    the two sweeps' jobs would share folders and mislabel each other's results. The
    same sweep again is accepted with ``resume=auto`` (finished points skipped, stopped
    ones resumed, the rest started) or ``resume=true`` (every point must resume); with
    ``resume=false`` it is refused once its jobs have started, naming ``resume=auto``.
    ``resume_mode`` defaults to the master's ``resume``. A folder another live sweep
    holds is refused whatever it holds. Reads only: the sweeper then holds the folder
    with :func:`claim_sweep_folder`."""
    folder = Path(sweep_dir)
    value = str(sweep_dir)
    names, problems = _sweep_folder_entries(folder, value)
    if not problems and names:
        problems = _busy_problems(folder, value)
    if not problems and names:
        problems = _another_sweep_problems(folder, value, names, master_cfg)
    if not problems and names:
        problems = _sweep_restart_problems(folder, value, names, master_cfg, resume_mode)
    return problems


#: The sweep folders this process holds (path -> lock descriptor), until it exits.
_HELD: dict[str, int] = {}


def claim_sweep_folder(folder: Path, value: str) -> list[Problem]:
    """Hold ``folder``'s sweep lock for the rest of this process (the sweep's parent),
    or why not: another live sweep holds it. The kernel releases ``flock`` when its
    holder dies, so a sweep killed outright never blocks its own ``resume=auto``. The
    folder (and its missing parents) is created here; if the sweep launches nothing,
    they are removed again when the process exits."""
    key = str(folder.resolve())
    if key in _HELD:
        return []
    created = _missing_parents(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = run_folder.open_record(folder / run_files.SWEEP_LOCK, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        return [_sweep_folder(value, f"cannot hold its sweep lock: {exc}.", _NEW_SWEEP)]
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        return [_busy_problem(value, holder)]
    except OSError as exc:  # a filesystem without flock (Lustre without -o flock, ...)
        os.close(fd)
        log.warning(
            "%s: the sweep folder cannot be locked (%s); a second sweep started into it "
            "while this one runs would not be refused",
            value,
            exc,
        )
        return []
    if _unlinked(folder / run_files.SWEEP_LOCK, fd):  # its holder removed it as it ended
        os.close(fd)
        return claim_sweep_folder(folder, value)
    os.ftruncate(fd, 0)
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
    os.write(fd, json.dumps({**owner, "command": _command()}).encode())
    _HELD[key] = fd
    _CREATED[key] = created
    atexit.register(release_sweep_folder, folder)
    return []


#: The folders (and parents) each held sweep folder's claim created.
_CREATED: dict[str, list[Path]] = {}


def release_sweep_folder(folder: Path) -> None:
    """Let the sweep folder go when its sweep ends (or is refused), so a later sweep in
    this same process (a notebook, a test) or another one may use it; at exit for a
    sweep that never got there. A second call does nothing."""
    key = str(folder.resolve())
    fd = _HELD.pop(key, None)
    if fd is not None:
        _release(folder, fd, _CREATED.pop(key, []))


def _busy_problems(folder: Path, value: str) -> list[Problem]:
    """A folder another live sweep holds (checked first, whatever it holds: its
    ``resume=auto`` would be refused as well while that sweep runs)."""
    path = folder / run_files.SWEEP_LOCK
    if str(folder.resolve()) in _HELD or run_folder.entry_kind(path) != "file":
        return []
    try:
        fd = run_folder.open_record(path, os.O_RDONLY)
    except OSError:
        return []
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return [_busy_problem(value, _holder(fd))]
    except OSError:  # no flock on this filesystem: nothing tells a live holder
        return []
    finally:
        os.close(fd)
    return []


def _unlinked(path: Path, fd: int) -> bool:
    """Whether the lock file held is no longer the one at ``path`` (two holders of two
    files would both think they hold the folder)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino
    except OSError:
        return True


def _busy_problem(value: str, holder: dict[str, Any]) -> Problem:
    """The refusal of a second sweep into a folder a live sweep holds."""
    who = run_folder.describe_holder(holder)
    command = holder.get("command")
    running = f" running `{command}`" if isinstance(command, str) and command else ""
    return _sweep_folder(
        value,
        f"is in use by another sweep ({who}{running}): two sweeps in one folder would "
        "share its job folders, each skipping the other's jobs and reporting them as "
        "its own.",
        fix(
            {"hydra.sweep.dir": placeholder("a new folder")},
            "a sweep of its own; or, to continue that same sweep, wait until it has "
            "ended and run its command again with resume=auto",
        ),
    )


def _holder(fd: int) -> dict[str, Any]:
    """What the lock's holder wrote about itself (pid, host, started, command)."""
    from art_hydra import safe_json

    try:
        holder = safe_json.loads(os.pread(fd, 8192, 0).decode(errors="replace") or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _command() -> str:
    """This process's command line, as the refusal of a second sweep quotes it."""
    import shlex

    words = [os.path.basename(sys.argv[0]) if sys.argv else "art-hydra", *sys.argv[1:]]
    text = " ".join(shlex.quote(w) for w in words)
    return text if len(text) <= 2000 else text[:1997] + "..."


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _missing_parents(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, innermost first."""
    missing = []
    for path in [folder, *folder.parents]:
        if os.path.lexists(path):
            break
        missing.append(path)
    return missing


def _release(folder: Path, fd: int, created: list[Path]) -> None:
    """At exit: a sweep that launched nothing (its folder holds only the lock) leaves
    no folder behind; otherwise the lock file stays (unlinking it could split a later
    lock) and the kernel releases the lock."""
    with contextlib.suppress(OSError):
        if os.listdir(folder) == [run_files.SWEEP_LOCK] and folder in created:
            os.unlink(folder / run_files.SWEEP_LOCK)
            for path in created:
                with contextlib.suppress(OSError):
                    path.rmdir()  # only while empty
    with contextlib.suppress(OSError):
        os.close(fd)


def _sweep_folder_entries(folder: Path, value: str) -> tuple[list[str], list[Problem]]:
    """The sweep folder's entries, sorted (none: absent or empty, a fresh sweep), or why
    no sweep can be written there (a path refused, not creatable, not a folder, the root
    or home directory, unreadable)."""
    refusal = path_refusal(folder)
    if refusal is not None:
        return [], [_sweep_folder(value, f"{refusal}.", fix(note="a shorter path"))]
    kind = run_folder.entry_kind(folder)
    if kind is None:
        uncreatable = creation_refusal(folder)
        return [], [] if uncreatable is None else [_sweep_folder(value, uncreatable, _NEW_SWEEP)]
    resolved = folder.resolve()
    if kind != "folder" or resolved in (Path(resolved.anchor), Path.home().resolve()):
        what = "is not a folder" if kind != "folder" else "is the root or home directory"
        reason = f"{what}: a sweep writes its jobs' folders there."
        return [], [_sweep_folder(value, reason, _NEW_SWEEP)]
    try:  # the sweep lock is no entry of a sweep: a refused sweep may leave it
        return sorted(n for n in os.listdir(folder) if n != run_files.SWEEP_LOCK), []
    except OSError as exc:
        return [], [_sweep_folder(value, f"cannot be read: {exc.strerror or exc}.", _NEW_SWEEP)]


def _another_sweep_problems(
    folder: Path, value: str, names: list[str], master_cfg: Any
) -> list[Problem]:
    """A folder with entries that is not this sweep's: no ``multirun.yaml`` (not a
    sweep's folder), one that cannot be read, or one of a sweep with other overrides."""
    saved_name = run_files.SWEEP_FILES[0]  # multirun.yaml
    if saved_name not in names:
        return [
            _sweep_folder(
                value,
                f"holds entries ({shown(names)}) but no {saved_name}: it is not the folder of a "
                "sweep, and the sweep's jobs would mix their files with what is there.",
                _NEW_SWEEP,
            )
        ]
    saved = _saved_sweep(folder / saved_name)
    if isinstance(saved, str):
        return [_sweep_folder(value, saved, _NEW_SWEEP)]
    old, new = sweep_signature(saved), sweep_signature(master_cfg)
    if old != new:
        return [
            _sweep_folder(
                value,
                f"holds another sweep ({saved_name}: {_sweep_difference(old, new)}); the two "
                "sweeps' jobs would share folders and mislabel each other's results.",
                fix(
                    note="hydra.sweep.dir=<a new folder>, or the same overrides as that sweep "
                    "with resume=auto to continue it"
                ),
            )
        ]
    return []


def _sweep_restart_problems(
    folder: Path, value: str, names: list[str], master_cfg: Any, resume_mode: Any
) -> list[Problem]:
    """This same sweep again: refused under ``resume=false`` once any job folder exists
    (it would train over those runs), naming ``resume=auto``."""
    mode = run_folder.resume_mode(
        {"resume": master_cfg.get("resume", False) if resume_mode is None else resume_mode}
    )
    started = [n for n in names if (folder / n).is_dir() and not n.startswith(".")]
    if mode == "false" and started:
        return [
            _sweep_folder(
                value,
                f"holds this sweep already, with {len(started)} job folder(s): starting it "
                "again there would train over its runs.",
                fix(
                    {"resume": "auto"},
                    "continue it: finished points are skipped, stopped ones resumed, the "
                    "rest started",
                    alt=_NEW_SWEEP,
                ),
            )
        ]
    return []


def _saved_sweep(path: Path) -> DictConfig | str:
    """A sweep folder's ``multirun.yaml`` (bounded, never through a link), or why not."""
    from art_hydra.config.yaml_guard import YamlRefused, load_bounded

    if run_folder.entry_kind(path) != "file":
        return f"holds {path.name} that is not a regular file."
    try:  # bounded: size, nesting and YAML aliases (a few hundred bytes can expand forever)
        loaded = load_bounded(path, max_bytes=_MULTIRUN_MAX_BYTES)
    except YamlRefused as exc:
        return f"holds a {path.name} that cannot be read within bounds: {exc}."
    except Exception as exc:  # a torn or foreign file: named, never a traceback
        return f"holds a {path.name} that cannot be read ({type(exc).__name__}: {exc})."
    if not isinstance(loaded, DictConfig):
        return f"holds a {path.name} that is not a sweep's config."
    return loaded


def _sweep_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The first way the saved sweep differs from this one, in words."""
    for part in ("task", "hydra"):
        if old[part] != new[part]:
            return f"its {part} overrides were {old[part]}, now {new[part]}"
    return f"its hydra.sweeper.params were {old['params']}, now {new['params']}"
