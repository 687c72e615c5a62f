"""The run folder's state: whether it holds a run, its lock, its checkpoints, its config.

A run folder belongs to one run. ``run_config.yaml`` records the resolved config the run
was started with: it is the reference a resume is compared with, so continuing a run
means continuing the same run (only the keys in :data:`MAY_CHANGE_ON_RESUME` may
differ, and each accepted change is recorded in ``resumes.jsonl``). While a run trains
it holds an exclusive lock on ``run.lock`` (``flock``: released by the kernel on any
exit, kill -9 included; the file names the holder's pid and host). Each checkpoint
carries a manifest of its files' SHA-256 sums; only a checkpoint whose manifest verifies
is resumed from, and checkpoints are ordered by step number, not by name. Everything
here is plain files, no torch, so the CLI can check a folder before Hydra creates it.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra import safe_json, safe_paths

#: The resolved config the run started with (updated by each accepted resume).
RUN_CONFIG = "run_config.yaml"
#: One line per accepted resume: when, from which step, what changed.
RESUMES = "resumes.jsonl"
METRICS = "metrics.jsonl"
LOCK = "run.lock"
#: A checkpoint's list of its files and their SHA-256 sums, written last.
MANIFEST = "manifest.json"
#: A checkpoint folder is ``step-<n>`` (n >= 0, at least 6 digits).
CHECKPOINT_PREFIX = "step-"
STATE_FILE = Path("trainer_state") / "state.json"
_STEP = re.compile(r"^step-(\d+)$")

#: Keys a resume may change: how long the run goes on, how it reports and saves, how long
#: its waits last, how many CPU threads compute (float rounding only, as on another
#: machine). Everything else is what the checkpoint's weights, optimizer state, data
#: order and metrics depend on.
MAY_CHANGE_ON_RESUME = (
    "trainer.max_steps",
    "checkpoint.every_steps",
    "checkpoint.keep_last",
    "logging.*",
    "queue.*",
    "timeouts.*",
    "producer.log_completions",
    "backend.cpu_threads",
    "resume",
    "dry_run",
    "strict",
)


#: Keys added after run folders were first written (10222b5), each with the value that
#: does what the code did before the key existed: a saved config without one is compared
#: as if it held that value, so an older run resumes under the behaviour it was trained
#: with (or is refused, naming the key and that value).
ADDED_LATER: dict[str, Any] = {
    "rl.num_iterations": 1,
    "rl.steps_per_generation": 1,
    "rl.overlap_rollouts": False,
    "producer.share_prompts": False,
    "backend.cpu_threads": None,
    "distributed.world_size": 1,
    "distributed.backend": "auto",
    "distributed.timeout_s": 300.0,
}

#: Switches of one invocation, not settings of the run: never recorded as a change.
_SWITCHES = ("resume", "dry_run")


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint folder holds, from its name (None if it is not one)."""
    match = _STEP.match(path.name)
    return int(match.group(1)) if match else None


def checkpoint_folders(root: Path) -> list[Path]:
    """Checkpoint folders with a manifest (written last, so the write completed), oldest
    first, ordered by step number (``step-1000000`` comes after ``step-999999``)."""
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir() if checkpoint_step(p) is not None and (p / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path, step: int) -> None:
    """Record every file of a checkpoint being written, with its SHA-256 sum."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    sums = {str(p.relative_to(folder)): _sha256(p) for p in files}
    (folder / MANIFEST).write_text(json.dumps({"step": step, "sha256": sums}, indent=1))


def verify(folder: Path) -> str | None:
    """Why a checkpoint cannot be trusted (None: every file is there with its sum)."""
    try:
        manifest = safe_json.read(folder / MANIFEST)  # bounded: anyone may have written it
        sums = manifest["sha256"]
        if not isinstance(sums, dict):
            raise TypeError("its 'sha256' is not a JSON object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{folder / MANIFEST} cannot be read: {exc}"
    for name, expected in sums.items():
        path = folder / name
        if safe_paths.path_refusal(path) is not None:  # would raise OSError below
            return f"{folder / MANIFEST} names a file whose path {safe_paths.path_refusal(path)}"
        if not path.is_file():
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
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(path.read_text() or "{}")
        except ValueError:
            holder = {}
        if holder.get("host") == socket.gethostname() and not pid_alive(int(holder.get("pid", 0))):
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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
    return OmegaConf.to_yaml(cfg, resolve=True)


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return None
    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
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
    """``(key, saved value, new value)`` for every key that differs (see
    :data:`ADDED_LATER` for keys the saved config predates)."""
    old, new = _flat(saved), _flat(plain(cfg))
    old = {**{k: v for k, v in ADDED_LATER.items() if k in new}, **old}
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]


def may_change(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in MAY_CHANGE_ON_RESUME)


def write_run_config(run_dir: Path, cfg: DictConfig) -> None:
    """Record the run's config atomically (temp file, then rename)."""
    target = run_dir / RUN_CONFIG
    tmp = run_dir / f".{RUN_CONFIG}.{os.getpid()}.tmp"
    tmp.write_text(run_config_text(cfg))
    os.replace(tmp, target)


def record_resume(run_dir: Path, step: int, changed: list[tuple[str, Any, Any]]) -> None:
    """Append what an accepted resume changed, then make its config the reference."""
    entry = {
        "time": _now(),
        "from_step": step,
        "changed": {key: [old, new] for key, old, new in changed if key not in _SWITCHES},
    }
    with open(run_dir / RESUMES, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")
