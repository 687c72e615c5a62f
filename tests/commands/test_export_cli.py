"""``art-hydra export`` and ``art-hydra generate``: a user's mistakes (no such folder, a
run without a checkpoint, an output folder in the way, no prompts) are one message and
exit status 2, never a traceback, and nothing is written or deleted; both commands
have their own ``--help`` and the main help lists them. Nothing is trained here: the
run folders are a run's config and a checkpoint folder with its manifest."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli
from omegaconf import OmegaConf

from art_hydra import compose
from art_hydra.commands.export import main as export_main
from art_hydra.commands.generate import main as generate_main
from art_hydra.config.run_files import RUN_CONFIG, checkpoint_name
from art_hydra.runs.run_folder import write_manifest
from art_hydra.runs.run_messages import try_commands
from art_hydra.tasks.examples import Example

CONFIG_YAML = Path(__file__).resolve().parents[2] / "conf" / "config.yaml"


def run_folder(root: Path, checkpoint: bool = True) -> Path:
    """A run folder as a run leaves it, as far as the commands look before loading."""
    folder = root / "run"
    folder.mkdir()
    (folder / RUN_CONFIG).write_text(OmegaConf.to_yaml(compose([]), resolve=True))
    if checkpoint:
        step = folder / "checkpoints" / checkpoint_name(3)
        step.mkdir(parents=True)
        (step / "model.safetensors").write_bytes(b"not loaded by these tests")
        write_manifest(step, 3)
    return folder


def refused(capsys: pytest.CaptureFixture[str], command: object, argv: list[str]) -> str:
    assert command(argv) == 2  # type: ignore[operator]
    out = capsys.readouterr()
    assert "Traceback" not in out.err and out.out == ""
    assert len(out.err.strip().splitlines()) == 1, out.err
    return out.err


def test_a_missing_run_folder_is_one_line_and_status_2(tmp_path: Path) -> None:
    done = run_cli("export", str(tmp_path / "nope"), str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip() == f"art-hydra export: {tmp_path / 'nope'}: no such folder "
        "(give a run folder or an export folder)"
    )
    assert not (tmp_path / "out").exists()


def test_a_run_without_a_checkpoint_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_folder(tmp_path, checkpoint=False)
    err = refused(capsys, export_main, [str(run), str(tmp_path / "out")])
    assert "has no complete checkpoint" in err and "resume=true" in err
    err = refused(capsys, generate_main, [str(run), "-p", "abc="])
    assert "has no complete checkpoint" in err


def test_a_folder_that_is_no_run_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(capsys, export_main, [str(tmp_path), str(tmp_path / "out")])
    assert "neither a run folder" in err


def test_an_existing_out_dir_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_folder(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    err = refused(capsys, export_main, [str(run), str(out)])
    assert "exists" in err and "--force" in err
    err = refused(capsys, export_main, [str(run), str(out), "--force"])
    assert "not an export" in err
    assert (out / "mine.txt").read_text() == "keep"
    # The run folder itself, or a folder in its checkpoints, is never an output.
    for target in (run, tmp_path, run / "checkpoints" / "x", run / "my-export"):
        err = refused(capsys, export_main, [str(run), str(target), "--force"])
        assert "run folder" in err or "checkpoints" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]


def test_a_missing_step_lists_the_steps_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_folder(tmp_path)
    err = refused(capsys, export_main, [str(run), str(tmp_path / "o"), "--checkpoint", "7"])
    assert "step-000007" in err and "step-000003" in err


def test_a_full_run_has_no_adapter_to_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_folder(tmp_path)  # the default job trains every weight
    err = refused(capsys, export_main, [str(run), str(tmp_path / "o"), "--adapter"])
    assert "model.finetune=full" in err


def test_generate_needs_prompts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = run_folder(tmp_path)
    err = refused(capsys, generate_main, [str(run)])
    assert "-p PROMPT" in err
    err = refused(capsys, generate_main, [str(run), "--file", str(tmp_path / "none.txt")])
    assert "no such file" in err


@pytest.mark.parametrize("command", ["export", "generate"])
def test_each_command_has_its_help(command: str, tmp_path: Path) -> None:
    done = run_cli(command, "--help", cwd=tmp_path)
    assert done.returncode == 0 and f"usage: art-hydra {command}" in done.stdout
    bad = run_cli(command, cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_the_main_help_lists_the_commands() -> None:
    raw = OmegaConf.to_container(OmegaConf.load(CONFIG_YAML), resolve=False)
    template = raw["hydra"]["help"]["template"]  # type: ignore[index]
    assert "== Commands ==" in template
    for command in ("art-hydra export RUN_DIR OUT_DIR", "art-hydra generate", "summarize"):
        assert command in template


def test_an_override_named_like_a_command_is_hydras(tmp_path: Path) -> None:
    """Only the bare word is a command; ``export=...`` stays an override (and, naming no
    key of the config, is reported as one)."""
    done = run_cli("export=1", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "export" in done.stderr


def test_the_end_of_run_lines_name_both_commands(tmp_path: Path) -> None:
    lines = try_commands(tmp_path / "my run", [Example(prompt="abc=", answer="cba")])
    assert f"art-hydra export '{tmp_path / 'my run'}' '{tmp_path / 'my run' / 'export'}'" in lines
    assert f"art-hydra generate '{tmp_path / 'my run'}' -p abc=" in lines
