"""The names of what a run keeps in its folder, each written here once.

The run folder's lock and manifests (:mod:`art_hydra.runs.run_folder`), the checkpoint
writer (:mod:`art_hydra.runs.checkpoint`), the metrics writer, the run's own cleanup and the
``checkpoint.dir`` check (which must not point into one of these) all name the same
files; they import the names from this module so a renamed or added file is changed in
one place. Plain strings, no imports: it sits in the config layer, on the compose path.
"""

from __future__ import annotations

#: The resolved config the run started with (updated by each accepted resume).
RUN_CONFIG = "run_config.yaml"
#: One line per accepted resume: when, from which step, what changed.
RESUMES = "resumes.jsonl"
#: One line per logged optimizer step.
METRICS = "metrics.jsonl"
#: Example completions per step (producer.log_completions).
COMPLETIONS = "completions.jsonl"
#: The evaluation's completions per evaluation (eval.log_completions).
EVAL_COMPLETIONS = "eval_completions.jsonl"
#: The data, reward and model the run began on (:mod:`art_hydra.runs.run_identity`).
IDENTITY = "run_identity.json"
#: TensorBoard's event folder.
TENSORBOARD = "tensorboard"
#: The other trackers' folders (W&B, MLflow, Trackio) and their resume ids.
TRACKERS = "trackers"
#: The curves drawn at the end of a run (RL: reward, SFT: loss).
REWARD_PLOT = "reward.png"
LOSS_PLOT = "loss.png"
PLOTS = (REWARD_PLOT, LOSS_PLOT)
#: The job's outcome (running, done, failed, interrupted, refused) and objective.
RESULT = "result.json"
#: The folder the end-of-run message suggests ``art-hydra export`` writes (a standalone
#: ``from_pretrained`` model), and the leftovers a stopped export may leave beside it.
EXPORT = "export"
EXPORT_LEFTOVERS = (f".{EXPORT}.tmp-*", f".{EXPORT}.old-*")
#: A sweep's ranked summary of its jobs, written into the sweep folder.
SWEEP_SUMMARY = ("summary.csv", "summary.md", "summary_grouped.csv", "summary.png")
#: The lock a sweep's parent process holds on its sweep folder while it runs: a second
#: sweep into the same folder is refused instead of sharing its job folders.
SWEEP_LOCK = ".sweep.lock"
#: The run folder's list of the entries its runs made there (JSON, written atomically):
#: the only entries a run ever deletes or replaces; everything else in the folder is
#: left alone.
RUN_MANIFEST = "run_manifest.json"
#: The lock a training run holds on its folder.
LOCK = "run.lock"
#: Each rank's status file, read by the others when a collective stalls.
RANKS = ".ranks"
#: Hydra's record of a job, written by Hydra itself into ``hydra.output_subdir``.
HYDRA_RECORD = ".hydra"
#: Where Hydra writes a job's record until the job holds the run folder's lock
#: (``hydra.output_subdir`` in conf/config.yaml): a job refused for a busy
#: folder then never touches the ``.hydra/`` of the run that holds it.
PENDING_PREFIX = ".hydra-pending-"
#: A sweep's own files, where a job's folder is the sweep folder (hydra.sweep.subdir='').
SWEEP_FILES = (
    "multirun.yaml",
    ".submitit",
    "optimization_results.yaml",
    SWEEP_LOCK,
    *SWEEP_SUMMARY,
    *(f".{name}.*.tmp" for name in SWEEP_SUMMARY),
)

#: A checkpoint folder is ``step-<n>`` (n >= 0, at least 6 digits).
CHECKPOINT_PREFIX = "step-"
#: A checkpoint's list of its files and their SHA-256 sums, written last.
MANIFEST = "manifest.json"
#: The checkpoint's optimizer, scheduler, RNG and step state.
STATE_DIR = "trainer_state"


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint of ``step`` (``step-000050``)."""
    return f"{CHECKPOINT_PREFIX}{step:06d}"
