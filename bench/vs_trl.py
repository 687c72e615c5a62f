"""art_hydra against TRL's GRPOTrainer on identical work, interleaved in fresh processes.

Both sides load one model folder (art_hydra's default tiny Llama, built and saved
here), read one file of 2,000 ``reverse`` examples, score with art_hydra's
``char_overlap`` reward, and train 128 completions per optimizer step (16 prompts x 8)
of at most 8 new tokens, lr 1e-3 decaying linearly, full fine-tuning, no KL. Each run
is a fresh child process of this script (``--child``); the sides alternate, ``--pairs``
times, cycling ``--seeds``. Printed per side (median and range over its runs): steady
optimizer steps/s and trained tokens/s (past the first 20% of steps), the step at which
the mean reward over 5 consecutive steps first reaches 0.9 and the seconds from the
child's start to it, CPU seconds per steady step (user + system, all threads), peak
resident memory; then the ratios art_hydra / TRL. ``--load N`` runs N CPU-burning
processes beside every run. On a GPU both sides use it unchanged (``backend.device=auto``
and TRL's default device).

Settings mapped onto GRPOConfig (TRL 1.16):

| art_hydra                                   | GRPOConfig                        | value   |
|---------------------------------------------|-----------------------------------|---------|
| trainer.per_device_train_batch_size          | per_device_train_batch_size       | 128     |
| trainer.gradient_accumulation_steps          | gradient_accumulation_steps       | 1       |
| rl.steps_per_generation / num_iterations     | steps_per_generation / num_iterations | 1 / 1 |
| rl.num_generations                           | num_generations                   | 8       |
| rl.max_completion_length                     | max_completion_length             | 8       |
| rl.temperature / top_p / top_k               | temperature / top_p / top_k       | 1 / 1 / 0 |
| rl.beta                                      | beta                              | 0       |
| rl.epsilon / epsilon_high (null = epsilon)   | epsilon / epsilon_high            | 0.2 / None |
| rl.scale_rewards=true (divide by group std)  | scale_rewards                     | "group" |
| token-level loss over the step (DAPO-style)  | loss_type                         | "dapo"  |
| trainer.learning_rate, lr_scheduler_type     | learning_rate, lr_scheduler_type  | 1e-3, linear |
| trainer.warmup_steps, weight_decay           | warmup_steps, weight_decay        | 0, 0    |
| trainer.max_grad_norm                        | max_grad_norm                     | 1.0     |
| trainer.adam_beta1/2, adam_epsilon           | adam_beta1/2, adam_epsilon        | defaults |
| model.finetune=full, float32                 | (plain model, no peft_config), bf16=fp16=False | |
| backend.gradient_checkpointing=false         | gradient_checkpointing            | False   |
| producer.shuffle                             | shuffle_dataset                   | True    |
| seed                                         | seed                              | --seeds |
| checkpoint.every_steps=0, no TensorBoard     | save_strategy="no", report_to="none" | |
| logging.every_steps=1                        | logging_steps=1, log_completions=False | |
| special tokens but EOS masked (sampling and  | a frozen -1e9 bias on those rows  | same ids |
| training)                                    | of lm_head                        |         |

TRL's own options suppress tokens at generation only, and its fused training head reads
lm_head's weight and bias directly (a forward hook never runs in training): the bias
masks both, as art_hydra does, so the two learn alike.

TRL tokenizes the plain-text prompts itself (the tiny tokenizer has no chat template)
and decodes completions without special tokens before the reward, as art_hydra does.

Usage: python bench/vs_trl.py [--steps 300] [--pairs 3] [--seeds 0,1,2] [--load 0]
[--art KEY=VALUE ...] [--baseline DIR]

``--baseline DIR`` adds a third side, art_hydra imported from another checkout (before
and after a change: ``git worktree add ../before <commit>`` then
``--baseline ../before``), interleaved with the other two.
(needs the ``bench`` extra: pip install -e '.[bench]').
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runs import QUIET, TARGET, WINDOW, step_reaching_target

#: Steps skipped before steady-state figures (allocation, caches, first compiles).
WARM_SHARE = 0.2


# ---- the identical work --------------------------------------------------------------


def prepare(folder: Path) -> tuple[Path, Path]:
    """Save art_hydra's default tiny model and 2,000 reverse examples for both sides."""
    from art_hydra import compose
    from art_hydra.engine.backends import load_model
    from art_hydra.tasks import build_task

    cfg = compose(["logging.progress_bar=off"])
    task = build_task(cfg)
    loaded = load_model(cfg.model, cfg.backend, cfg.seed, charset=task.charset())
    model_dir = folder / "model"
    loaded.model.save_pretrained(model_dir)
    loaded.tokenizer.save_pretrained(model_dir)
    data = folder / "reverse.jsonl"
    with data.open("w") as out:
        for ex in task.examples:
            out.write(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n")
    return model_dir, data


def art_overrides(model_dir: Path, data: Path, steps: int, seed: int) -> list[str]:
    return [
        "model.source=pretrained",
        f"model.name={model_dir}",
        "task=jsonl",
        f"task.path={data}",
        "task.reward._target_=art_hydra.tasks.rewards.char_overlap",
        "rl.max_prompt_length=16",
        "rl.max_completion_length=8",
        f"trainer.max_steps={steps}",
        f"seed={seed}",
        *QUIET,
        "producer.log_completions=0",
    ]


# ---- the children ------------------------------------------------------------------


def _art_child(args: argparse.Namespace, out: Path) -> None:
    """One art_hydra run in this process, stamped as each step's metrics are logged (the
    counterpart of TRL's ``on_step_end`` callback)."""
    from art_hydra import compose, train
    from art_hydra.engine.metrics import MetricsLog

    run_dir = out.parent / "art_run"
    stamps: list[tuple[int, float, float]] = []
    log = MetricsLog.log

    def stamped(self: MetricsLog, record: dict[str, Any]) -> None:
        stamps.append((record["step"], time.perf_counter(), time.process_time()))
        log(self, record)

    MetricsLog.log = stamped  # type: ignore[method-assign]
    overrides = art_overrides(Path(args.model), Path(args.data), args.steps, args.seed)
    cfg = compose([*overrides, *args.art])
    train(cfg, run_dir=run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out.write_text(
        json.dumps(
            {
                "stamps": stamps,
                "rewards": [r["reward_mean"] for r in rows],
                "tokens": [r["tokens_per_s"] * r["step_time_s"] for r in rows],
            }
        )
    )


def _trl_child(args: argparse.Namespace, out: Path) -> None:
    """One TRL GRPOTrainer run in this process, stamped at each optimizer step's end."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from art_hydra.engine.rl.sampling import suppressed_ids
    from art_hydra.tasks.rewards import char_overlap

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    # The same tokens art_hydra masks, in sampling and in training: a frozen bias of -1e9
    # on their rows of the head. TRL 1.16 computes training logprobs with a fused head
    # that reads lm_head.weight and .bias directly, so a forward hook on lm_head (or
    # generation's suppress_tokens) would mask sampling only.
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight
    bias = torch.zeros(head.out_features, dtype=head.weight.dtype)
    bias[list(suppressed_ids(tokenizer))] = -1e9  # finite: 0 * logp stays 0 in entropies
    biased.bias = torch.nn.Parameter(bias, requires_grad=False)
    model.set_output_embeddings(biased)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    dataset = Dataset.from_list(rows)

    def reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list:
        return [char_overlap(p, c, a) for p, c, a in zip(prompts, completions, answer, strict=True)]

    config = GRPOConfig(
        output_dir=str(out.parent / "trl_run"),
        per_device_train_batch_size=128,
        gradient_accumulation_steps=1,
        num_generations=8,
        max_completion_length=8,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        num_iterations=1,
        scale_rewards="group",
        loss_type="dapo",
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_steps=args.steps,
        seed=args.seed,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=not torch.cuda.is_available(),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        log_completions=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    stamps: list[tuple[int, float, float]] = []
    rewards: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            stamps.append((state.global_step, time.perf_counter(), time.process_time()))

        def on_log(self, targs: Any, state: Any, control: Any, logs: Any = None, **kw: Any):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Stamp()],
    )
    trainer.train()
    out.write_text(json.dumps({"stamps": stamps, "rewards": rewards, "tokens": []}))


# ---- the parent ----------------------------------------------------------------------


def run_side(side: str, args: argparse.Namespace, seed: int, work: Path) -> dict[str, Any]:
    """One run of ``side`` in a fresh process; its figures. The ``baseline`` side is
    art_hydra imported from ``--baseline`` (another checkout)."""
    env = dict(os.environ)
    if side == "baseline":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.baseline, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        out = Path(tmp) / "result.json"
        child = "trl" if side == "trl" else "art"
        cmd = [sys.executable, __file__, "--child", child, "--out", str(out)]
        cmd += ["--model", args.model, "--data", args.data]
        cmd += ["--steps", str(args.steps), "--seed", str(seed)]
        cmd += [f"--art={override}" for override in args.art]
        log = Path(tmp) / "stderr.txt"
        started = time.perf_counter()
        with log.open("wb") as err_file:  # a file, not a pipe: wait4 cannot block on it
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, env=env)
            _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err = log.read_text(errors="replace")
            raise SystemExit(f"{side} failed ({proc.returncode}):\n{err[-4000:]}")
        data = json.loads(out.read_text())
    return figures(data, started, wall, usage.ru_maxrss / 1024)


def figures(data: dict[str, Any], started: float, wall: float, peak_mb: float) -> dict[str, Any]:
    """Steady figures past the first steps; ``started`` is the parent's clock at the
    child's start (perf_counter is the system's monotonic clock, shared by processes)."""
    stamps = data["stamps"]
    first = max(1, int(len(stamps) * WARM_SHARE))
    (s0, t0, c0), (s1, t1, c1) = stamps[first - 1], stamps[-1]
    rewards = data["rewards"]
    hit = step_reaching_target(rewards)
    at = {s: t for s, t, _ in stamps}
    tokens = data["tokens"][s0:s1]  # the steps after s0, up to s1: the timed window
    return {
        "steps_per_s": (s1 - s0) / (t1 - t0),
        "tokens_per_s": sum(tokens) / (t1 - t0) if tokens else None,
        "cpu_s_per_step": (c1 - c0) / (s1 - s0),
        "target_step": hit,
        "target_s": (at[hit] - started) if hit in at else None,
        "final_reward": sum(rewards[-10:]) / len(rewards[-10:]) if rewards else None,
        "peak_mb": peak_mb,
        "wall_s": wall,
    }


def _summary(values: list[Any], fmt: str) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return format(values[0], fmt)
    med = statistics.median(values)
    return f"{format(med, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


ROWS = [
    ("steady optimizer steps/s", "steps_per_s", ".2f"),
    ("trained tokens/s", "tokens_per_s", ",.0f"),
    (f"step reaching reward {TARGET} ({WINDOW}-step mean)", "target_step", ".0f"),
    ("seconds to that step (from start)", "target_s", ".1f"),
    ("mean reward, last 10 steps", "final_reward", ".3f"),
    ("CPU seconds per steady step", "cpu_s_per_step", ".3f"),
    ("peak resident memory (MB)", "peak_mb", ",.0f"),
    ("wall seconds per run", "wall_s", ".1f"),
]


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    import torch
    import transformers
    import trl

    print(
        f"machine: {os.cpu_count()} cpu cores, "
        f"{'cuda ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}"
    )
    print(
        f"work: {args.steps} steps x 128 completions (16 x 8), 8 new tokens, "
        f"{args.pairs} pair(s), seeds {args.seeds}, {args.load} CPU burner(s) beside"
        + (f"; art_hydra with {' '.join(args.art)}" if args.art else "")
    )
    print(f"{'':46} {'art_hydra':>24} {'TRL':>24} {'ratio':>8}")
    for label, key, fmt in ROWS:
        a = [r[key] for r in results["art"]]
        t = [r[key] for r in results["trl"]]
        am = [v for v in a if v is not None]
        tm = [v for v in t if v is not None]
        ratio = (
            f"{statistics.median(am) / statistics.median(tm):.2f}x"
            if am and tm and statistics.median(tm)
            else "-"
        )
        print(f"{label:46} {_summary(a, fmt):>24} {_summary(t, fmt):>24} {ratio:>8}")


def report_baseline(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    print(f"\nbaseline: art_hydra from {args.baseline}, interleaved with the two sides above")
    print(f"{'':46} {'baseline':>24} {'baseline / TRL':>16} {'art_hydra / baseline':>22}")
    for label, key, fmt in ROWS:
        b = [r[key] for r in results["baseline"] if r[key] is not None]
        a = [r[key] for r in results["art"] if r[key] is not None]
        t = [r[key] for r in results["trl"] if r[key] is not None]
        vs_trl = f"{statistics.median(b) / statistics.median(t):.2f}x" if b and t else "-"
        vs_base = f"{statistics.median(a) / statistics.median(b):.2f}x" if a and b else "-"
        print(f"{label:46} {_summary(b, fmt):>24} {vs_trl:>16} {vs_base:>22}")


#: The earliest TRL can refuse 12 completions in groups of 8: building its config.
TRL_REJECT = """
import tempfile
from trl import GRPOConfig
GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=12, num_generations=8)
"""


def rejection(repeats: int) -> tuple[float, float]:
    """Median seconds from the command to the refusal of a config whose batch does not
    split into whole groups (12 completions, groups of 8): art-hydra vs TRL."""
    art_cmd = [str(Path(sys.executable).with_name("art-hydra"))]
    art_cmd.append("trainer.per_device_train_batch_size=12")
    sides: dict[str, list[float]] = {"art": [], "trl": []}
    for _ in range(repeats):
        for side, cmd in (("art", art_cmd), ("trl", [sys.executable, "-c", TRL_REJECT])):
            started = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            sides[side].append(time.perf_counter() - started)
            if proc.returncode == 0:
                raise SystemExit(f"{side} accepted a batch of 12 in groups of 8")
    return statistics.median(sides["art"]), statistics.median(sides["trl"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--load", type=int, default=0, help="CPU-burning processes beside")
    parser.add_argument(
        "--art",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for art_hydra's side (repeatable), e.g. backend.cpu_threads=1",
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also run art_hydra from this checkout (e.g. a git worktree of an older "
        "commit), interleaved, and print its figures and ratios",
    )
    parser.add_argument("--child", choices=["art", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        (_art_child if args.child == "art" else _trl_child)(args, Path(args.out))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)
    ]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            model_dir, data = prepare(work)
            args.model, args.data = str(model_dir), str(data)
            results: dict[str, list[dict[str, Any]]] = {"art": [], "trl": [], "baseline": []}
            sides = ("art", "trl", "baseline") if args.baseline else ("art", "trl")
            for i in range(args.pairs):
                seed = seeds[i % len(seeds)]
                order = sides if i % 2 == 0 else sides[::-1]
                for side in order:
                    results[side].append(run_side(side, args, seed, work))
                    r = results[side][-1]
                    print(
                        f"pair {i + 1} seed {seed} {side}: {r['steps_per_s']:.2f} steps/s, "
                        f"target at step {r['target_step']}, {r['wall_s']:.1f} s",
                        flush=True,
                    )
        art_s, trl_s = rejection(5)
    finally:
        for b in burners:
            b.kill()
    report(results, args)
    print(
        f"{'refusing a batch of 12 in groups of 8 (s)':46} {art_s:>24.2f} {trl_s:>24.2f} "
        f"{art_s / trl_s:>7.2f}x"
    )
    if args.baseline:
        report_baseline(results, args)


if __name__ == "__main__":
    main()
