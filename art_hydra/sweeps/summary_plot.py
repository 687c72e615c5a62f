"""A sweep's comparison plot, ``summary.png`` beside ``summary.md``: the objective of
each point (its mean as a bar, every seed as a dot, so the spread shows whether a
difference is more than noise) and the reward curves of the top jobs (whether the
winner is still climbing or got lucky on its last step).

matplotlib is imported here only, with the Agg backend (no display), so reading a
sweep's records never pays for it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

#: Points drawn in the objective panel (the best ones; the rest are in the tables).
MAX_POINTS_DRAWN = 30
#: Jobs whose curves are drawn.
TOP_CURVES = 5
#: Longest point label on the axis.
_LABEL_CHARS = 40


def _short(text: str) -> str:
    return text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 3] + "..."


def _objective_panel(ax: Any, points: list[Any], metric: str) -> None:
    """One bar per point at its mean over seeds, its jobs as dots over it."""
    shown = points[:MAX_POINTS_DRAWN]
    for x, point in enumerate(shown):
        mean, std, _ = point.stats("objective")
        if mean is not None:
            ax.bar(x, mean, color="#9ecae1", yerr=std or 0.0, capsize=3)
        values = [j.objective for j in point.jobs if j.objective is not None]
        ax.scatter([x] * len(values), values, color="#08519c", s=14, zorder=3)
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels([_short(p.label()) for p in shown], rotation=30, ha="right", fontsize=7)
    title = f"{metric} per point (bar: mean over seeds, dots: jobs)"
    if len(points) > len(shown):
        title += f"; best {len(shown)} of {len(points)}"
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(metric)
    ax.grid(axis="y", alpha=0.3)


def _curve_panel(ax: Any, jobs: list[Any], key: str) -> None:
    """``key`` against step for the top jobs, labelled by number and swept values."""
    drawn = 0
    for job in jobs[:TOP_CURVES]:
        curve = [(s, v) for s, v in job.curve if v is not None]
        if curve:
            steps, values = zip(*curve, strict=True)
            ax.plot(
                steps,
                values,
                marker="." if len(steps) < 20 else None,
                label=_short(f"{job.label} {job.point_label}"),
            )
            drawn += 1
    ax.set_title(f"{key} of the top {drawn} job(s)", fontsize=9)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="best")


def render(points: list[Any], ranked: list[Any], metric: str, curve_key: str) -> bytes:
    """The PNG's bytes: the objective per point, and the top jobs' curves of
    ``curve_key``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    try:
        _objective_panel(left, points, metric)
        _curve_panel(right, ranked, curve_key)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    return buffer.getvalue()


def write_plot(path: Path, points: list[Any], ranked: list[Any], metric: str, key: str) -> Path:
    """Render the plot and write it at ``path`` atomically (never through a link)."""
    from art_hydra.runs.run_folder import write_atomic

    write_atomic(path, render(points, ranked, metric, key))
    return path
