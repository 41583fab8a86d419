"""PNG plots for benchmarks and reports, drawn with matplotlib's file-only backend (no display)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def line_plot(
    series: Mapping[str, Sequence[tuple[float, float]]],
    path: str | Path,
    title: str,
    xlabel: str,
    ylabel: str,
    hline: float | None = None,
    hline_label: str = "",
) -> Path:
    """One line per series of (x, y) points, with markers, a legend, and an optional target
    line; written to ``path`` (PNG). Empty series are listed in the legend as "(no points)"."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, points in series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=name)
        else:
            ax.plot([], [], label=f"{name} (no points)")
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1, label=hline_label or None)
    _integer_ticks(ax, [x for points in series.values() for x, _ in points])
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def bar_plot(
    bars: Mapping[str, float], path: str | Path, title: str, xlabel: str, ylabel: str
) -> Path:
    """One bar per key, in the given order, each labelled with its value."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    labels, values = list(bars), list(bars.values())
    drawn = ax.bar(range(len(labels)), values, color="tab:blue", tick_label=labels)
    ax.bar_label(drawn, fmt="%g", fontsize="small")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def stacked_bars(
    x: Sequence[float],
    parts: Mapping[str, Sequence[float]],
    path: str | Path,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path:
    """Bars at ``x``, each stacked from ``parts`` (name -> one value per bar), with a legend.
    Past ``MAX_BARS`` bars, each drawn bar is the mean of consecutive ones (``bin_bars``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    _integer_ticks(ax, x)
    width = 0.8
    if len(x) > MAX_BARS:
        x, parts, size = bin_bars(x, parts, MAX_BARS)
        ylabel = f"{ylabel}, mean of {size} bars"
        width = 0.8 * (x[-1] - x[0]) / (len(x) - 1)  # of the space between two drawn bars
    bottom = [0.0] * len(x)
    for name, values in parts.items():
        ax.bar(x, values, bottom=bottom, label=name, width=width)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


MAX_BARS = 200
"""Bars one plot draws at most: a long run has tens of thousands of syncs, and a bar each
would cost matplotlib minutes (ten thousand syncs: ~80 s) to draw what no one can tell
apart."""


def bin_bars(
    x: Sequence[float], parts: Mapping[str, Sequence[float]], most: int
) -> tuple[list[float], dict[str, list[float]], int]:
    """At most ``most`` bars: runs of ``size`` consecutive ones (the last may be shorter),
    each at its mean x with the mean of each part; returns the bars, parts and ``size``."""
    size = -(-len(x) // most)
    chunks = [range(i, min(i + size, len(x))) for i in range(0, len(x), size)]
    xs = [sum(x[j] for j in c) / len(c) for c in chunks]
    means = {name: [sum(v[j] for j in c) / len(c) for c in chunks] for name, v in parts.items()}
    return xs, means, size


def _integer_ticks(ax, xs: Sequence[float]) -> None:
    """Whole-number x values (steps, weight versions) get whole-number ticks: a version
    axis read 2.5 otherwise."""
    from matplotlib.ticker import MaxNLocator

    if xs and all(float(x).is_integer() for x in xs):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
