"""Where each tracker reports and under which names, so that a sweep's jobs meet in one
place: the sweep read from Hydra (``HydraConfig``: mode MULTIRUN, ``hydra.sweep.dir``,
``job.num``, the job's overrides against the sweep's own in ``multirun.yaml``), the
job's run name made of its swept overrides, and each tracker's destination.

A destination is chosen in this order: the library's own variable (``WANDB_DIR``,
``MLFLOW_TRACKING_URI``, ``TRACKIO_DIR``), as TRL leaves it to; then
``logging.trackers_dir`` (TRL's layout: ``<dir>/wandb``, ``<dir>/mlruns``,
``<dir>/trackio``; ``~`` expanded, a relative one taken from the folder ``art-hydra``
was launched in, ``hydra.runtime.cwd``, as TRL's ``./wandb`` is, whatever
``hydra.job.chdir`` says); then art_hydra's own folders: the run folder's ``trackers/``, or for
a sweep's jobs the sweep folder's ``trackers/`` (one MLflow store, one Trackio database
shared by the sweep's jobs; W&B keeps a folder per job and groups them by name). A
variable this process set itself for an earlier job is never taken for the user's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from art_hydra.config import run_files
from art_hydra.config.secrets import SHOWN, is_secret_key, redacted_overrides, scrub

#: Each tracker's own variable for where it writes (the user's choice wins over ours).
LIBRARY_VARIABLES = {
    "wandb": "WANDB_DIR",
    "mlflow": "MLFLOW_TRACKING_URI",
    "trackio": "TRACKIO_DIR",
}
#: Where each tracker's files go inside ``logging.trackers_dir`` (wandb adds its own
#: ``wandb/`` below WANDB_DIR): TRL's ``./wandb`` and ``./mlruns`` for ``.``.
TRL_LAYOUT = {"wandb": "", "mlflow": "mlruns", "trackio": "trackio"}
#: Trackers whose store a sweep's jobs share (W&B's runs are grouped by name instead).
SHARED_IN_SWEEP = ("mlflow", "trackio")
#: Overrides that say how a job starts, never what it is: not part of its name.
_NOT_A_POINT = ("resume", "dry_run")
#: A run name's length at most (W&B shows 128 characters; the rest only clutter).
_NAME_CHARS = 100
#: A value's length at most inside a run name.
_VALUE_CHARS = 32

#: Query parameters of a tracking URI whose value is a credential, beyond the names
#: :func:`is_secret_key` knows: signed URLs' signatures (``sig``, ``X-Amz-Signature``),
#: Azure's SAS, access keys and credentials (matched as words of the name).
_SECRET_QUERY = re.compile(
    r"(^|[^a-z])(sig|signature|token|key|password|passwd|pwd|secret|credentials?|sas|auth)"
    r"([^a-z]|$)",
    re.IGNORECASE,
)

#: Variables this process set (for an earlier run in the same process): not the user's.
_OURS: dict[str, str] = {}


def set_ours(variable: str, value: str) -> None:
    """Set ``variable`` for a library and remember that art_hydra chose it."""
    os.environ[variable] = value
    _OURS[variable] = value


def users(variable: str) -> str | None:
    """The user's value of ``variable`` (set, not empty, not one this process set)."""
    value = os.environ.get(variable, "")
    return value if value and _OURS.get(variable) != value else None


@dataclass(frozen=True)
class SweepJob:
    """A job of a sweep: the sweep's folder and name, the job's number and its swept
    overrides (key -> typed value, as Hydra parses them)."""

    folder: Path
    job: int | None
    swept: dict[str, Any] = field(default_factory=dict)
    #: The swept overrides as the job got them (``key=value`` text, secrets hidden).
    texts: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The sweep's name in the trackers: its folder's last two parts (the date and
        the time-and-id Hydra's default sweep folder is named by)."""
        return "/".join(self.folder.parts[-2:])

    @property
    def run_name(self) -> str:
        """The job's name: its swept overrides, keys shortened to their last part where
        that stays unambiguous (``learning_rate=0.0001,seed=1``)."""
        if not self.texts:
            return f"job {self.job}" if self.job is not None else self.folder.name
        keys = [t.partition("=")[0].lstrip("+~") for t in self.texts]
        lasts = [k.rsplit(".", 1)[-1] for k in keys]
        parts = []
        for text, key, last in zip(self.texts, keys, lasts, strict=True):
            value = text.partition("=")[2]
            if len(value) > _VALUE_CHARS:
                value = value[: _VALUE_CHARS - 1] + "…"
            parts.append(f"{last if lasts.count(last) == 1 else key}={value}")
        name = ",".join(parts)
        return name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 1] + "…"

    @property
    def sweep_id(self) -> str:
        """Six hex digits of the sweep folder's absolute path: two sweeps whose folders
        end alike (an explicit ``hydra.sweep.dir=sweeps/lr`` in two projects) differ."""
        return hashlib.sha1(str(self.folder).encode()).hexdigest()[:6]

    @property
    def unique_name(self) -> str:
        """The run name with the job's number and the sweep's id: Trackio finds a run to
        resume by its name (the latest of that name), two points of an optimising sweep
        may be the same, and two sweeps may share one database (``logging.trackers_dir``,
        ``TRACKIO_DIR``), so the name must be unique across sweeps, not only in one."""
        job = "" if self.job is None else f" #{self.job}"
        return f"{self.run_name}{job} @{self.sweep_id}"

    def tags(self) -> dict[str, str]:
        """The sweep and job a tracker run is tagged with."""
        tags = {"sweep": self.name, "sweep_dir": str(self.folder)}
        if self.job is not None:
            tags["job"] = str(self.job)
        return tags

    def record(self) -> dict[str, Any]:
        """What a tracker's nested config holds of the sweep (W&B's ``sweep.*``): its
        name, folder, the job's number and the swept keys' values by override key (a
        group choice, ``task=digit_sum``, is in no config key of its own)."""
        return {"name": self.name, "dir": str(self.folder), "job": self.job, "swept": self.swept}


def _parsed(overrides: list[str]) -> list[tuple[str, bool, Any, str]]:
    """Each override as (key, is it a sweep, typed value, value text), Hydra's parser's
    reading; one it cannot parse is kept as text."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out = []
    for text in overrides:
        try:
            (o,) = parser.parse_overrides([text])
        except Exception:
            key, _, value = text.partition("=")
            out.append((key.lstrip("+~"), False, value, value))
            continue
        if o.is_sweep_override():
            out.append((o.key_or_group, True, None, ""))
        else:
            out.append((o.key_or_group, False, o.value(), o.get_value_element_as_str()))
    return out


def _fixed_in_sweep(folder: Path) -> dict[str, str] | None:
    """The sweep's fixed overrides (key -> value text) from its ``multirun.yaml``: its
    command line's and ``hydra.sweeper.params``' (a value there that sweeps nothing,
    ``seed: 1``, is fixed for every job like one on the command line, which wins where
    both give a key); None where that file cannot be read (then every override of the
    job names it)."""
    from omegaconf import OmegaConf

    from art_hydra.config.yaml_guard import load_bounded

    try:
        master = load_bounded(folder / run_files.SWEEP_FILES[0])
        given = OmegaConf.to_container(master.hydra.overrides.task, resolve=False)
        node = OmegaConf.select(master, "hydra.sweeper.params", default=None)
        params = OmegaConf.to_container(node, resolve=False) if node else {}
    except Exception:
        return None
    if not isinstance(given, list):
        return None
    texts = [f"{k}={v}" for k, v in params.items()] if isinstance(params, dict) else []
    fixed: dict[str, str] = {}
    for key, sweep, _, text in _parsed([*texts, *(str(o) for o in given)]):
        if sweep:
            fixed.pop(key, None)
        else:
            fixed[key] = text
    return fixed


def _typed(value: Any) -> Any:
    """A value trackers take as a param: a scalar as it is, anything else as JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, default=str)


def sweep_job() -> SweepJob | None:
    """This job's sweep under Hydra's MULTIRUN mode, else None (a single run). Its swept
    overrides: those of the job's own that the sweep did not fix to the same value."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra = HydraConfig.get()
    # hydra.sweep.dir is relative to the launch folder, not to a job's cwd after chdir.
    folder = absolute(str(hydra.sweep.dir))
    num = OmegaConf.select(hydra, "job.num", default=None)
    fixed = _fixed_in_sweep(folder)
    own = redacted_overrides([str(o) for o in hydra.overrides.task])
    swept: dict[str, Any] = {}
    texts: list[str] = []
    for key, _, value, shown in _parsed(own):
        if key in _NOT_A_POINT or (fixed is not None and fixed.get(key) == shown):
            continue
        swept[key] = _typed(value)
        texts.append(f"{key}={shown}")
    return SweepJob(folder, int(num) if isinstance(num, int) else None, swept, tuple(texts))


def launch_dir() -> Path:
    """The folder ``art-hydra`` was launched in: ``hydra.runtime.cwd`` under Hydra (a
    job's cwd is its own folder with ``hydra.job.chdir=true``), else the cwd."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        cwd = HydraConfig.get().runtime.cwd
        if cwd:
            return Path(str(cwd))
    return Path.cwd()


def absolute(path: str) -> Path:
    """``path`` with ``~`` expanded, a relative one taken from :func:`launch_dir`."""
    given = Path(path).expanduser()
    return (given if given.is_absolute() else launch_dir() / given).resolve()


def _secret_query(name: str) -> bool:
    """Whether a tracking URI's query parameter ``name`` holds a credential."""
    return is_secret_key(name) or _SECRET_QUERY.search(name) is not None


def shown_uri(uri: str) -> str:
    """A tracking URI as the log may show it: a password or token in it (user info, a
    secret-looking query parameter, a remembered secret value) as ``***``."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return SHOWN
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{SHOWN}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, SHOWN if _secret_query(k) else v) for k, v in pairs], safe="*")
    return scrub(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))


#: Who chose a tracker's place (:attr:`Place.chosen_by`).
VARIABLE, TRACKERS_DIR, DEFAULT = "variable", "logging.trackers_dir", "art_hydra"


@dataclass(frozen=True)
class Place:
    """Where a tracker reports: its local folder (WANDB_DIR, the MLflow file store's
    parent, TRACKIO_DIR), MLflow's tracking URI, how the log shows it, and who chose it
    (the library's variable, ``logging.trackers_dir`` or art_hydra's default)."""

    folder: Path
    shown: str
    uri: str | None = None
    chosen_by: str = DEFAULT

    @property
    def users(self) -> bool:
        """The user's variable chose it: the tracker leaves that variable as it is."""
        return self.chosen_by == VARIABLE


def _own_folder(name: str, run_dir: Path, sweep: SweepJob | None, resuming: bool) -> Path:
    """art_hydra's folder for tracker ``name``: the run's ``trackers/<name>``, or the
    sweep's for a store the sweep's jobs share; a resumed job whose own folder already
    holds the store (a sweep begun before stores were shared) keeps it."""
    own = run_dir / run_files.TRACKERS / name
    if sweep is None or name not in SHARED_IN_SWEEP:
        return own
    if resuming and own.is_dir() and any(own.iterdir()):
        return own
    return sweep.folder / run_files.TRACKERS / name


def place(
    name: str, run_dir: Path, trackers_dir: str | None, sweep: SweepJob | None, resuming: bool
) -> Place:
    """Where tracker ``name`` (not TensorBoard) reports, by the order this module's
    docstring gives."""
    given = users(LIBRARY_VARIABLES[name])
    if name == "mlflow":
        if given:
            return Place(run_dir, shown_uri(given), uri=given, chosen_by=VARIABLE)
        folder = (
            absolute(trackers_dir) if trackers_dir else _own_folder(name, run_dir, sweep, resuming)
        )
        store = folder / "mlruns"
        by = TRACKERS_DIR if trackers_dir else DEFAULT
        return Place(folder, _shown_path(store, run_dir), store.resolve().as_uri(), by)
    if given:
        folder, by = Path(given).resolve(), VARIABLE
    elif trackers_dir:
        folder, by = absolute(trackers_dir) / TRL_LAYOUT[name], TRACKERS_DIR
    else:
        folder, by = _own_folder(name, run_dir, sweep, resuming), DEFAULT
    shown = folder / "wandb" if name == "wandb" else folder
    return Place(folder, _shown_path(shown, run_dir), chosen_by=by)


def _shown_path(path: Path, run_dir: Path) -> str:
    """``path`` relative to the run folder where it is inside it, else absolute."""
    path, run_dir = path.resolve(), run_dir.resolve()
    return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)
