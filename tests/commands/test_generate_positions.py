"""``art-hydra generate`` checks its prompts and its budget before the model loads: the
default budget (the run's ``rl.max_completion_length``) is cut to the model's positions
with a notice, a ``--max-new-tokens`` past them is refused naming the value that fits
(it was an IndexError traceback), and a prompt the tokenizer cannot encode is refused
(it was answered as a different prompt).

Model tier (it trains): real runs of the real CLI in a subprocess, on a 32-position
GPT-2 folder (a learned position table) and on the tiny model. The GPT-2 run is the
SFT-with-evaluation case the pre-flight now refuses, trained with the fix it gives: the
fix holds for real, evaluation included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, run_cli
from model_folders import gpt2_tokenizer, random_model

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generate")
    model = root / "gpt2"
    random_model(model, "gpt2", gpt2_tokenizer(model), n_positions=32)
    data = root / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"ab{i}=", "answer": "ba"}) + "\n" for i in range(8))
    )
    common = ["trainer.max_steps=1", "backend.device=cpu"]
    gpt2 = root / "gpt2_run"
    proc = run_cli(
        "model=pretrained",
        f"model.name={model}",
        "model.finetune=full",
        "task=jsonl",
        f"task.path={data}",
        "algorithm=sft",
        "eval.fraction=0.25",
        "eval.max_completion_length=28",  # the pre-flight's fix
        *common,
        f"hydra.run.dir={gpt2}",
        cwd=root,
        timeout=300,
    )
    assert proc.returncode == 0, output_of(proc)
    assert "held-out prompts" in output_of(proc)  # evaluated, within the positions
    tiny = root / "tiny_run"
    proc = run_cli(*common, f"hydra.run.dir={tiny}", cwd=root, timeout=300)
    assert proc.returncode == 0, output_of(proc)
    return {"gpt2": gpt2, "tiny": tiny}


def _generate(*args: str, cwd: Path) -> tuple[int, str, str]:
    proc = run_cli("generate", *args, cwd=cwd, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def test_the_default_budget_is_cut_to_the_positions_with_a_notice(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    code, out, err = _generate(str(runs["gpt2"]), "-p", "ab2=", cwd=tmp_path)
    assert code == 0, out + err
    assert "Traceback" not in err and "'ab2=' -> " in out
    assert "generating at most 28" in err and "--max-new-tokens" in err


def test_a_budget_asked_past_the_positions_is_refused_with_the_value_that_fits(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    code, _, err = _generate(
        str(runs["gpt2"]), "-p", "ab2=", "--max-new-tokens", "40", cwd=tmp_path
    )
    assert code == 2 and "Traceback" not in err, err
    assert "--max-new-tokens 28" in err and "n_positions=32" in err
    code, _, err = _generate(
        str(runs["gpt2"]), "-p", "ab2=", "--max-new-tokens", "28", cwd=tmp_path
    )
    assert code == 0, err


def test_a_prompt_the_tokenizer_cannot_encode_is_refused(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """The tiny model's tokenizer knows the task's characters only: 'Ä' became its
    unknown token and the model answered another prompt."""
    code, out, err = _generate(str(runs["tiny"]), "-p", "abcÄ", cwd=tmp_path)
    assert code == 2 and "'Ä'" in err and out == "", err
    code, out, err = _generate(str(runs["tiny"]), "-p", "abc", cwd=tmp_path)
    assert code == 0 and "'abc' -> " in out, err


def test_the_vllm_engine_where_vllm_is_missing_is_one_line(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """``--engine vllm`` (or ``rollout.engine=vllm``, as a run spells it) without vLLM
    installed (this environment) names the extra to install, with no traceback."""
    for spelling in (["--engine", "vllm"], ["rollout.engine=vllm"]):
        code, out, err = _generate(str(runs["tiny"]), "-p", "abc", *spelling, cwd=tmp_path)
        assert code == 2 and "Traceback" not in err and out == "", err
        assert "art-hydra[vllm]" in err and "leave --engine out" in err
