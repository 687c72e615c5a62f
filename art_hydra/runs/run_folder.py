"""The run folder's state: whether it holds a run, its lock, its checkpoints, its config.

A run folder belongs to one run. ``run_config.yaml`` records the resolved config the run
was started with: it is the reference a resume is compared with, so continuing a run
means continuing the same run (only the keys whose schema field says
``resume="may_change"`` may differ, and each accepted change is recorded in
``resumes.jsonl``). While a run trains it holds an exclusive lock on ``run.lock``
(``flock``: released by the kernel on any exit, kill -9 included; the file names the
holder's pid and host). Each checkpoint carries a manifest of its files' SHA-256 sums;
only a checkpoint whose manifest verifies (every listed file there with its sum, and no
file it does not list) is resumed from, and checkpoints are ordered by step number, not
by name. Everything here is plain files, no torch, so the CLI can check a folder before
Hydra creates it. ``resume=auto`` reads the folder's state (:func:`auto_verdict`): a
checkpoint short of ``trainer.max_steps`` is continued, a finished run skipped, an empty
folder (or one whose run died before its first checkpoint) started afresh.

A run deletes only what it created: ``run_manifest.json`` lists the entries runs made in
the folder (each run, under the lock and before it writes, lists the records it may make;
it drops those it did not make as it ends), and every path that deletes there (a restart
under ``resume=auto``, a stop before the first checkpoint) removes only listed records
(:func:`remove_records`). Another program's file under the name of a record the run
writes is refused by the pre-flight (:func:`foreign_records`); any other file (a shell
redirect's log, ``slurm-<id>.out``) is named in a notice and left alone. A folder from
before manifests counts its run's records as its own (:func:`made_before_manifests`).

A run writes inside its own folder only: the files it appends to or truncates are
opened without following a symbolic link (``O_NOFOLLOW``) and must be regular files,
and a file written by temp-then-rename is created exclusively (``O_EXCL``), so a link
planted under either name cannot redirect a write to a file outside the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from art_hydra import safe_json, safe_paths
from art_hydra.config import fields
from art_hydra.config.run_files import (
    CHECKPOINT_PREFIX,
    COMPLETIONS,
    EVAL_COMPLETIONS,
    EXPORT,
    EXPORT_LEFTOVERS,
    HYDRA_RECORD,
    IDENTITY,
    LOCK,
    MANIFEST,
    METRICS,
    PENDING_PREFIX,
    PLOTS,
    RANKS,
    RESULT,
    RESUMES,
    RUN_CONFIG,
    RUN_MANIFEST,
    SWEEP_FILES,
    TENSORBOARD,
    TRACKERS,
)
from art_hydra.config.store import job_record_name
from art_hydra.config.yaml_guard import YamlRefused, load_bounded

#: A checkpoint folder's name: ``step-<n>`` (n >= 0, at least 6 digits).
_STEP = re.compile(rf"^{re.escape(CHECKPOINT_PREFIX)}(\d+)$")

#: What art_hydra and Hydra write in a run folder (``*`` as in fnmatch), besides the
#: checkpoint folder (``checkpoint.dir``): a folder holding anything else is not a run
#: folder (``/``, a home directory, a project) and is refused as one. A file added to
#: the run folder by a new feature must be named here (its name in
#: :mod:`art_hydra.config.run_files`).
RUN_ENTRIES = (
    HYDRA_RECORD,
    f"{PENDING_PREFIX}*",
    ".hydra-aside-*",
    "*.log",
    RUN_CONFIG,
    f".{RUN_CONFIG}.*.tmp",
    RESUMES,
    IDENTITY,
    f".{IDENTITY}.*.tmp",
    METRICS,
    COMPLETIONS,
    f".{METRICS}.*.tmp",
    f".{COMPLETIONS}.*.tmp",
    EVAL_COMPLETIONS,
    f".{EVAL_COMPLETIONS}.*.tmp",
    TENSORBOARD,
    TRACKERS,
    *PLOTS,
    *(f".{Path(plot).stem}.*.tmp" for plot in PLOTS),
    LOCK,
    RANKS,
    RESULT,
    f".{RESULT}.*.tmp",
    RUN_MANIFEST,
    f".{RUN_MANIFEST}.*.tmp",
    *SWEEP_FILES,
    EXPORT,
    *EXPORT_LEFTOVERS,
)


class UnsafePath(CompactHydraException, OSError):
    """A path the run writes or reads is a symbolic link, or not the kind of entry the
    run made there (a FIFO, a device, a folder for a file): the run refuses it rather
    than write through it to something outside the run folder."""

    exit_code = 1


def _unsafe(path: Path, what: str) -> UnsafePath:
    return UnsafePath(
        f"{path} is {what}, not a file or folder art_hydra created: the run refuses to "
        "write or read through it (it could point at a file outside the run folder). "
        "Choose a fresh run folder (hydra.run.dir=<a new folder>), or move it out of the "
        "run folder if it is not wanted there."
    )


def entry_kind(path: Path) -> str | None:
    """What ``path`` is without following a link: ``file``, ``folder``, ``link``,
    ``other`` (a FIFO, socket or device), or None when nothing is there."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISREG(mode):
        return "file"
    return "folder" if stat.S_ISDIR(mode) else "other"


def open_record(path: Path, flags: int, mode: int = 0o644) -> int:
    """Open a file of the run's record without following a link; refuse anything that is
    not a regular file (a FIFO would block a writer forever). Returns the descriptor."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        kind = entry_kind(path)
        what = {
            "link": "a symbolic link",
            "other": "a FIFO, socket or device",
            "folder": "a folder",
        }
        if kind in what:
            raise _unsafe(path, what[kind]) from None
        raise exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _unsafe(path, "not a regular file")
    os.set_blocking(fd, True)
    return fd


def append_text(path: Path, text: str) -> None:
    """Append ``text`` to a record file (created if absent), never through a link."""
    fd = open_record(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(text)


def open_append(path: Path) -> Any:
    """A text handle appending to a record file (created if absent), never through a link."""
    return os.fdopen(
        open_record(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8"
    )


def read_record(path: Path) -> str | None:
    """A record file's text (None when absent), never read through a link."""
    if entry_kind(path) is None:
        return None
    with os.fdopen(open_record(path, os.O_RDONLY), "r", encoding="utf-8", errors="replace") as f:
        return f.read()


def exclusive_temp(path: Path) -> int:
    """Create the temp file ``path`` for a temp-then-rename write: a leftover entry of that
    name (a killed writer's, or a planted link) is unlinked, never followed, and the file
    is created exclusively. Returns the descriptor, open for writing."""
    if entry_kind(path) in ("file", "link"):
        path.unlink()
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def write_atomic(path: Path, data: str | bytes, tmp_name: str | None = None) -> None:
    """Replace ``path`` with ``data`` (temp file, then rename: the rename replaces a link
    itself, never what it points at)."""
    tmp = path.with_name(tmp_name or f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    with os.fdopen(exclusive_temp(tmp), "wb") as handle:
        handle.write(raw)
    os.replace(tmp, path)


def unlisted_entries(run_dir: Path, checkpoint_dir: str) -> list[str]:
    """Names in ``run_dir`` that no run writes there (sorted; empty for a run folder)."""
    own = Path(os.path.normpath(checkpoint_dir)).parts[0]
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return []
    return [
        n for n in names if n != own and not any(fnmatch.fnmatchcase(n, p) for p in RUN_ENTRIES)
    ]


def linked_entries(run_dir: Path, checkpoint_dir: str) -> list[str]:
    """Entries of the run's own record that are links or of the wrong kind (a folder where
    a file belongs, a FIFO): the run would write through them."""
    found = []
    folders = {HYDRA_RECORD, TENSORBOARD, TRACKERS, RANKS}
    files = (LOCK, RUN_CONFIG, RESUMES, IDENTITY, METRICS, COMPLETIONS, EVAL_COMPLETIONS, RESULT)
    for name in (*files, *PLOTS, RUN_MANIFEST):
        if entry_kind(run_dir / name) not in (None, "file"):
            found.append(name)
    for name in folders:
        if entry_kind(run_dir / name) not in (None, "folder"):
            found.append(name)
    path = run_dir
    for part in Path(os.path.normpath(checkpoint_dir)).parts:
        path = path / part
        kind = entry_kind(path)
        if kind not in (None, "folder"):
            found.append(str(path.relative_to(run_dir)))
            break
    return sorted(found)


# ---- the run's own entries: the folder's manifest ------------------------------------

#: The records a run writes in its folder, besides its checkpoint folder: an entry under
#: one of these names that the folder's manifest does not list is another program's
#: (its ``metrics.jsonl``, its ``tensorboard/``), which a run never writes into, appends
#: to or deletes: the pre-flight refuses such a folder (:func:`foreign_records`).
RECORDS = (
    RUN_CONFIG,
    RESUMES,
    IDENTITY,
    METRICS,
    COMPLETIONS,
    EVAL_COMPLETIONS,
    TENSORBOARD,
    TRACKERS,
    *PLOTS,
    RESULT,
    LOCK,
)

#: What a project holds (a repository, a package, an environment): a folder holding one
#: is never made a run folder, whatever else it holds.
PROJECT_MARKS = (
    ".git",
    ".hg",
    ".svn",
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "environment.yml",
    "package.json",
    "Cargo.toml",
    "go.mod",
    "Makefile",
    "CMakeLists.txt",
    ".venv",
    "venv",
    "node_modules",
)
#: More entries than this that no run writes: a folder of other things (downloads, a
#: data set), not a run's, even without a mark of a project.
MAX_FOREIGN = 32


def checkpoint_top(checkpoint_dir: str) -> str:
    """The run folder's entry that holds the checkpoints (``checkpoint.dir``'s first part)."""
    return Path(os.path.normpath(checkpoint_dir)).parts[0]


def _own_names(checkpoint_dir: str) -> tuple[str, ...]:
    return (*RECORDS, HYDRA_RECORD, checkpoint_top(checkpoint_dir))


def listed_entries(run_dir: Path) -> set[str] | None:
    """The names the folder's manifest lists (None: there is none, or it cannot be read:
    it is read bounded and never through a link). Only plain names count: a manifest
    cannot name anything outside the folder."""
    path = run_dir / RUN_MANIFEST
    if entry_kind(path) != "file":
        return None
    try:
        data = safe_json.read(path, max_bytes=1 << 20)
    except (OSError, ValueError):
        return None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    return {
        e
        for e in entries
        if isinstance(e, str) and e not in ("", ".", "..") and "/" not in e and os.sep not in e
    }


def _json_record(path: Path) -> Any:
    if entry_kind(path) != "file":
        return None
    try:
        return safe_json.read(path, max_bytes=1 << 20)
    except (OSError, ValueError):
        return None


def made_before_manifests(run_dir: Path, checkpoint_dir: str) -> bool:
    """Whether a folder without a manifest holds a run of art_hydra from before run folders
    had one: checkpoints art_hydra wrote (``step-<n>`` with their manifest), a
    ``run_config.yaml`` that is an art_hydra config, or a ``result.json`` that is a job's
    record. Its records are then its own (another program writes none of these)."""
    if checkpoint_folders(run_dir / checkpoint_dir):
        return True
    record = _json_record(run_dir / RESULT)
    if isinstance(record, dict) and {"schema", "status", "overrides"} <= set(record):
        return True
    if entry_kind(run_dir / RUN_CONFIG) != "file":
        return False
    try:
        config = OmegaConf.to_container(load_bounded(run_dir / RUN_CONFIG), resolve=False)
    except (YamlRefused, ValueError):
        return False
    trainer = config.get("trainer") if isinstance(config, dict) else None
    return isinstance(trainer, dict) and "max_steps" in trainer and "algorithm" in config


def own_entries(run_dir: Path, checkpoint_dir: str) -> set[str]:
    """The entries of ``run_dir`` that runs of art_hydra made: those its manifest lists;
    in a folder from before manifests (:func:`made_before_manifests`), the run's records
    that are there; else none."""
    listed = listed_entries(run_dir)
    if listed is not None:
        return listed
    if made_before_manifests(run_dir, checkpoint_dir):
        return {n for n in _own_names(checkpoint_dir) if entry_kind(run_dir / n) is not None}
    return set()


def foreign_records(run_dir: Path, checkpoint_dir: str) -> list[str]:
    """Entries under the names of the run's records (and its checkpoint folder) that no
    run of art_hydra made: the run would write into, append to, or delete them."""
    own = own_entries(run_dir, checkpoint_dir)
    names = dict.fromkeys((*RECORDS, checkpoint_top(checkpoint_dir)))
    return sorted(n for n in names if n not in own and entry_kind(run_dir / n) is not None)


def project_marks(run_dir: Path) -> list[str]:
    """The marks of a project the folder holds (``.git``, ``pyproject.toml``, ...)."""
    return [m for m in PROJECT_MARKS if entry_kind(run_dir / m) is not None]


def _write_listing(run_dir: Path, names: set[str]) -> None:
    listing = {
        "schema": 1,
        "about": "what runs of art_hydra made in this folder: the only entries they delete",
        "entries": sorted(names),
    }
    write_atomic(run_dir / RUN_MANIFEST, json.dumps(listing, indent=1) + "\n")


def claim(run_dir: Path, names: Any, checkpoint_dir: str = "checkpoints") -> None:
    """Add ``names`` to the folder's manifest (the records of a run from before manifests
    are listed first, as its own)."""
    own = own_entries(run_dir, checkpoint_dir)
    wanted = own | set(names)
    if wanted != listed_entries(run_dir):
        _write_listing(run_dir, wanted)


def begin_records(run_dir: Path, checkpoint_dir: str) -> None:
    """Under the folder's lock, before the run writes anything there: list the records
    this run may create (those absent now: nothing else writes in a locked run folder)
    beside those its runs made before, and its lock. :func:`settle_records` drops what it
    did not create when it ends."""
    absent = {n for n in _own_names(checkpoint_dir) if entry_kind(run_dir / n) is None}
    claim(run_dir, absent | {LOCK}, checkpoint_dir)


def settle_records(run_dir: Path) -> None:
    """Drop from the manifest the entries that are not there (listed when the run began,
    never created, or removed): it then names only what a run made."""
    listed = listed_entries(run_dir)
    if listed is None:
        return
    present = {n for n in listed if entry_kind(run_dir / n) is not None}
    if present != listed:
        _write_listing(run_dir, present)


def remove_records(run_dir: Path, names: Any, checkpoint_dir: str = "checkpoints") -> list[str]:
    """Remove those of ``names`` that are a run's records (:data:`UNSAVED_RECORDS`) its
    runs made (:func:`own_entries`), and nothing else: a file another program put there
    under the same name stays. Links are unlinked, never followed. The names removed;
    they stay listed (a run that restarts makes them again): :func:`settle_records`
    drops those not made again when the run ends."""
    own = own_entries(run_dir, checkpoint_dir)
    removed = []
    for name in names:
        if name in UNSAVED_RECORDS and name in own and entry_kind(run_dir / name) is not None:
            _remove_own(run_dir / name)
            removed.append(name)
    return removed


#: Switches of one invocation, not settings of the run: never recorded as a change.
_SWITCHES = ("resume", "dry_run")


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint folder holds, from its name (None if it is not one)."""
    match = _STEP.match(path.name)
    return int(match.group(1)) if match else None


def checkpoint_folders(root: Path) -> list[Path]:
    """Checkpoint folders with a manifest (written last, so the write completed), oldest
    first, ordered by step number (``step-1000000`` comes after ``step-999999``)."""
    if entry_kind(root) != "folder":
        return []
    found = [
        p
        for p in root.iterdir()
        if checkpoint_step(p) is not None
        and entry_kind(p) == "folder"
        and entry_kind(p / MANIFEST) == "file"
    ]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def _sha256(path: Path) -> str:
    with os.fdopen(open_record(path, os.O_RDONLY), "rb") as handle:
        return safe_paths.sha256_of(handle)


def write_manifest(folder: Path, step: int) -> None:
    """Record every file of a checkpoint being written, with its SHA-256 sum."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    sums = {str(p.relative_to(folder)): _sha256(p) for p in files}
    (folder / MANIFEST).write_text(json.dumps({"step": step, "sha256": sums}, indent=1))


def _entries(folder: Path) -> Iterator[tuple[str, str]]:
    """``(path relative to folder, kind)`` of everything below ``folder`` that is not a
    folder, without following links (a linked folder is one entry, of kind ``link``)."""
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            path = Path(top) / name
            yield str(path.relative_to(folder)), entry_kind(path) or "gone"


def verify(folder: Path) -> str | None:
    """Why a checkpoint cannot be trusted (None: every file it lists is there with its
    sum, and it holds nothing else, so loading it only ever sees what it wrote)."""
    try:
        manifest = safe_json.read(folder / MANIFEST)  # bounded: anyone may have written it
        sums = manifest["sha256"]
        if not isinstance(sums, dict):
            raise TypeError("its 'sha256' is not a JSON object")
        listed = {str(name) for name in sums}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{folder / MANIFEST} cannot be read: {exc}"
    for name in listed:  # names no file can have would raise OSError below
        refused = safe_paths.path_refusal(folder / name)
        if refused is not None:
            return f"{folder / MANIFEST} names a file whose path {refused}"
    for name, kind in sorted(_entries(folder)):
        if name == MANIFEST:
            continue
        if name not in listed:
            return (
                f"{folder / name} is not listed in its manifest (added after the checkpoint "
                "was written); it would be loaded with the checkpoint"
            )
        if kind != "file":
            return f"{folder / name} is a {kind}, not the file the checkpoint wrote"
    for name, expected in sums.items():
        path = folder / name
        if os.path.isabs(name) or ".." in Path(name).parts or entry_kind(path) != "file":
            return f"{path} is missing"
        if _sha256(path) != expected:
            return f"{path} does not match its checksum (corrupted or truncated)"
    return None


def latest_intact(root: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint whose manifest verifies, and why each newer one was skipped."""
    skipped: list[str] = []
    for folder in reversed(checkpoint_folders(root)):
        reason = verify(folder)
        if reason is None:
            return folder, skipped
        skipped.append(reason)
    return None, skipped


class FolderInUse(RuntimeError):
    """Another live process holds the run folder's lock."""


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def lock_holder(run_dir: Path) -> dict[str, Any] | None:
    """Who holds the run folder's lock (pid, host, started), or None when it is free.

    ``flock`` is released by the kernel when its holder dies, so a lock left by a dead
    process is free; a holder recorded on this host whose pid no longer exists (a
    filesystem that emulates locks badly) counts as dead too."""
    path = run_dir / LOCK
    if entry_kind(path) != "file":
        return None  # absent, or a link the run folder check refuses: never followed
    try:
        fd = open_record(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = safe_json.loads(os.pread(fd, 4096, 0).decode(errors="replace") or "{}")
        except ValueError:
            holder = {}
        if not isinstance(holder, dict):
            holder = {}
        pid = holder.get("pid")
        pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else 0
        if holder.get("host") == socket.gethostname() and not pid_alive(pid):
            return None
        return holder
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class RunLock:
    """The run folder's exclusive lock, held while a run trains."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (FolderInUse if a live process holds it); ``run.lock`` is opened
        without following a link, so a planted link cannot truncate another file."""
        fd = open_record(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderInUse(describe_holder(lock_holder(self.path.parent))) from None
        os.ftruncate(fd, 0)
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
        os.write(fd, json.dumps(owner).encode())
        self._fd = fd

    def release(self) -> None:
        """Release the lock (the file stays: unlinking it could split a later lock)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def describe_holder(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    return (
        f"process {holder.get('pid', '?')} on host {holder.get('host', '?')} "
        f"(since {holder.get('started', '?')})"
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def holds_run(run_dir: Path, checkpoint_dir: str) -> bool:
    """Whether ``run_dir`` already holds a run's record (Hydra's ``.hydra`` alone does not
    count: Hydra writes it before every job)."""
    return (
        (run_dir / RUN_CONFIG).is_file()
        or (run_dir / METRICS).is_file()
        or bool(checkpoint_folders(run_dir / checkpoint_dir))
    )


def run_config_text(cfg: DictConfig) -> str:
    """The resolved config as YAML, each value read from the environment kept as its
    ``${oc.env:...}`` expression: the file never holds a token, a resume compares the
    expression (a rotated token still resumes), and reading it back reads the variable."""
    from art_hydra.config.secrets import recorded_container

    return OmegaConf.to_yaml(OmegaConf.create(recorded_container(cfg)))


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's saved config (None: none there), read bounded (:class:`YamlRefused`
    for a file that is too large, too deep, or not YAML: anyone may have written it)."""
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return None
    loaded = OmegaConf.to_container(load_bounded(path), resolve=False)
    return loaded if isinstance(loaded, dict) else None


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): node}


def plain(cfg: DictConfig) -> dict[str, Any]:
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(container, dict)
    return container


def differences(saved: dict[str, Any], cfg: DictConfig) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, new value)`` for every key that differs. A key the saved
    config predates is compared as if it held the schema's ``legacy`` value for it, the
    value that does what the code did before the key existed, so an older run resumes
    under the behaviour it was trained with (or is refused, naming the key and value)."""
    old, new = _flat(saved), _flat(plain(cfg))
    old = {**{k: v for k, v in fields.legacy_values().items() if k in new}, **old}
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]


def may_change(key: str) -> bool:
    """Whether a resume may change ``key`` (the field's ``resume`` rule in the schema)."""
    return fields.may_change(key)


def write_run_config(run_dir: Path, cfg: DictConfig) -> None:
    """Record the run's config atomically (temp file, then rename)."""
    write_atomic(run_dir / RUN_CONFIG, run_config_text(cfg))


def record_resume(run_dir: Path, step: int, changed: list[tuple[str, Any, Any]]) -> None:
    """Append what an accepted resume changed, then make its config the reference."""
    entry = {
        "time": _now(),
        "from_step": step,
        "changed": {key: [old, new] for key, old, new in changed if key not in _SWITCHES},
    }
    append_text(run_dir / RESUMES, json.dumps(entry) + "\n")


# ---- Hydra's record of a job -------------------------------------------------------


def _pending_record() -> Path | None:
    """The folder Hydra wrote this job's record into, if it is a pending one of ours."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    subdir = hydra_cfg.output_subdir
    if subdir is None or str(subdir) != job_record_name():
        return None
    return Path(hydra_cfg.runtime.output_dir) / str(subdir)


def _remove_own(path: Path) -> None:
    """Remove an entry this process made (a link is unlinked, never followed)."""
    kind = entry_kind(path)
    if kind == "folder":
        shutil.rmtree(path, ignore_errors=True)
    elif kind is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def adopt_hydra_record() -> None:
    """Make this job's pending record the folder's ``.hydra`` (called once the job holds
    the lock): the old record is renamed aside, the pending one renamed into place."""
    pending = _pending_record()
    if pending is None or entry_kind(pending) != "folder":
        return
    target = pending.with_name(HYDRA_RECORD)
    aside = pending.with_name(f".hydra-aside-{os.getpid()}")
    _remove_own(aside)
    if entry_kind(target) is not None:
        os.replace(target, aside)
    os.replace(pending, target)
    _remove_own(aside)


def discard_hydra_record() -> None:
    """Remove this job's pending record (a job that never held the folder's lock, or a
    rank other than 0, whose record rank 0 keeps)."""
    pending = _pending_record()
    if pending is not None:
        _remove_own(pending)


def detach_logs(run_dir: Path) -> None:
    """Close this process's log files inside ``run_dir`` (a job refused for a busy folder:
    nothing it or its launcher logs afterwards lands in the other run's log)."""
    import logging

    root = logging.getLogger()
    inside = os.path.realpath(run_dir) + os.sep
    for handler in list(root.handlers):
        name = getattr(handler, "baseFilename", None)
        if (
            isinstance(handler, logging.FileHandler)
            and name
            and os.path.realpath(name).startswith(inside)
        ):
            root.removeHandler(handler)
            handler.close()


# ---- resume=auto --------------------------------------------------------------------

#: What ``resume=auto`` does with a run folder.
FRESH = "fresh"  # nothing there: start a run
RESUME = "resume"  # a checkpoint short of max_steps: continue from it
RESTART = "restart"  # a run that ended before its first checkpoint: start it afresh
FINISHED = "finished"  # the run reached max_steps: nothing to train
BROKEN = "broken"  # checkpoints, none intact: neither resumable nor safe to replace


def resume_mode(cfg: Any) -> str:
    """``cfg.resume`` as ``"false"``, ``"true"`` or ``"auto"`` (a config not yet
    structured may still hold a boolean). The key is a string with those choices, not
    an Enum: Hydra reads ``resume=true`` as a boolean, which an Enum node refuses, and
    the schema maps the booleans (``True``/``False``) onto ``true``/``false``."""
    value = cfg.get("resume", False)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).lower()


def result_status(run_dir: Path) -> tuple[str | None, int | None]:
    """``(status, steps)`` of the run's result record (None for what it does not say,
    or when there is none): read bounded and never through a link."""
    if entry_kind(run_dir / RESULT) != "file":
        return None, None
    try:
        record = safe_json.read(run_dir / RESULT)
    except (OSError, ValueError):
        return None, None
    if not isinstance(record, dict):
        return None, None
    status, steps = record.get("status"), record.get("steps")
    return (
        status if isinstance(status, str) else None,
        steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
    )


def auto_verdict(run_dir: Path, checkpoint_dir: str, max_steps: int) -> tuple[str, int | None]:
    """What ``resume=auto`` does in ``run_dir``, and the step its newest intact
    checkpoint holds (None without one).

    An intact checkpoint decides: at ``max_steps`` or beyond the run is finished, short
    of it the run continues (so raising ``trainer.max_steps`` extends a finished run, as
    with ``resume=true``). Without one, a result record that says done with at least
    ``max_steps`` steps (or no step count) means finished; the records of a run that
    ended before its first checkpoint mean start afresh; checkpoint folders that all
    fail to verify are broken (nothing is deleted: the pre-flight names them)."""
    if entry_kind(run_dir) != "folder":
        return FRESH, None
    root = run_dir / checkpoint_dir
    intact, _ = latest_intact(root)
    if intact is not None:
        step = checkpoint_step(intact) or 0
        return (FINISHED if step >= max_steps else RESUME), step
    status, steps = result_status(run_dir)
    if status == "done" and (steps is None or steps >= max_steps):
        return FINISHED, steps
    if checkpoint_folders(root):
        return BROKEN, None
    return (RESTART if holds_run(run_dir, checkpoint_dir) else FRESH), None


#: A run's own records that a restart under resume=auto replaces (a run that ended
#: before its first checkpoint: nothing in them can be resumed). Its result record is
#: not among them: the new run rewrites it (and has, by the time this runs).
UNSAVED_RECORDS = (
    RUN_CONFIG,
    IDENTITY,
    METRICS,
    COMPLETIONS,
    EVAL_COMPLETIONS,
    TENSORBOARD,
    TRACKERS,
    RESUMES,
)


def clear_unsaved_run(run_dir: Path, checkpoint_dir: str = "checkpoints") -> list[str]:
    """Remove the records of a run that ended before its first checkpoint (called under
    the folder's lock, so no live run owns them): only those its manifest lists
    (:func:`remove_records`); the names removed."""
    return remove_records(run_dir, UNSAVED_RECORDS, checkpoint_dir)


def start_resumed(cfg: Any, run_dir: Path, clear: bool = True) -> bool:
    """Whether this run continues from a checkpoint: ``resume=true``, or ``resume=auto``
    in a folder whose run has one. ``auto`` in a folder holding a run that ended before
    its first checkpoint clears its records first (with ``clear``: rank 0, which owns
    the folder; the other ranks decide alike, from the checkpoints, which stay)."""
    mode = resume_mode(cfg)
    if mode != "auto":
        return mode == "true"
    verdict, _ = auto_verdict(run_dir, cfg.checkpoint.dir, cfg.trainer.max_steps)
    if verdict == RESTART and clear:
        clear_unsaved_run(run_dir, cfg.checkpoint.dir)
    return verdict in (RESUME, FINISHED)


# ---- sweeps -------------------------------------------------------------------------


def in_sweep() -> bool:
    """Whether this process runs a sweep or one of its jobs (Hydra's MULTIRUN mode):
    its folders are then chosen by ``hydra.sweep.dir``, and ``hydra.run.dir`` is
    ignored."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def folder_key() -> str:
    """The override that chooses this job's folder: ``hydra.sweep.dir`` in a sweep."""
    return "hydra.sweep.dir" if in_sweep() else "hydra.run.dir"
