"""An Optuna study's n_trials counts trials that ran: drawn points the pre-flight refuses
are told to the study (worst value), recorded under refused/, replaced by new draws, and
reported at the end; the real CLI with the tiny model's one-step jobs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import output_of

pytestmark = pytest.mark.slow

ONE_STEP = [
    "trainer.max_steps=1",
    "checkpoint.every_steps=0",
    "trainer.per_device_train_batch_size=16",
    "logging.tensorboard=false",
    "logging.plot=false",
    "backend.cpu_threads=1",
]


def test_refused_trials_do_not_count_against_n_trials(cli, tmp_path: Path) -> None:
    """Before, this study (seed 3) trained 3 of its 6 trials: the other 3 were refused
    under job numbers. Now it trains 6, and the refused draws are recorded apart."""
    sweep = tmp_path / "study"
    proc = cli(
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.sampler.seed=3",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.direction=maximize",
        *ONE_STEP,
        # Half the space cannot run: RL with accumulation (the founding rule).
        "trainer.gradient_accumulation_steps=choice(1,2)",
        "rl.temperature=interval(0.7,1.2)",
        f"hydra.sweep.dir={sweep}",
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    jobs = sorted(p for p in sweep.iterdir() if p.name.isdigit())
    assert [p.name for p in jobs] == [str(n) for n in range(6)]
    for job in jobs:
        record = json.loads((job / "result.json").read_text())
        assert record["status"] == "done", record
        assert "trainer.gradient_accumulation_steps=1" in record["overrides"]
    refused = sorted((sweep / "refused").glob("*/result.json"))
    assert refused
    assert [r.parent.name for r in refused] == [str(k) for k in range(len(refused))]
    for path in refused:
        record = json.loads(path.read_text())
        assert record["status"] == "refused" and record["job_num"] is None
        assert "trainer.gradient_accumulation_steps=2" in record["overrides"]
        assert "trainer.gradient_accumulation_steps" in record["reason"]
    assert len(re.findall(r"Trial \d+ of the study was not launched", out)) == len(refused)
    assert (
        f"{len(refused)} drawn trial(s) were refused before launch (recorded under {sweep}/"
        "refused/); they did not count against hydra.sweeper.n_trials=6: 6 trial(s) launched."
    ) in out
    # The study's best is among the trials that ran.
    results = (sweep / "optimization_results.yaml").read_text()
    assert "trainer.gradient_accumulation_steps: 1" in results
    # Named before the study, grouped by problem.
    assert "combination(s) of the search space cannot run" in out
    # Never launched: no Hydra record, no metrics.
    assert not list(sweep.glob("refused/*/.hydra"))
    assert not list(sweep.glob("refused/*/metrics.jsonl"))
    best = re.search(r"Best value: (\S+)", out)
    assert best is not None
    objectives = [json.loads((j / "result.json").read_text())["objective"]["value"] for j in jobs]
    assert float(best.group(1)) == max(objectives)
