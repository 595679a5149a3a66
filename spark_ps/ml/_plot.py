"""``summary.plot()``: a training summary's objective history (and ROC) as a matplotlib Figure.

matplotlib is optional (the ``[plot]`` extra). The Figure is made without ``pyplot``, so no
backend is chosen and no global figure is left behind: a notebook shows the returned
Figure, a script saves it (``fig.savefig("fit.png")``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["plot_summary", "PlotsHistory"]


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            "summary.plot() draws with matplotlib, which is not installed: "
            "pip install 'spark-ps[plot]'"
        ) from e
    return Figure


def plot_summary(summary: Any, roc: bool = True, ax: Any = None) -> Any:
    """Draw `summary`'s ``objectiveHistory`` (x: iteration, 0 the initial point) and, when
    `roc` and the summary has one (binary classification), its ROC curve beside it.

    With `ax` (a matplotlib Axes) only the history is drawn, into it. Returns the Figure.
    """
    history = list(summary.objectiveHistory)
    if ax is not None:
        _history(ax, history)
        return ax.figure
    Figure = _figure_class()
    points = _roc_points(summary) if roc else None
    fig = Figure(figsize=(10 if points else 5, 4), layout="constrained")
    axes = fig.subplots(1, 2 if points else 1, squeeze=False)[0]
    _history(axes[0], history)
    if points:
        fpr, tpr = points
        auc = summary.areaUnderROC
        axes[1].plot(fpr, tpr, color="C1", label=f"AUC {auc:.4f}")
        axes[1].plot([0, 1], [0, 1], color="0.7", linestyle="--", linewidth=1)
        axes[1].set(
            xlabel="false positive rate", ylabel="true positive rate", title="ROC (training)"
        )
        axes[1].set_aspect("equal")
        axes[1].legend(loc="lower right")
    return fig


def _history(ax: Any, history: list[float]) -> None:
    ax.plot(range(len(history)), history, marker="o", markersize=3, color="C0")
    ax.set(xlabel="iteration", ylabel="objective", title="objective history")
    ax.grid(True, alpha=0.3)


def _roc_points(summary: Any) -> tuple[list[float], list[float]] | None:
    """The summary's ROC points (MLlib's, at most ~100 bins: small), or None without one."""
    roc = getattr(summary, "roc", None)
    if roc is None:
        return None
    rows = roc.collect()
    return [r["FPR"] for r in rows], [r["TPR"] for r in rows]


class PlotsHistory:
    """``plot()`` for a training summary with an ``objectiveHistory`` (spark-ps only)."""

    def plot(self, roc: bool = True, ax: Any = None) -> Any:
        """A matplotlib Figure of `objectiveHistory` and, for a binary classifier, its
        training ROC beside it (`roc`); with `ax`, the history drawn into that Axes.

        Needs matplotlib (``pip install 'spark-ps[plot]'``)."""
        return plot_summary(self, roc=roc, ax=ax)
