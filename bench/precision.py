"""What each precision does to one RL step, on tiny random-weight models of real families.

Prints two tables:

1. The share of trainable weights one SFT optimizer step at ``--lr`` changes (SFT: a
   random model's RL rewards can all tie, and a step without gradient changes nothing), in float32,
   float16 mixed precision, bfloat16 on float32 masters (the default) and pure bfloat16
   weights (``model.master_weights=false``), on the tiny Llama (``model=tiny``) and a
   tiny Qwen2 loaded from a folder; with the share the load-time warning measures.
2. Per family of the test matrix and dtype: step-1 ``clip_fraction`` at
   ``rl.epsilon=1e-4`` and the ``sampling_mismatch`` mean and max (nats) between the
   sampler's logprobs and the training forward's.

Usage: python bench/precision.py [--lr 5e-6] [--families llama,qwen2,...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest_model import QUICK
from family_models import FAMILIES, load_family, save_family

from art_hydra import compose
from art_hydra.engine.backends.torch_backend import rounded_away_share
from art_hydra.engine.queue import StepWork
from art_hydra.engine.recipe import build_trainer_and_producer

PRECISIONS = {
    "float32": ["model.dtype=float32"],
    "float16 mixed": ["model.dtype=float16"],
    "bfloat16 masters": ["model.dtype=bfloat16"],
    "pure bfloat16": ["model.dtype=bfloat16", "model.master_weights=false"],
}
SMALL = [
    "trainer.per_device_train_batch_size=8",
    "rl.num_generations=4",
    "rl.max_completion_length=8",
]


def one_step(cfg: Any, loaded: Any = None) -> tuple[Any, Any, float]:
    """(trainer, result, share of trainable weights the step changed)."""
    trainer, producer = build_trainer_and_producer(cfg, loaded=loaded)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    result = trainer.train_step(StepWork(producer.make_inputs()))
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(params, before, strict=True))
    return trainer, result, changed / sum(p.numel() for p in params)


def update_shares(lr: float, folder: Path) -> None:
    print(f"share of trainable weights changed by one SFT step at lr {lr:g}")
    print(f"{'model':<8} {'precision':<18} {'changed':>8} {'warned share':>13}")
    for model in ("llama", "qwen2"):
        for name, overrides in PRECISIONS.items():
            common = ["algorithm=sft", f"trainer.learning_rate={lr}", *overrides]
            if model == "llama":
                cfg = compose([*QUICK, *common])
                trainer, _, share = one_step(cfg)
            else:
                cfg, loaded = load_family(folder, overrides=[*SMALL, *common])
                trainer, _, share = one_step(cfg, loaded)
            warned = ""
            if trainer.loaded.half_weights:
                warned = f"{100 * rounded_away_share(trainer.model, lr):.1f}%"
            print(f"{model:<8} {name:<18} {100 * share:>7.1f}% {warned:>13}")


def family_table(families: list[str], root: Path) -> None:
    print("\nstep 1 at rl.epsilon=1e-4: clip_fraction, sampling_mismatch mean / max (nats)")
    dtypes = ("float32", "bfloat16", "float16")
    print(f"{'family':<22}" + "".join(f"{d:>34}" for d in dtypes))
    for family in families:
        model_type, extra, _, _ = FAMILIES[family]
        folder = save_family(root / family, model_type, extra)
        attn = "eager" if family == "llama-eager" else None
        cells = []
        for dtype in dtypes:
            overrides = [*SMALL, "rl.epsilon=1e-4", f"model.dtype={dtype}"]
            cfg, loaded = load_family(folder, attn, overrides)
            _, result, _ = one_step(cfg, loaded)
            mean = result.stats["sampling_mismatch_mean"]
            top = result.stats["sampling_mismatch_max"]
            cells.append(f"{result.clip_fraction:.2f} {mean:.1e} / {top:.1e}")
        print(f"{family:<22}" + "".join(f"{c:>34}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--families", default=",".join(sorted(FAMILIES)), help="'' for none")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        update_shares(args.lr, save_family(root / "qwen2-shares", "qwen2", {}))
        if args.families:
            family_table(args.families.split(","), root)


if __name__ == "__main__":
    main()
