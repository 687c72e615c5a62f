"""``art-hydra export`` and ``art-hydra generate`` on real, briefly trained runs: the
exported folder loads with stock transformers in a process that cannot import art_hydra
or peft, and its logits are the trained model's (as the run's own backend loads the
checkpoint) within float32 rounding; a LoRA run of a tied-embedding family (Gemma) with
a trained head keeps that head; ``--adapter`` loads with peft; generate prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ART_HYDRA
from model_folders import GEMMA_LIKE, char_tokenizer, random_model

from art_hydra import compose, train
from art_hydra.commands.export import export
from art_hydra.commands.trained import EXPORT_RECORD

pytestmark = pytest.mark.slow

#: The prompts compared: ids of the tiny model's char tokenizer, as the run encodes them.
PROMPTS = ["abc=", "dcba="]
#: Merged float32 weights give the same logits up to summation order.
TOLERANCE = 1e-4

SHORT = [
    "trainer.max_steps=3",
    "trainer.per_device_train_batch_size=16",
    "backend.device=cpu",
    "backend.cpu_threads=1",
    "logging.tensorboard=false",
    "logging.plot=false",
    "logging.progress_bar=off",
]

#: Stock transformers only: art_hydra and peft cannot be imported in this process.
BLOCKER = textwrap.dedent(
    """
    import sys

    # None in sys.modules: `import peft` raises ModuleNotFoundError and
    # importlib.util.find_spec("peft") says it is not installed (what transformers asks).
    for name in ("art_hydra", "peft", "hydra_plugins"):
        sys.modules[name] = None
    """
)

STOCK = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, prompts = sys.argv[1], json.loads(sys.argv[2])
    for name in ("art_hydra", "peft"):
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"{name} could be imported")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = {}
    for prompt in prompts:
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True,
                tokenize=True, return_dict=True,
            )["input_ids"]
        else:
            ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        generated = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False)
        out[prompt] = {"ids": list(ids), "logits": logits.tolist(),
                       "generated": generated[0].tolist()}
    print(json.dumps(out))
    """
)


def stock_logits(folder: Path, tmp: Path) -> dict[str, Any]:
    """Logits of ``folder`` loaded by stock transformers, art_hydra and peft blocked."""
    site = tmp / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    script = site / "stock.py"
    script.write_text(STOCK)
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-s", str(script), str(folder), json.dumps(PROMPTS)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def trained_logits(cfg: Any, checkpoint: Path, ids: list[int]) -> torch.Tensor:
    """The trained model's logits as the run's own backend loads the checkpoint."""
    from art_hydra.engine.backends import load_model
    from art_hydra.tasks import build_task

    loaded = load_model(cfg.model, cfg.backend, cfg.seed, charset=build_task(cfg).charset())
    loaded.load_weights(checkpoint)
    loaded.model.eval()
    with torch.no_grad(), loaded.compute_precision():
        return loaded.model(input_ids=torch.tensor([ids])).logits[0].float()


def run(tmp: Path, name: str, overrides: list[str]) -> tuple[Any, Path]:
    cfg = compose([*SHORT, *overrides])
    folder = tmp / name
    train(cfg, run_dir=folder)
    return cfg, folder


def max_diff(cfg: Any, run_dir: Path, out: Path, tmp: Path) -> float:
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    stock = stock_logits(out, tmp)
    worst = 0.0
    for prompt in PROMPTS:
        ids = stock[prompt]["ids"]
        want = trained_logits(cfg, checkpoint, ids)
        got = torch.tensor(stock[prompt]["logits"])
        worst = max(worst, float((want - got).abs().max()))
    return worst


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_export_loads_with_stock_transformers_and_gives_the_trained_logits(
    tmp_path: Path, finetune: str
) -> None:
    cfg, run_dir = run(tmp_path, finetune, [f"model.finetune={finetune}"])
    out = run_dir / "export"
    record = export(run_dir, out)
    assert record["method"] == ("lora-merged" if finetune == "lora" else "full")
    saved = json.loads((out / EXPORT_RECORD).read_text())
    assert saved["step"] == 3 and saved["finetune"] == finetune
    assert {"config.json", "model.safetensors", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not list(out.glob("*.bin")) and not list(out.glob("adapter_*"))
    diff = max_diff(cfg, run_dir, out, tmp_path)
    print(f"{finetune}: max |logits merged - trained| = {diff:.3g}")
    assert diff < TOLERANCE
    # The run folder with its export still resumes (the export is one of its entries).
    train(
        compose([*SHORT, f"model.finetune={finetune}", "trainer.max_steps=4", "resume=true"]),
        run_dir=run_dir,
    )


@pytest.mark.parametrize("head", ["tied", "trained"])
def test_a_tied_family_lora_run_merges_and_keeps_its_head(tmp_path: Path, head: str) -> None:
    """Gemma ties its head to the embeddings: plain LoRA leaves them tied; LoRA with
    modules_to_save=[lm_head] trains the head apart, and the export must not tie it
    back."""
    folder = tmp_path / "gemma"
    vocab = char_tokenizer(folder, template=GEMMA_LIKE)
    random_model(folder, "gemma", vocab)
    cfg, run_dir = run(
        tmp_path,
        "gemma-run",
        [
            "model=pretrained",
            f"model.name={folder}",
            "model.finetune=lora",
            "model.max_seq_length=72",
            f"model.lora.modules_to_save=[{'lm_head' if head == 'trained' else ''}]",
            "trainer.learning_rate=1e-2",
            "rl.max_prompt_length=64",
            "rl.max_completion_length=4",
        ],
    )
    out = tmp_path / "gemma-export"
    export(run_dir, out)
    config = json.loads((out / "config.json").read_text())
    assert config.get("tie_word_embeddings", True) is (head == "tied")
    diff = max_diff(cfg, run_dir, out, tmp_path)
    print(f"gemma lora, {head} head: max |logits merged - trained| = {diff:.3g}")
    assert diff < TOLERANCE


def test_adapter_export_loads_with_peft(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg, run_dir = run(tmp_path, "lora", ["model.finetune=lora"])
    out = tmp_path / "adapter"
    export(run_dir, out, adapter=True)
    assert (out / "adapter_model.safetensors").is_file()
    base = AutoModelForCausalLM.from_pretrained(out / "base", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, out).eval()
    ids = [1, *range(4, 9)]
    with torch.no_grad():
        got = model(input_ids=torch.tensor([ids])).logits[0]
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    assert float((got - trained_logits(cfg, checkpoint, ids)).abs().max()) < TOLERANCE


def test_generate_prints_completions_for_a_run_and_its_export(tmp_path: Path) -> None:
    _, run_dir = run(tmp_path, "full", [])
    out = run_dir / "export"
    done = subprocess.run(
        [ART_HYDRA, "export", str(run_dir), str(out)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"art-hydra generate {out}" in done.stdout
    # --force replaces an earlier export (and nothing else), leaving no temporary folder.
    again = subprocess.run(
        [ART_HYDRA, "export", str(run_dir), str(out), "--force", "--dtype", "bfloat16"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads((out / EXPORT_RECORD).read_text())["dtype"] == "bfloat16"
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".export")]
    for source in (run_dir, out):
        done = subprocess.run(
            [ART_HYDRA, "generate", str(source), "-p", "abc=", "-p", "dab=", "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert [r["prompt"] for r in rows] == ["abc=", "dab="]
        assert all(isinstance(r["completion"], str) for r in rows)
    done = subprocess.run(
        [ART_HYDRA, "generate", str(run_dir), "--task", "--num", "2", "--temperature", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith(f"with {run_dir} step 3 (step-000003)")
    assert "/128 right" in done.stdout  # 64 reversals, 2 completions each
