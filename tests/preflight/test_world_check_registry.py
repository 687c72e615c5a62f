"""World checks come from a registry beside the validators': art_hydra's own register
there in the order they report, and a launcher script's module adds one with
``@world_check`` (a check that crashes is reported by name, not as a traceback)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import output_of
from hydra.types import RunMode

from art_hydra.config.composition import compose_and_check, make_loader
from art_hydra.config.hydra_compat import traced_reads
from art_hydra.preflight import ENVIRONMENT_SECTIONS, environment_sections
from art_hydra.preflight.world_check_registry import adapted_checks, registered_world_checks
from art_hydra.sweeps.read_trace import Tree

USER_CHECKS = '''
from art_hydra import Problem, fix
from art_hydra.preflight import world_check


@world_check(reads=("task", "acme"), name="acme.data_share")
def data_share_mounted(cfg):
    """ACME's data share must be mounted before a run reads it."""
    yield Problem("task.path", cfg.task.path, "ACME: the data share is not mounted.",
                  fix({"task.path": "/mnt/acme/data.jsonl"}))


@world_check(reads=("model",))
def broken(cfg):
    raise RuntimeError("boom")
'''

LAUNCHER = """
import acme_world  # registers its world checks
from art_hydra.commands.cli import main

if __name__ == "__main__":
    main()
"""


def test_art_hydra_s_own_checks_are_registered_in_report_order() -> None:
    checks = registered_world_checks()
    assert list(checks)[:6] == ["task", "model", "model_load", "backend", "trackers", "eval"]
    assert checks["backend"].devices and not checks["task"].devices
    assert set(environment_sections()) == set(ENVIRONMENT_SECTIONS)


@pytest.fixture(scope="module")
def user_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random-weight Mistral folder and a JSONL file: the checks read past their early
    returns (no model cached, no data) only with files of the user's own."""
    from model_folders import char_tokenizer, random_model

    root = tmp_path_factory.mktemp("declared")
    folder = root / "mistral"
    random_model(folder, "mistral", char_tokenizer(folder), max_position_embeddings=128)
    data = root / "data.jsonl"
    data.write_text("".join(f'{{"prompt": "ab{i}=", "answer": "ba"}}\n' for i in range(8)))
    return {"model": folder, "data": data}


def _own_files(files: dict[str, Path]) -> list[str]:
    return [
        "model=pretrained",
        f"model.name={files['model']}",
        "task=jsonl",
        f"task.path={files['data']}",
        f"eval.path={files['data']}",
        "rl.max_prompt_length=16",
        "rl.max_completion_length=32",
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["experiment=tool_use"],
        ["task=reverse", "eval.fraction=0.25"],
        ["algorithm=sft"],
        ["task=jsonl"],
        _own_files,
        lambda files: [*_own_files(files), "algorithm=sft", "model.finetune=full"],
    ],
)
def test_each_built_in_check_reads_only_the_sections_it_declares(
    overrides: Any, user_files: dict[str, Path]
) -> None:
    # A check is skipped when a section it declares holds a refused key, and a refusal's
    # fixes reuse its verdict while those sections agree: a section read but not declared
    # would be a verdict kept across a change it depends on.
    overrides = overrides(user_files) if callable(overrides) else overrides
    result = compose_and_check(make_loader(), "config", overrides, RunMode.RUN)
    cfg = result.resolved
    assert cfg is not None, result.problems
    tree = Tree(cfg)
    for name, check in registered_world_checks().items():
        # A missing file is a verdict, not a crash: only the reads count here.
        with traced_reads() as reads, contextlib.suppress(Exception):
            list((check.fn(cfg, True) if check.devices else check.fn(cfg)) or ())
        paths = tree.paths(reads)  # as a sweep's memory reads them (copies followed)
        assert paths is not None, f"{name} wrote into the config or read a loose copy of it"
        read = {str(path[0]) for path in paths}
        assert read <= set(check.reads), (name, sorted(read - set(check.reads)))


def test_checks_are_handed_out_adapted_only_inside_adapted_checks() -> None:
    """A sweep's pre-flight runs the same loop with each check remembered: adapted
    inside the context, the registry's own objects again after it."""
    own = registered_world_checks()
    with adapted_checks(lambda check: replace(check, reads=("adapted",))):
        inside = registered_world_checks()
    assert list(inside) == list(own)
    assert {c.reads for c in inside.values()} == {("adapted",)}
    assert all(registered_world_checks()[name] is check for name, check in own.items())


def test_a_launcher_script_s_world_check_runs_in_the_pre_flight(tmp_path: Path) -> None:
    (tmp_path / "acme_world.py").write_text(textwrap.dedent(USER_CHECKS))
    (tmp_path / "launch.py").write_text(textwrap.dedent(LAUNCHER))
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "launch.py", "dry_run=true"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "fix: task.path=/mnt/acme/data.jsonl" in out
    assert "ACME: the data share is not mounted." in out
    # reads=("model",) put it after the built-in checks; its entry comes last.
    assert out.index("ACME: the data share") < out.index("world check acme_world.broken")
    assert "the world check crashed: boom" in out
    assert "Traceback" not in out
