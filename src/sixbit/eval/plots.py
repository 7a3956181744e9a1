"""Plots of what the runtime methods did (PNG files; needs matplotlib).

Example:
    >>> conv = sixbit.conversion_of(pipe)                                        # doctest: +SKIP
    >>> pipe("a red circle moving right")                                        # doctest: +SKIP
    >>> sixbit.eval.plots.plot_precision_map(conv.dmpq.report(), "precision.png")   # doctest: +SKIP
    >>> sixbit.eval.plots.plot_skip_map(conv.cache.report(), "skips.png")           # doctest: +SKIP
"""

from __future__ import annotations

from ..methods.delta_cache import DeltaCacheReport
from ..methods.dmpq import DMPQPredictor, DMPQReport
from ..nn.precision import ActMode


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _map(path, grid, colors, n_blocks: int, title: str, vmax: int):
    """A step × block map, one color per value 0…``vmax``."""
    plt = _pyplot()
    from matplotlib.colors import ListedColormap

    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 + 0.35 * n_blocks), max(2.5, 1.2 + 0.25 * len(grid))))
    ax.imshow(grid, cmap=ListedColormap(colors), vmin=0, vmax=vmax, aspect="auto")
    ax.set_xlabel("block")
    ax.set_ylabel("denoising step")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_precision_map(report: DMPQReport, path, branch: str | None = None, title: str = "DMPQ activation precision"):
    """DMPQ's step × block precision map of one run (``branch`` default: the first recorded)."""
    modes = [m.value for m in (ActMode.NVFP4, ActMode.INT8, ActMode.FP)]
    grid = [[modes.index(m) if m in modes else float("nan") for m in row] for row in report.precision_map(branch)]
    return _map(path, grid, ["#2b83ba", "#fdae61", "#d7191c"], len(report.blocks),
                f"{title}\nblue NVFP4 (emulated) · orange INT8 · avg {report.average_bits:.2f} bits", vmax=2)


def plot_skip_map(report: DeltaCacheReport, path, branch: str | None = None, title: str = "delta cache"):
    """The delta cache's step × block map of computed and skipped calls of one run."""
    grid = [[1.0 if d == "skip" else 0.0 for d in row] for row in report.skip_map(branch)]
    return _map(path, grid, ["#fdae61", "#1a9641"], len(report.blocks),
                f"{title}\norange computed · green skipped ({100 * report.skip_share:.0f}% skipped)", vmax=1)


def plot_predictor(predictor: DMPQPredictor, path, title: str = "DMPQ predictor"):
    """Scatter of a fitted predictor's calibration pairs (Γ_{t−1}, E_t) with its threshold."""
    if predictor.pairs is None:
        raise ValueError("this predictor carries no calibration pairs (it was loaded, not fitted)")
    plt = _pyplot()
    g, e = (t.numpy() for t in predictor.pairs)
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.scatter(g, e, s=6, alpha=0.5)
    ax.set_xlabel("Γ(t−1) of the block")
    ax.set_ylabel("E(t): NVFP4 activation error")
    ax.set_title(f"{title}: Pearson r = {predictor.pearson_r:.3f}", fontsize=9)
    if predictor.threshold < float("inf"):
        ax.axhline(predictor.threshold, color="#d7191c", lw=1, label="threshold")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_tuned_formats(report, path, title: str = "tuned weight formats"):
    """A tuning run's layer × format map (:class:`sixbit.tuning.TuneReport`): each cell's shade is
    the PSNR of the calibration videos with only that layer in that format (darker: costlier),
    a dot marks the format the search chose."""
    import math

    plt = _pyplot()
    labels = sorted({("16-bit" if f is None else f, b) for fs, bs in zip(report.variants, report.variant_bits)
                     for f, b in zip(fs, bs)}, key=lambda x: x[1])
    rows = list(dict.fromkeys(label for label, _ in labels))
    grid = [[math.nan] * len(report.layers) for _ in rows]
    chosen = report.best["formats"]
    for i, (name, formats) in enumerate(zip(report.layers, report.variants)):
        for j, fmt in enumerate(formats):
            mse = float(report.sensitivity.mse[i][j].mean())
            grid[rows.index("16-bit" if fmt is None else fmt)][i] = 100.0 if mse <= 1e-10 else -10 * math.log10(mse)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 + 0.22 * len(report.layers)), 1.4 + 0.35 * len(rows)))
    measured = [v for row in grid for v in row if v == v and v < 100.0]  # 16-bit cells: no error
    low = min(measured, default=0.0)
    image = ax.imshow(grid, cmap="viridis", aspect="auto", vmin=low, vmax=max(measured, default=low) + 5)
    ax.scatter([i for i, name in enumerate(report.layers)],
               [rows.index("16-bit" if chosen[name] is None else chosen[name]) for name in report.layers],
               s=14, color="#d7191c", label="chosen")
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xticks(range(len(report.layers)), [n.split(".", 1)[-1] for n in report.layers], rotation=90, fontsize=6)
    ax.set_title(f"{title}: {report.best['bits']:.2f} bits, {report.best['psnr']:.2f} dB "
                 f"({report.constraint.describe()})", fontsize=9)
    fig.colorbar(image, ax=ax, label="PSNR, only this layer quantized (dB)")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
