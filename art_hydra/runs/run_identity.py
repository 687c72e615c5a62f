"""What a run was started on, beyond its config: recorded once, compared on every resume.

``run_config.yaml`` holds the config, but the same config can name a data file that was
rewritten, a reward whose source was edited, or a local model folder whose weights were
replaced: a resume would then continue another run under the old one's name (or end in
a raw size-mismatch traceback). ``run_identity.json`` records, when the run starts:

- the data (``task.source=jsonl`` or ``dataset``): a file's absolute path, size and
  SHA-256; a folder's or cached snapshot's files of the split, summed together;
- every reward (``task.rewards``, or the one ``task.reward``) and the generator: the
  file that defines each, the SHA-256 of that file and of the function's own source;
- the base model: source, name and revision; for a local folder the SHA-256 of its
  ``config.json`` and the names and sizes of its weight files; for a Hub name the
  snapshot commit the local cache resolves the revision to (when it is cached). The tiny
  model is its config, which ``run_config.yaml`` already holds.

The world pre-flight compares the recorded values with today's before a resume and
refuses each change as a problem that names it (old and new size, hash, path) and the
fix. Plain files and hashes only, no torch: the pre-flight runs before Hydra starts. A
run folder written before this record existed resumes with a warning, and is recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from art_hydra import safe_json, safe_paths
from art_hydra.config.problems import Kind, Problem, Severity, fix
from art_hydra.config.run_files import IDENTITY
from art_hydra.config.schema import ModelSource, TaskSource
from art_hydra.config.secrets import scrub_data
from art_hydra.runs import run_folder
from art_hydra.tasks.reward_set import reward_specs, uses_list

_VERSION = 1
#: SHA-256 sums already computed in this process, by (path, size, mtime): the CLI's
#: pre-flight, the job's and the run's record would otherwise each read the data file.
_sums: dict[tuple[str, int, int], str] = {}


def sha256_file(path: Path) -> str:
    """The file's SHA-256, streamed (a data file is never held whole)."""
    info = path.stat()
    key = (str(path), info.st_size, info.st_mtime_ns)
    if key not in _sums:
        with safe_paths.open_regular(path) as handle:  # never a FIFO swapped in meanwhile
            _sums[key] = safe_paths.sha256_of(handle)
    return _sums[key]


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---- what the run is made of ---------------------------------------------------------


def _data(cfg: DictConfig) -> dict[str, Any] | None:
    if cfg.task.source == TaskSource.generated or not cfg.task.path:
        return None
    path = Path(os.path.expanduser(str(cfg.task.path))).resolve()
    if path.is_file():
        return {"path": str(path), "size": path.stat().st_size, "sha256": sha256_file(path)}
    if cfg.task.source != TaskSource.dataset:
        return None  # the task's own check reports a missing file
    files = _dataset_files(cfg)
    if not files:
        return None  # nothing to read: the task's own check says why
    # A folder, a save_to_disk folder or a cached hub snapshot: one sum over each file's
    # name (relative to the folder), size and SHA-256, so a rewritten shard is seen.
    base = Path(os.path.commonpath([str(f.parent) for f in files]))
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative_to(base)}\0{file.stat().st_size}\0".encode())
        digest.update(sha256_file(file).encode() + b"\n")
    size = sum(f.stat().st_size for f in files)
    return {"path": str(base), "size": size, "sha256": digest.hexdigest()}


def _eval_data(cfg: DictConfig) -> dict[str, Any] | None:
    """The evaluation's own data (``eval.path``/``eval.split``), read as the task reads
    its data; None where evaluation holds out the task's prompts or is off."""
    from art_hydra.config.eval_rules import own_data
    from art_hydra.tasks.held_out import own_eval_config

    if "eval" not in cfg or not own_data(cfg):
        return None
    return _data(own_eval_config(cfg))


def _dataset_files(cfg: DictConfig) -> list[Path]:
    """The files ``task=dataset`` reads for its split (every file of a save_to_disk
    folder), resolved and sorted; empty when the source cannot be read."""
    from art_hydra.tasks import dataset

    try:
        source = dataset.resolve_source(str(cfg.task.path))
    except (dataset.SourceError, OSError):
        return []
    if source.saved is not None:
        found = [p for p in Path(source.saved).rglob("*") if p.is_file()]
    else:
        found = [Path(f) for f in (source.files or {}).get(str(cfg.task.split), ())]
    return sorted({p.resolve() for p in found if p.is_file()})


def _code(cfg: DictConfig, key: str) -> dict[str, Any] | None:
    """The reward's or generator's defining file and source, through the allowlist (the
    pre-flight reports a target that does not resolve)."""
    from art_hydra.tasks.base import resolve_task_code, task_path
    from art_hydra.tasks.examples import TaskDataError

    target = cfg.task.generator if key == "task.generator" else task_path(cfg.task, key)
    if key == "task.generator" and cfg.task.source != TaskSource.generated:
        return None
    if not target:
        return None
    try:
        fn = resolve_task_code(cfg.task, key)
    except TaskDataError:
        return None
    found: dict[str, Any] = {"target": str(target), "file": None, "file_sha256": None}
    with contextlib.suppress(TypeError, OSError):
        found["source_sha256"] = _sha256_text(inspect.getsource(fn))
    source_file = None
    with contextlib.suppress(TypeError):
        source_file = inspect.getsourcefile(fn)
    if source_file is None:
        module = sys.modules.get(getattr(fn, "__module__", "") or "")
        source_file = getattr(module, "__file__", None)
    if source_file and os.path.isfile(source_file):
        found["file"] = str(Path(source_file).resolve())
        found["file_sha256"] = sha256_file(Path(found["file"]))
    return found


def _model(cfg: DictConfig) -> dict[str, Any]:
    model = cfg.model
    found: dict[str, Any] = {"source": str(getattr(model.source, "value", model.source))}
    if model.source != ModelSource.pretrained:
        return found  # the tiny model is its config, which run_config.yaml holds
    name = str(model.name)
    revision = getattr(model, "revision", None)
    found.update(name=name, revision=revision)
    folder = Path(os.path.expanduser(name))
    if folder.is_dir():
        config = folder / "config.json"
        found["folder"] = str(folder.resolve())
        found["config_sha256"] = sha256_file(config) if config.is_file() else None
        found["weights"] = {
            p.name: p.stat().st_size for p in sorted(folder.glob("*.safetensors")) if p.is_file()
        }
    else:
        found["commit"] = _cached_commit(name, str(revision or "main"))
    return found


def _cached_commit(name: str, revision: str) -> str | None:
    """The commit the Hugging Face cache resolves ``revision`` of ``name`` to (None when
    it is not cached, or the revision is a commit already)."""
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"),
        "hub",
    )
    ref = Path(cache) / f"models--{name.replace('/', '--')}" / "refs" / revision
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None


def current(cfg: DictConfig) -> dict[str, Any]:
    """The identity of the run ``cfg`` would train, as of now (a secret's value, say a
    model revision read from a token, as ``***``: recorded and compared alike)."""
    return scrub_data(
        {
            "version": _VERSION,
            "data": _data(cfg),
            "eval_data": _eval_data(cfg),
            "reward": _code(cfg, "task.reward._target_") if not uses_list(cfg.task) else None,
            "rewards": {spec.key: _code(cfg, spec.key) for spec in reward_specs(cfg.task)},
            "generator": _code(cfg, "task.generator"),
            "model": _model(cfg),
        }
    )


def record(cfg: DictConfig, run_dir: Path) -> None:
    """Write the run's identity atomically (temp file, then rename): at the start of a
    run and of every accepted resume."""
    run_folder.write_atomic(
        Path(run_dir) / IDENTITY, json.dumps(current(cfg), indent=1, sort_keys=True)
    )


def recorded(run_dir: Path) -> dict[str, Any] | None:
    """The recorded identity (None: the folder predates the record, or it is unreadable)."""
    try:
        loaded = safe_json.read(Path(run_dir) / IDENTITY)  # bounded: anyone may have written it
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


# ---- what changed --------------------------------------------------------------------


def _problem(key: str, value: Any, reason: str, remedy: str, warning: bool = False) -> Problem:
    severity = Severity.warning if warning else Severity.error
    return Problem(key, value, reason, fix(note=remedy), Kind.world, severity)


def _new_run(run_dir: Path) -> str:
    return "or start a new run elsewhere: hydra.run.dir=<a new folder> resume=false"


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "unknown"


def _data_problems(cfg: DictConfig, run_dir: Path, old: Any, new: Any) -> list[Problem]:
    if not old or not new:
        return []
    if old.get("size") == new["size"] and old.get("sha256") == new["sha256"]:
        return []
    moved = f" (recorded at {old.get('path')})" if old.get("path") != new["path"] else ""
    return [
        _problem(
            "task.path",
            cfg.task.path,
            f"the data file {new['path']} is not the one the run started with{moved}: "
            f"{IDENTITY} recorded {old.get('size')} bytes, sha256 {_short(old.get('sha256'))}; "
            f"it now has {new['size']} bytes, sha256 {_short(new['sha256'])}. A resume "
            "continues the same run, and the checkpoint's data position counts the lines "
            "of the recorded file.",
            f"restore the recorded file (or point task.path back at it), {_new_run(run_dir)}",
        )
    ]


def _eval_data_problems(cfg: DictConfig, old: Any, new: Any) -> list[Problem]:
    """A changed evaluation file is a warning: training is unaffected, but the run's
    eval/* curve before and after the resume measures different data."""
    if not old or not new:
        return []
    if old.get("size") == new["size"] and old.get("sha256") == new["sha256"]:
        return []
    return [
        _problem(
            "eval.path",
            cfg.eval.path,
            f"the evaluation data {new['path']} is not what the run evaluated before: "
            f"{IDENTITY} recorded {old.get('size')} bytes, sha256 {_short(old.get('sha256'))}; "
            f"it now has {new['size']} bytes, sha256 {_short(new['sha256'])}. Training "
            "continues as it was, but eval/* after this resume measures other data than "
            "before it.",
            "restore the recorded file to keep the eval curve comparable; nothing, to accept it",
            warning=True,
        )
    ]


def _code_problems(key: str, run_dir: Path, old: Any, new: Any) -> list[Problem]:
    if not old or not new or old.get("target") != new["target"]:
        return []  # a renamed target is a config change, which the config comparison names
    what = "generator" if key == "task.generator" else "reward"
    where = new.get("file") or old.get("file") or "its module"
    remedy = f"restore {where} as it was when the run started, {_new_run(run_dir)}"
    old_src, new_src = old.get("source_sha256"), new.get("source_sha256")
    if old_src and new_src:
        if old_src != new_src:
            return [
                _problem(
                    key,
                    new["target"],
                    f"the {what}'s source changed since the run started (in {where}: "
                    f"sha256 {_short(old_src)} recorded in {IDENTITY}, {_short(new_src)} now); "
                    f"a resumed run would score (or draw) differently from the run it continues.",
                    remedy,
                )
            ]
        if old.get("file_sha256") != new.get("file_sha256"):
            return [
                _problem(
                    key,
                    new["target"],
                    f"the {what} function is unchanged, but its file {where} changed since the "
                    "run started; if a helper it calls changed, the resumed run is not the "
                    "same run.",
                    f"nothing, if the change does not touch the {what}; else {remedy}",
                    warning=True,
                )
            ]
        return []
    if old.get("file_sha256") != new.get("file_sha256"):
        return [
            _problem(
                key,
                new["target"],
                f"the file that defines the {what}, {where}, changed since the run started "
                f"(sha256 {_short(old.get('file_sha256'))} recorded in {IDENTITY}, "
                f"{_short(new.get('file_sha256'))} now).",
                remedy,
            )
        ]
    return []


def _model_problems(run_dir: Path, old: Any, new: Any) -> list[Problem]:
    if not old or old.get("source") != new.get("source") or old.get("name") != new.get("name"):
        return []  # another model is a config change, which the config comparison names
    name = new.get("name")
    if "config_sha256" in old and "config_sha256" in new:
        changed = [
            f"config.json (sha256 {_short(old['config_sha256'])} -> {_short(new['config_sha256'])})"
        ] * (old["config_sha256"] != new["config_sha256"])
        before, after = old.get("weights") or {}, new.get("weights") or {}
        for file in sorted(set(before) | set(after)):
            if before.get(file) != after.get(file):
                changed.append(
                    f"{file} ({before.get(file, 'absent')} -> {after.get(file, 'absent')} bytes)"
                )
        if changed:
            return [
                _problem(
                    "model.name",
                    name,
                    f"the base model folder {new.get('folder')} changed since the run started: "
                    f"{', '.join(changed)}; the checkpoint's adapters or weights were trained "
                    "on the recorded model.",
                    f"restore the model folder as it was, {_new_run(run_dir)}",
                )
            ]
        return []
    if old.get("commit") and new.get("commit") and old["commit"] != new["commit"]:
        return [
            _problem(
                "model.revision",
                new.get("revision"),
                f"the Hugging Face cache now resolves {name}@{new.get('revision')} to commit "
                f"{old['commit'][:12]}... -> {new['commit'][:12]}...: the base model may have "
                "been updated since the run started.",
                f"check the model's history; to train on the recorded model, {_new_run(run_dir)} "
                f"with model.revision={old['commit']}",
                warning=True,
            )
        ]
    return []


def _reward_problems(run_dir: Path, old: dict[str, Any], new: dict[str, Any]) -> list[Problem]:
    """Each reward's source against the one recorded for the same key (a record written
    before ``task.rewards`` existed has the one ``reward``)."""
    before = old.get("rewards")
    if not isinstance(before, dict):
        before = {"task.reward._target_": old.get("reward")}
    return [
        problem
        for key, now in (new.get("rewards") or {}).items()
        for problem in _code_problems(key, run_dir, before.get(key), now)
    ]


def resume_problems(cfg: DictConfig, run_dir: Path) -> list[Problem]:
    """What changed since the run in ``run_dir`` started: one problem per change (the
    data file, the reward's or generator's source, the base model), each naming the
    recorded and the current value and the fix; a warning for a folder without a record."""
    old = recorded(run_dir)
    if old is None:
        return [
            _problem(
                "resume",
                True,
                f"{run_dir / IDENTITY} is missing or unreadable (a run started before it was "
                "recorded), so the data file, the reward and the base model cannot be compared "
                "with the ones the run started with.",
                "nothing: this resume records them, and later resumes are checked",
                warning=True,
            )
        ]
    new = current(cfg)
    return [
        *_data_problems(cfg, run_dir, old.get("data"), new["data"]),
        *_eval_data_problems(cfg, old.get("eval_data"), new["eval_data"]),
        *_reward_problems(run_dir, old, new),
        *_code_problems("task.generator", run_dir, old.get("generator"), new["generator"]),
        *_model_problems(run_dir, old.get("model"), new["model"]),
    ]
