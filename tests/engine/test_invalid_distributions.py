"""NaN, infinite or all-zero next-token probabilities stop sampling with an error that
names the training step, the completion, the decoding step and the likely cause
(``torch.multinomial`` would refuse such rows; the fast draw checks them itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import output_of, run_cli
from conftest_model import tiny
from family_models import save_family

from art_hydra import compose, train
from art_hydra.engine.rl.sampling import SamplingSettings, _draw, sample
from art_hydra.errors import InvalidDistributionError

#: A stop id no model emits: every completion runs its full length.
NEVER = (10**6,)


def _sample(loaded: Any, prompts: list[list[int]], settings: SamplingSettings, **kw: Any) -> Any:
    return sample(
        loaded.model.eval(),
        prompts,
        6,
        settings,
        NEVER,
        loaded.tokenizer.pad_token_id,
        torch.Generator().manual_seed(0),
        **kw,
    )


def _prompts(loaded: Any, texts: list[str]) -> list[list[int]]:
    return [list(loaded.tokenizer(t)["input_ids"]) for t in texts]


def _on_call(model: Any, call: int, edit: Any) -> Any:
    """Edit the logits of the model's ``call``-th forward (0: the prompt pass; k: the
    forward whose logits decoding step k draws from)."""
    calls = {"n": 0}

    def hook(module: Any, args: Any, kwargs: Any, output: Any) -> Any:
        if calls["n"] == call:
            edit(output.logits)
        calls["n"] += 1
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


def test_nan_weights_are_named_as_diverged() -> None:
    _, loaded, _ = tiny()
    with torch.no_grad():
        loaded.model.lm_head.weight[5, 0] = float("nan")
    with pytest.raises(InvalidDistributionError) as info:
        _sample(loaded, _prompts(loaded, ["abc", "abd"]), SamplingSettings())
    error = info.value
    assert error.rows == [0, 1] and error.position == 0 and error.problem == "NaN"
    assert "logits are NaN" in error.cause and "diverged" in error.cause
    assert "completion 0 of 2 and 1 other completion(s) (1)" in str(error)
    assert "decoding step 0" in str(error)


def test_an_infinite_logit_names_the_completion_and_the_decoding_step() -> None:
    _, loaded, _ = tiny()
    prompts = _prompts(loaded, ["abc"] * 4 + ["xyz"] * 4)

    def overflow(logits: torch.Tensor) -> None:
        logits[5, -1, 7] = float("inf")  # as float16 overflows

    handle = _on_call(loaded.model, 3, overflow)
    try:
        with pytest.raises(InvalidDistributionError) as info:
            _sample(loaded, prompts, SamplingSettings())
    finally:
        handle.remove()
    error = info.value
    assert (error.rows, error.position, error.batch) == ([5], 3, 8)
    assert "logits are infinite" in error.cause and "float16" in error.cause
    assert "completion 5 of 8" in str(error) and "new token 4" in str(error)


def test_suppressing_every_token_is_named() -> None:
    _, loaded, _ = tiny()
    everything = tuple(range(loaded.model.config.vocab_size))
    with pytest.raises(InvalidDistributionError) as info:
        _sample(loaded, _prompts(loaded, ["abc"]), SamplingSettings(suppress_ids=everything))
    assert "special ids" in info.value.cause and "cover the vocabulary" in info.value.cause


def test_a_temperature_that_overflows_the_logits_is_named() -> None:
    _, loaded, _ = tiny()
    with pytest.raises(InvalidDistributionError) as info:
        _sample(loaded, _prompts(loaded, ["abc"]), SamplingSettings(temperature=1e-40))
    assert "rl.temperature=1e-40" in info.value.cause


def test_prompts_batched_by_length_are_named_by_their_place_in_the_batch() -> None:
    """Without left padding, prompts of each length sample as their own batch."""
    _, loaded, _ = tiny()
    prompts = _prompts(loaded, ["ab", "abcd", "xy", "wxyz", "ab"])
    width = len(prompts[1])

    def hook(module: Any, args: Any, kwargs: Any, output: Any) -> Any:
        if kwargs["input_ids"].shape[1] == width:  # the prompt pass of the longer ones
            output.logits.fill_(float("nan"))
        return output

    handle = loaded.model.register_forward_hook(hook, with_kwargs=True)
    try:
        with pytest.raises(InvalidDistributionError) as info:
            _sample(loaded, prompts, SamplingSettings(), left_padding=False)
    finally:
        handle.remove()
    assert info.value.rows == [1, 3] and info.value.batch == 5


def test_finished_completions_are_not_checked() -> None:
    probs = torch.tensor([[0.5, 0.5], [float("nan"), 0.0]])
    active = torch.tensor([True, False])
    assert _draw(probs, torch.Generator().manual_seed(0), active=active).shape == (2,)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ([0.0, 0.0, 0.0], "all-zero"),
        ([0.5, -0.1, 0.6], "negative"),
        ([0.5, float("inf"), 0.1], "infinite"),
        ([0.5, float("nan"), 0.1], "NaN"),
    ],
)
def test_the_draw_refuses_what_multinomial_refuses(row: list[float], problem: str) -> None:
    probs = torch.tensor([[0.2, 0.3, 0.5], row])
    with pytest.raises(RuntimeError):
        torch.multinomial(probs, 1)
    with pytest.raises(InvalidDistributionError) as info:
        _draw(probs, torch.Generator().manual_seed(0), position=4)
    assert (info.value.rows, info.value.position, info.value.problem) == ([1], 4, problem)


def _diverged_folder(tmp_path: Path) -> Path:
    """A llama folder with one NaN weight, as a diverged update leaves it."""
    from safetensors.torch import load_file, save_file

    folder = save_family(tmp_path / "model", "llama", {})
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if k.endswith("layers.1.mlp.down_proj.weight"))
    weights[name][0, 0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


#: The diverged folder as a run loads it.
FOLDER_RUN = [
    "model.source=pretrained",
    "model.finetune=full",
    "model.max_seq_length=64",
    "backend.device=cpu",
    "trainer.max_steps=2",
    "trainer.per_device_train_batch_size=16",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]


@pytest.mark.slow
def test_a_run_stops_naming_the_training_step_and_the_prompt(tmp_path: Path) -> None:
    folder = _diverged_folder(tmp_path)
    cfg = compose([f"model.name={folder}", *FOLDER_RUN])
    with pytest.raises(InvalidDistributionError) as info:
        train(cfg, run_dir=tmp_path / "run")
    message = str(info.value)
    assert message.startswith("sampling stopped at training step 1: completion 0 of 16 (prompt '")
    assert "logits are NaN" in message
    cfg = compose([f"model.name={folder}", *FOLDER_RUN, "trainer.warmup_pass=true"])
    with pytest.raises(InvalidDistributionError, match="in the warmup pass"):
        train(cfg, run_dir=tmp_path / "warm")


@pytest.mark.slow
def test_the_cli_reports_diverged_weights_without_a_traceback(tmp_path: Path) -> None:
    folder = _diverged_folder(tmp_path)
    run_dir = tmp_path / "run"
    proc = run_cli(
        f"model.name={folder}",
        *FOLDER_RUN,
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        timeout=300,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "sampling stopped at training step 1" in out and "logits are NaN" in out
    assert "Traceback" not in out
