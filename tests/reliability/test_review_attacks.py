"""Attacks from the independent review of issue 15, each a payload that would create a
marker file (or write outside the run folder), and the assertion that it does not.

Every route goes through a config folder a user was handed (``--config-dir shared``):
Hydra's launcher settings, interpolations that hide a logging factory, a reward name
that is not a ``def``, environment variables, Hydra's record folder, log files, a YAML
alias bomb, and another Hydra app's output folder.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from conftest import output_of, run_cli


class _Payload:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


def _shared(tmp_path: Path, experiment: str, **files: str) -> Path:
    shared = tmp_path / "shared"
    (shared / "experiment").mkdir(parents=True)
    (shared / "experiment" / "x.yaml").write_text("# @package _global_\n" + experiment)
    for name, text in files.items():
        path = shared / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return shared


def _dry(tmp_path: Path, shared: Path, *extra: str, module: bool = False) -> str:
    proc = run_cli(
        "--config-dir", str(shared), "experiment=x", "dry_run=true", *extra,
        cwd=tmp_path, module=module,
    )  # fmt: skip
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    return out


def test_a_target_nested_in_a_launcher_chosen_by_a_config_file_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "data.npy").write_bytes(pickle.dumps(_Payload(marker)))
    launcher = (
        "_target_: hydra._internal.core_plugins.basic_launcher.BasicLauncher\n"
        f"pwn:\n  _target_: numpy.load\n  file: {tmp_path / 'data.npy'}\n  allow_pickle: true\n"
    )
    shared = _shared(
        tmp_path,
        "defaults:\n  - override /hydra/launcher: evil\nhydra:\n  mode: MULTIRUN\n",
        **{"hydra/launcher/evil.yaml": launcher},
    )
    out = _dry(tmp_path, shared)
    assert "hydra.launcher.pwn._target_" in out
    assert not marker.exists()


@pytest.mark.parametrize(
    "handler",
    [
        # a factory hidden behind an interpolation into a free-form node
        "evil: ${task.params.p}",
        # an ext:// object spelled through a resolver
        "console:\n        stream: ${oc.decode:\"'ext://shared_evil.s'\"}",
    ],
)
def test_logging_code_behind_an_interpolation_is_seen(tmp_path: Path, handler: str) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "data.npy").write_bytes(pickle.dumps(_Payload(marker)))
    (tmp_path / "shared_evil.py").write_text(f"open({str(marker)!r}, 'w')\ns = None\n")
    shared = _shared(
        tmp_path,
        "task:\n  params:\n    p:\n      '()': numpy.load\n"
        f"      file: {tmp_path / 'data.npy'}\n      allow_pickle: true\n"
        f"hydra:\n  job_logging:\n    handlers:\n      {handler}\n",
    )
    out = _dry(tmp_path, shared, module=True)
    assert "hydra.job_logging.handlers" in out
    assert not marker.exists()


@pytest.mark.parametrize("target", ["shared_evil.s", "shared_evil.__main__.x"])
def test_a_config_file_target_that_is_not_a_marked_def_is_never_imported(
    tmp_path: Path, target: str
) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "shared_evil.py").write_text(f"open({str(marker)!r}, 'w')\ns = None\n")
    shared = _shared(tmp_path, f"task:\n  reward:\n    _target_: {target}\n")
    out = _dry(tmp_path, shared, module=True)
    assert "task.reward._target_" in out
    assert not marker.exists()


def test_environment_variables_from_a_config_file_are_an_allowlist(tmp_path: Path) -> None:
    shared = _shared(
        tmp_path,
        "hydra:\n  job:\n    env_set:\n      WORLD_SIZE: '2'\n      MASTER_ADDR: 127.0.0.1\n"
        "      HF_ENDPOINT: http://127.0.0.1:1\n      OMP_NUM_THREADS: '1'\n",
    )
    out = _dry(tmp_path, shared)
    for name in ("WORLD_SIZE", "MASTER_ADDR", "HF_ENDPOINT"):
        assert f"hydra.job.env_set.{name}" in out
    assert "hydra.job.env_set.OMP_NUM_THREADS" not in out


@pytest.mark.parametrize("subdir", ["{victim}", "../../../../../../../..{victim}", ".hydra"])
def test_hydras_record_stays_in_the_run_folder_under_the_lock(tmp_path: Path, subdir: str) -> None:
    victim = tmp_path / "victim"
    shared = _shared(tmp_path, f"hydra:\n  output_subdir: {subdir.format(victim=victim)}\n")
    out = _dry(tmp_path, shared)
    assert "hydra.output_subdir" in out
    assert not victim.exists()


@pytest.mark.parametrize(
    "file",
    ["filename: {victim}.log", "filename: ${{hydra.runtime.output_dir}}/x.log\n        mode: w"],
)
def test_a_log_file_outside_the_run_folder_or_truncating_is_refused(
    tmp_path: Path, file: str
) -> None:
    victim = tmp_path / "victim"
    shared = _shared(
        tmp_path,
        "hydra:\n  job_logging:\n    handlers:\n      file:\n"
        f"        {file.format(victim=victim)}\n",
    )
    out = _dry(tmp_path, shared)
    assert "hydra.job_logging.handlers.file" in out
    assert not Path(f"{victim}.log").exists()


def test_a_yaml_alias_bomb_is_refused_before_composition(tmp_path: Path) -> None:
    levels = ["    l0: &l0 [x,x,x,x,x,x,x,x,x,x]"]
    levels += [f"    l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    shared = _shared(tmp_path, "task:\n  params:\n" + "\n".join(levels) + "\n")
    out = _dry(tmp_path, shared)
    assert "expands to more than" in out and "x.yaml" in out


def test_another_hydra_apps_output_folder_is_not_a_run_folder(tmp_path: Path) -> None:
    other = tmp_path / "other_app_run"
    (other / ".hydra").mkdir(parents=True)
    (other / ".hydra" / "config.yaml").write_text("theirs: true\n")
    proc = run_cli("dry_run=true", f"hydra.run.dir={other}", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1 and "another program's Hydra record" in out, out
    assert (other / ".hydra" / "config.yaml").read_text() == "theirs: true\n"
