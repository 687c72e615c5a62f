"""Attacks from the independent review of issue 17 (sweeps), each through a config folder
a user was handed (``--config-dir shared``): a callable or a database the Optuna sweeper
acts on, named by another key than ``_target_``; and the other way round, a sampler the
user chose by hand from their own folder must run."""

from __future__ import annotations

from pathlib import Path

from conftest import output_of, report_entries, run_cli, shared_config_dir

OPTUNA = [
    "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "hydra.sweeper.direction=maximize",
    "dry_run=true",
]  # fmt: skip
SPACE = "rl.temperature=interval(0.7,1.2)"


def _run(tmp_path: Path, shared: Path, *extra: str) -> tuple[int, str]:
    proc = run_cli(
        "--config-dir", str(shared), *OPTUNA, *extra, SPACE,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    return proc.returncode, output_of(proc)


def test_a_search_space_function_named_by_a_config_file_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "space_evil.py").write_text(
        f"open({str(marker)!r}, 'w')\ndef space(cfg, trial):\n    return {{}}\n"
    )
    experiment = (
        "# @package _global_\nhydra:\n  sweeper:\n    custom_search_space: space_evil.space\n"
    )
    shared = shared_config_dir(tmp_path, {"experiment/x.yaml": experiment})
    code, out = _run(tmp_path, shared, "experiment=x")
    assert code == 1 and "Traceback" not in out, out
    assert [k for k, _, _ in report_entries(out)] == ["hydra.sweeper.custom_search_space"]
    assert not marker.exists()


def test_a_study_database_chosen_by_a_config_file_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "planted" / "evil.db"
    planted.parent.mkdir()
    experiment = f"# @package _global_\nhydra:\n  sweeper:\n    storage: sqlite:///{planted}\n"
    shared = shared_config_dir(tmp_path, {"experiment/x.yaml": experiment})
    code, out = _run(tmp_path, shared, "experiment=x")
    assert code == 1, out
    assert [k for k, _, _ in report_entries(out)] == ["hydra.sweeper.storage"]
    assert not planted.exists()


def test_a_sampler_chosen_by_hand_from_the_users_folder_is_the_users(tmp_path: Path) -> None:
    sampler = "_target_: optuna.samplers.RandomSampler\nseed: 1\n"
    shared = shared_config_dir(tmp_path, {"hydra/sweeper/sampler/mine.yaml": sampler})
    proc = run_cli(
        "--config-dir", str(shared), *OPTUNA, "hydra/sweeper/sampler=mine", SPACE,
        f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
    )  # fmt: skip
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "Sampler: RandomSampler" in out


def test_the_same_sampler_chosen_by_a_config_file_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    sampler = f"_target_: builtins.open\nfile: {marker}\nmode: w\n"
    experiment = "# @package _global_\ndefaults:\n  - override /hydra/sweeper/sampler: evil\n"
    shared = shared_config_dir(
        tmp_path, {"hydra/sweeper/sampler/evil.yaml": sampler, "experiment/x.yaml": experiment}
    )
    code, out = _run(tmp_path, shared, "experiment=x")
    assert code == 1, out
    assert "hydra.sweeper.sampler._target_" in [k for k, _, _ in report_entries(out)]
    assert not marker.exists()


def test_batch_script_settings_chosen_by_a_config_file_are_refused(tmp_path: Path) -> None:
    experiment = (
        "# @package _global_\nhydra:\n  launcher:\n    additional_parameters:\n"
        "      export: ALL,LD_PRELOAD=/tmp/evil.so\n      output: /root/.bashrc\n"
    )
    shared = shared_config_dir(tmp_path, {"experiment/x.yaml": experiment})
    proc = run_cli(
        "--config-dir", str(shared), "-m", "hydra/launcher=slurm", "experiment=x", "seed=1,2",
        "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
    )  # fmt: skip
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert [k for k, _, _ in report_entries(out)] == ["hydra.launcher.additional_parameters"]
    # The same setting typed on the command line is the user's own.
    mine = run_cli(
        "-m", "hydra/launcher=slurm", "+hydra.launcher.additional_parameters.account=me",
        "seed=1,2", "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep2'}", cwd=tmp_path,
    )  # fmt: skip
    assert mine.returncode == 0, output_of(mine)
