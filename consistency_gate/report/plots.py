"""PNG figures of a gate run (matplotlib, no display needed)."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def literal(values: object) -> list[str]:
    r"""Labels as matplotlib must show them: as written, never as math (a class named ``$\alpha$``
    is drawn as those characters, and ``$\foo$`` does not stop the figure with a mathtext error); a
    control character, which no font draws (matplotlib warns per glyph), as its escape.

    >>> literal(["cat", "$x$", "a\x07b"])
    ['cat', '\\$x\\$', 'a\\x07b']
    """
    return [_CONTROL.sub(lambda m: repr(m.group())[1:-1], str(v)).replace("$", r"\$") for v in values]


def flips_per_class(samples: pd.DataFrame, top: int = 20) -> Figure:
    """Negative (CtoI) and positive (ItoC) flips per true class, the `top` classes with most flips.

    >>> samples = pd.DataFrame({"label": ["a", "a", "b"], "flip": ["CtoI", "ItoC", "CtoC"]})
    >>> flips_per_class(samples).axes[0].get_title()
    'Flips per true class (top 2 by flips)'
    """
    counts = pd.crosstab(samples["label"], samples["flip"]).reindex(columns=["CtoI", "ItoC"], fill_value=0)
    counts = counts.loc[counts.sum(axis=1).sort_values(ascending=False).index[:top]]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(counts) + 2), 4))
    x = np.arange(len(counts))
    ax.bar(x - 0.2, counts["CtoI"], width=0.4, color="#c0392b", label="CtoI (negative flip)")
    ax.bar(x + 0.2, counts["ItoC"], width=0.4, color="#27ae60", label="ItoC (positive flip)")
    ax.set_xticks(x, literal(counts.index), rotation=45, ha="right")
    ax.set_ylabel("samples")
    ax.set_title(f"Flips per true class (top {len(counts)} by flips)")
    ax.legend()
    fig.tight_layout()
    return fig


def correctness_matrix(ctoc: int, ctoi: int, itoc: int, itoi: int) -> Figure:
    """The 2x2 table: previous correct/wrong (rows) x candidate correct/wrong (columns).

    >>> correctness_matrix(540, 12, 20, 28).axes[0].get_title()
    'Correct / wrong: previous vs candidate'
    """
    grid = np.array([[ctoc, ctoi], [itoc, itoi]])
    total = max(int(grid.sum()), 1)
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.imshow(grid, cmap="Blues")
    names = [["CtoC", "CtoI"], ["ItoC", "ItoI"]]
    for i in range(2):
        for j in range(2):
            color = "white" if grid[i, j] > grid.max() / 2 else "black"
            ax.text(
                j, i, f"{names[i][j]}\n{grid[i, j]}\n{grid[i, j] / total:.1%}", ha="center", va="center", color=color
            )
    ax.set_xticks([0, 1], ["candidate correct", "candidate wrong"])
    ax.set_yticks([0, 1], ["previous correct", "previous wrong"])
    ax.set_title("Correct / wrong: previous vs candidate")
    return fig


def topk_curve(metrics: dict[str, float | None], ks: list[int]) -> Figure:
    """CCON-k and both generations' CACC-k over k.

    >>> metrics = {"ccon@1": 0.95, "ccon@5": 0.99, "cacc_previous@1": 0.9, "cacc_previous@5": 0.98,
    ...            "cacc_candidate@1": 0.91, "cacc_candidate@5": 0.98}
    >>> len(topk_curve(metrics, [1, 5]).axes[0].lines)
    3
    """
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for key, label in (
        ("ccon", "CCON-k (consistency)"),
        ("cacc_previous", "CACC-k previous"),
        ("cacc_candidate", "CACC-k candidate"),
    ):
        pts = [(k, metrics.get(f"{key}@{k}")) for k in ks]
        pts = [(k, v) for k, v in pts if v is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set_xlabel("k")
    ax.set_ylabel("share of samples")
    ax.set_ylim(0, 1.02)
    ax.set_title("Top-k consistency and accuracy")
    ax.legend()
    fig.tight_layout()
    return fig


def disagreement_confidence(names: list[str], probs: np.ndarray) -> Figure:
    """Histogram of each member's top probability on the samples where the members disagree.

    >>> probs = np.array([[[0.9, 0.1], [0.4, 0.6]], [[0.7, 0.3], [0.8, 0.2]]])
    >>> disagreement_confidence(["gen1", "gen2"], probs).axes[0].get_title()
    'Confidence where members disagree (1 samples)'
    """
    preds = probs.argmax(axis=2)
    differ = (preds != preds[0]).any(axis=0)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, p in zip(names, probs, strict=True):
        ax.hist(p[differ].max(axis=1), bins=20, range=(0, 1), alpha=0.5, label=literal([name])[0])
    ax.set_xlabel("top probability on disagreements")
    ax.set_ylabel("samples")
    ax.set_title(f"Confidence where members disagree ({int(differ.sum())} samples)")
    ax.legend()
    fig.tight_layout()
    return fig


def class_disagreement(classes: list[str], probs: np.ndarray, y: np.ndarray, top: int = 20) -> Figure:
    """Share of each true class's samples on which the members disagree, the ``top`` classes ranked.

    >>> probs = np.array([[[0.9, 0.1], [0.4, 0.6]], [[0.7, 0.3], [0.8, 0.2]]])
    >>> class_disagreement(["cat", "dog"], probs, np.array([0, 1])).axes[0].get_title()
    'Disagreement per true class (top 2 of 2)'
    """
    preds = probs.argmax(axis=2)
    differ = (preds != preds[0]).any(axis=0)
    counts = pd.DataFrame({"cls": np.asarray(classes, dtype=object)[y], "differ": differ}).groupby("cls")["differ"]
    rate = counts.mean().sort_values(ascending=False).head(top)
    fig, ax = plt.subplots(figsize=(max(6, 0.4 * len(rate) + 2), 4))
    ax.bar(range(len(rate)), rate.to_numpy(), color="#8e44ad")
    ax.set_xticks(range(len(rate)), literal(rate.index), rotation=45, ha="right")
    ax.set_ylabel("share of samples with disagreement")
    ax.set_title(f"Disagreement per true class (top {len(rate)} of {len(counts)})")
    fig.tight_layout()
    return fig


def diversity_scatter(scatter: dict, metric: str) -> Figure:
    """HQ diversity score (low = diverse) against ensemble accuracy, one dot per candidate team.

    >>> scatter = {"ck": {"hq": [0.1, 0.5, 0.9], "acc": [0.92, 0.9, 0.85], "size": [2, 3, 3]}}
    >>> diversity_scatter(scatter, "ck").axes[0].get_xlabel()
    'HQ-CK (low = diverse)'
    """
    data = scatter[metric]
    fig, ax = plt.subplots(figsize=(6, 4))
    points = ax.scatter(data["hq"], data["acc"], c=data["size"], cmap="viridis", s=12)
    fig.colorbar(points, ax=ax, label="team size")
    ax.set_xlabel(f"HQ-{metric.upper()} (low = diverse)")
    ax.set_ylabel("ensemble accuracy (AVG)")
    ax.set_title("Diversity vs accuracy of candidate teams")
    fig.tight_layout()
    return fig


def history_curve(report: dict) -> Figure:
    """The champions' updates (``consistency-gate history``'s report): negative flips summed over the
    updates, and each new champion's accuracy on the samples it shared with the one before.

    >>> steps = [{"previous": "1", "version": "2", "negative_flips": 3, "accuracy": 0.9},
    ...     {"previous": "2", "version": "3", "negative_flips": 2, "accuracy": 0.91}]
    >>> fig = history_curve({"model": "clf", "steps": steps})
    >>> fig.axes[0].get_title(), [t.get_text() for t in fig.legends[0].get_texts()]
    ('clf: negative flips over its champions', ['cumulative', 'negative flips of the update', 'accuracy'])
    """
    steps = report["steps"]
    labels = literal([f"v{s['previous']}->v{s['version']}" for s in steps])
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(steps) + 3), 3.5))
    x = np.arange(len(steps))
    ax.bar(x, [s["negative_flips"] for s in steps], color="#e6b0aa", label="negative flips of the update")
    ax.plot(x, np.cumsum([s["negative_flips"] for s in steps]), color="#c0392b", marker="o", label="cumulative")
    ax.set_xticks(x, labels, rotation=45, ha="right")
    ax.set_ylabel("samples")
    ax.set_title(f"{literal([report['model']])[0]}: negative flips over its champions")
    accuracy = ax.twinx()
    values = [np.nan if s["accuracy"] is None else s["accuracy"] for s in steps]
    accuracy.plot(x, values, color="#2471a3", marker="s", label="accuracy")
    accuracy.set_ylabel("accuracy of the new champion")
    # one legend for both axes (the accuracy line is on the twin axis), above the plot, never over the bars
    handles = [*ax.get_legend_handles_labels()[0], *accuracy.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="upper center", ncols=3, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def gate_pngs(samples: pd.DataFrame, flip_counts: tuple[int, int, int, int], metrics: dict, ks: list[int]) -> dict:
    """The gate's plots as PNG bytes by file name: flips per class, the 2x2 table, the top-k curve
    (logged under ``gate/plots`` and shown in ``gate/report.html``).

    >>> samples = pd.DataFrame({"label": ["a", "b"], "flip": ["CtoI", "CtoC"]})
    >>> sorted(gate_pngs(samples, (1, 1, 0, 0), {"ccon@1": 0.5}, [1]))
    ['correctness_matrix.png', 'flips_per_class.png', 'topk_curve.png']
    """
    figures = {
        "flips_per_class.png": flips_per_class(samples),
        "correctness_matrix.png": correctness_matrix(*flip_counts),
        "topk_curve.png": topk_curve(metrics, ks),
    }
    return {name: png_bytes(fig) for name, fig in figures.items()}


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """A figure as PNG bytes; the figure is closed.

    >>> png_bytes(correctness_matrix(1, 0, 0, 1))[:4]
    b'\x89PNG'
    """
    import io

    buffer = io.BytesIO()
    # zlib's fastest level: a third less time than its default for a tenth more bytes (a gate draws three)
    fig.savefig(buffer, format="png", dpi=dpi, pil_kwargs={"compress_level": 1})
    plt.close(fig)
    return buffer.getvalue()


def bounds_curve(curves: list[dict], labelled: list[int], decided_at: int | None) -> Figure:
    """A shadow check's rules over the stream: each rule's anytime-valid lower and upper bound after every
    look (by the labels so far) against its threshold, and the look where the stream was decided.

    >>> curves = [{"rule": "ctoi <= 0.02", "threshold": 0.02, "lower": [0.0, 0.004], "upper": [0.06, 0.018]}]
    >>> fig = bounds_curve(curves, [100, 200], 1)
    >>> [ax.get_title() for ax in fig.axes]
    ['ctoi <= 0.02']
    """
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * max(len(curves), 1), 3.2), squeeze=False)
    for ax, curve in zip(axes[0], curves, strict=False):
        ax.fill_between(labelled, curve["lower"], curve["upper"], color="#aed6f1", step="post", label="bounds")
        ax.axhline(curve["threshold"], color="#c0392b", linestyle="--", label="threshold")
        if decided_at is not None:
            ax.axvline(labelled[decided_at], color="#7d3c98", linestyle=":", label="decided")
        ax.set_title(literal([curve["rule"]])[0])
        ax.set_xlabel("labelled requests")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    return fig
