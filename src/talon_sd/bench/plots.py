"""PNG plots of a results document (small files, fit for docs/BENCHMARKS.md).

* ``speedup.png``     speedup over ``ar`` per dataset, one bar per method
* ``tree_shape.png``  per tree method: mean layer width by depth (top) and the distribution of the
                      tree depth per step (bottom), one line per dataset: deep-and-narrow trees have
                      long flat width curves, shallow-and-wide ones short tall curves
* ``mat_delta.png``   MAT against delta, one point per dataset x method (speedup grows up and left)
* ``sweep.png``       (sweeps) speedup against the budget N, one panel per dataset, one line per
                      method configuration
* ``budgets.png``     (online budgets) the budget N the controller chose at every step of the first
                      generation of each dataset, one panel per ``auto`` method

Only the results dict is read, so plots can be redrawn from a saved ``results.json``.
"""

from __future__ import annotations

import pathlib
from collections import defaultdict
from typing import Sequence

from .results import ALL

DPI = 90
TREE_METHODS = ("chain", "static", "eagle", "talon")
MARKERS = {"ar": "o", "hf": "x", "hf-assisted": "+", "chain": "^", "static": "s", "eagle": "D", "talon": "*",
           "llamacpp": "v", "llamacpp-lookup": "<"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as pyplot

    return pyplot


def _datasets(rows: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(r["dataset"] for r in rows))


def plot_speedup(results: dict, path: pathlib.Path) -> pathlib.Path:
    """Grouped bars: speedup over ar per dataset and method (ar itself is the 1.0 line)."""
    plt = _pyplot()
    rows = [r for r in results["summary"] if r["method"] != "ar" and r["speedup"] is not None]
    datasets = _datasets(results["summary"])
    labels = list(dict.fromkeys(r["label"] for r in rows))
    index = {(r["dataset"], r["label"]): r["speedup"] for r in rows}
    figure, axis = plt.subplots(figsize=(max(6.0, 1.1 * len(datasets) + 2), 3.4))
    width = 0.8 / max(len(labels), 1)
    for position, label in enumerate(labels):
        xs = [i + (position - (len(labels) - 1) / 2) * width for i in range(len(datasets))]
        axis.bar(xs, [index.get((d, label), 0.0) for d in datasets], width, label=label)
    axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axis.set_xticks(range(len(datasets)), datasets)
    axis.set_ylabel("speedup over ar")
    axis.set_title("Speedup per dataset (tokens/s ratio)", fontsize=10)
    axis.legend(fontsize=7, ncol=min(len(labels), 4), loc="upper left", frameon=False)
    axis.set_ylim(0, max([1.3] + [v * 1.35 for v in index.values()]))
    return _save(figure, path)


def plot_tree_shape(results: dict, path: pathlib.Path) -> pathlib.Path | None:
    """Per tree method: width by depth and depth distribution, one line per dataset."""
    rows = [r for r in results["summary"] if r["method"] in TREE_METHODS and r.get("mean_layer_width")]
    if not rows:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    labels = list(dict.fromkeys(r["label"] for r in rows))
    figure, axes = plt.subplots(2, len(labels), figsize=(2.8 * len(labels) + 0.6, 5.0), squeeze=False)
    for column, label in enumerate(labels):
        top, bottom = axes[0][column], axes[1][column]
        for row in (r for r in rows if r["label"] == label):
            style = {"linestyle": "--" if row["dataset"] == ALL else "-", "marker": ".", "label": row["dataset"]}
            widths = row["mean_layer_width"][1:]
            top.plot(range(1, len(widths) + 1), widths, **style)
            histogram = {int(d): n for d, n in row["tree_depth_hist"].items()}
            total = sum(histogram.values()) or 1
            depths = range(0, max(histogram) + 1)
            bottom.plot(list(depths), [histogram.get(d, 0) / total for d in depths], **style)
        top.set_ylim(bottom=0)
        top.set_title(label, fontsize=9)
        top.set_xlabel("depth", fontsize=8)
        bottom.set_xlabel("tree depth per step", fontsize=8)
        if column == 0:
            top.set_ylabel("mean width (nodes)", fontsize=8)
            bottom.set_ylabel("share of steps", fontsize=8)
        for axis in (top, bottom):
            axis.tick_params(labelsize=7)
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][-1].legend(fontsize=6, frameon=False)
    figure.suptitle("Tree shape: width by depth, and depth distribution", fontsize=10)
    return _save(figure, path)


def plot_mat_delta(results: dict, path: pathlib.Path) -> pathlib.Path | None:
    """MAT against delta, one point per dataset x method of our loop."""
    rows = [r for r in results["summary"] if r["mat"] is not None and r["dataset"] != ALL]
    if not rows:
        return None
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5.2, 3.6))
    for label in dict.fromkeys(r["label"] for r in rows):
        group = [r for r in rows if r["label"] == label]
        axis.scatter([r["delta"] for r in group], [r["mat"] for r in group], label=label, s=22,
                     marker=MARKERS.get(group[0]["method"], "o"))
        for r in group:
            axis.annotate(r["dataset"], (r["delta"], r["mat"]), fontsize=6, xytext=(3, 2), textcoords="offset points")
    axis.set_xlabel("delta (draft forwards per verify)")
    axis.set_ylabel("MAT (tokens per verify)")
    axis.set_title("MAT vs delta", fontsize=10)
    axis.legend(fontsize=7, frameon=False)
    return _save(figure, path)


def plot_sweep(results: dict, path: pathlib.Path) -> pathlib.Path | None:
    """Speedup against the budget N, one panel per dataset, one line per (method, other options)."""
    trees = {v["label"]: v["tree"] for v in results["variants"] if v.get("tree") and v["method"] != "ar"}
    rows = [r for r in results["summary"] if r["label"] in trees and r["speedup"] is not None]
    if not rows:
        return None
    plt = _pyplot()
    datasets = _datasets(rows)
    columns = min(len(datasets), 4)
    lines_of = (len(datasets) + columns - 1) // columns
    figure, axes = plt.subplots(lines_of, columns, figsize=(3.3 * columns, 2.8 * lines_of), squeeze=False)
    for number, dataset in enumerate(datasets):
        axis = axes[number // columns][number % columns]
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        online: dict[str, float] = {}  # budget 'auto': one horizontal line per series
        for row in (r for r in rows if r["dataset"] == dataset):
            tree = trees[row["label"]]
            if tree["budget"] == "auto":
                online[_series_name(tree)] = row["speedup"]
            else:
                series[_series_name(tree)].append((tree["budget"], row["speedup"]))
        for name, points in series.items():
            points.sort()
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name)
        for name, speedup in online.items():
            axis.axhline(speedup, linewidth=1.2, linestyle=":", color="tab:red", label=f"{name} N=auto")
        axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        axis.set_title(dataset, fontsize=9)
        axis.set_xlabel("budget N (tree nodes)", fontsize=8)
        axis.set_ylabel("speedup over ar", fontsize=8)
        axis.tick_params(labelsize=7)
    for number in range(len(datasets), lines_of * columns):
        axes[number // columns][number % columns].axis("off")
    axes[0][0].legend(fontsize=6, frameon=False)
    figure.suptitle("Speedup against budget", fontsize=10)
    return _save(figure, path)


def _series_name(tree: dict) -> str:
    if tree["method"] == "talon":
        return f"talon K={tree['topk']} mu={tree['mu']:g}"
    if tree["method"] == "eagle":
        return f"eagle K={tree['topk']} D={tree['depth']}"
    return tree["method"]


def _save(figure, path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path


def plot_budgets(results: dict, path: pathlib.Path) -> pathlib.Path | None:
    """N chosen per step over the first generation of each dataset, per variant whose budget varied;
    trial steps (the controller's reason ``trial``) are marked with dots."""
    traces: dict[str, dict[str, tuple[list[int], list[str]]]] = defaultdict(dict)
    for sample in results.get("samples", []):
        stats = sample.get("stats") or {}
        budgets = stats.get("budgets") or []
        if budgets and sample["dataset"] not in traces[sample["label"]]:
            traces[sample["label"]][sample["dataset"]] = (budgets, stats.get("reasons") or [])
    if not traces:
        return None
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(len(traces), 1, figsize=(7.5, 2.6 * len(traces)), squeeze=False)
    for axis, (label, by_dataset) in zip(axes[:, 0], traces.items()):
        for dataset, (budgets, reasons) in by_dataset.items():
            line, = axis.step(range(len(budgets)), budgets, where="post", label=dataset, linewidth=1.2)
            trials = [step for step, reason in enumerate(reasons) if reason == "trial"]
            axis.scatter(trials, [budgets[step] for step in trials], s=6, color=line.get_color())
        axis.set_yscale("log", base=2)
        axis.set_ylabel("budget N")
        axis.set_title(f"{label}: N chosen per verify step (first generation per dataset)", fontsize=9)
        axis.legend(fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("verify step")
    return _save(figure, path)


def write_bench_plots(results: dict, plots_dir: pathlib.Path) -> list[pathlib.Path]:
    """Every bench plot that has data; returns the files written."""
    made = [plot_speedup(results, plots_dir / "speedup.png"),
            plot_tree_shape(results, plots_dir / "tree_shape.png"),
            plot_mat_delta(results, plots_dir / "mat_delta.png"),
            plot_budgets(results, plots_dir / "budgets.png")]
    return [path for path in made if path is not None]
