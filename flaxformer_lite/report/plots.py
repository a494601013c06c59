"""Report figures (matplotlib, PNG + PDF) from already-aggregated numbers.

Figures are built as ``matplotlib.figure.Figure`` objects and saved with the non-interactive
Agg renderer; ``pyplot`` is never imported, so the global backend (e.g. a notebook's inline
one) is left alone and nothing opens a window. PNG/PDF metadata that would hold the software
version or the creation time is cleared, so the same numbers give the same files. Each file
is rendered in memory, then written like the tables are (`base.io.atomic_write_text`'s
recipe): a temporary file in the same directory, synced, then ``os.replace`` -- a failure
(a full disk, an error while rendering) leaves the previous file or none, never a 0-byte or
half-written PNG.

Inputs are plain data: a *series* maps an encoding label to points
``(eval_length, mean, ci_half_width_or_None)``; `flaxformer_lite.report` builds them
from results rows.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from flaxformer_lite.base.io import atomic_write_bytes, write_error

Point = tuple[int, float, float | None]
Series = Mapping[str, Sequence[Point]]

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
_LINESTYLES = ("-", "--", "-.", ":")
_PNG_METADATA = {"Software": None}
_PDF_METADATA = {"CreationDate": None, "Producer": None, "Creator": None}


def encoding_styles(encodings: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A distinct colour/marker/line style per encoding, by position in ``encodings``.

    Twenty colours (tab20, dark shades first) times twelve markers: the first 20 encodings
    differ in colour and marker, and any number stay distinguishable.
    """
    tab20 = colormaps["tab20"].colors
    colors = list(tab20[0::2]) + list(tab20[1::2])
    styles = {}
    for i, name in enumerate(encodings):
        styles[name] = {
            "color": colors[i % len(colors)],
            "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _LINESTYLES[(i // len(colors)) % len(_LINESTYLES)],
        }
    return styles


def save_figure(fig: Figure, stem: str | Path) -> list[Path]:
    """Save ``fig`` as ``stem.png`` (150 dpi) and ``stem.pdf``, each atomically; returns both
    paths. An OS error is raised as `base.io.StateWriteError` naming the file."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    for path, options in (
        (png, {"dpi": 150, "metadata": _PNG_METADATA}),
        (pdf, {"metadata": _PDF_METADATA}),
    ):
        buffer = io.BytesIO()
        try:
            fig.savefig(buffer, format=path.suffix[1:], bbox_inches="tight", **options)
        except OSError as e:
            raise write_error(e, path) from e
        atomic_write_bytes(path, buffer.getvalue())
    return [png, pdf]


def _styles_for(
    names: Sequence[str], styles: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """``styles`` for ``names``, falling back to `encoding_styles` by position for the rest."""
    fallback = encoding_styles(names)
    return {n: dict(styles[n]) if styles and n in styles else fallback[n] for n in names}


def _length_axis(ax: Any, lengths: Sequence[int], train_length: int | None) -> None:
    """log2 x axis with a tick per evaluation length; dashed line at the training length."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(lengths))
    ax.set_xticks(ticks)
    labels = [str(n) for n in ticks]
    if train_length:
        labels = [f"{n}\n({n / train_length:g}×)" for n in ticks]
        ax.axvline(train_length, color="0.3", linestyle="--", linewidth=1, label="train length L")
    ax.set_xticklabels(labels)
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)


def _draw_series(ax: Any, series: Series, styles: Mapping[str, Mapping[str, Any]] | None) -> None:
    resolved = _styles_for(list(series), styles)
    for name, points in series.items():
        if not points:
            continue
        style = resolved[name]
        x = np.array([p[0] for p in points], dtype=float)
        y = np.array([p[1] for p in points], dtype=float)
        hw = np.array([np.nan if p[2] is None else p[2] for p in points], dtype=float)
        ax.plot(x, y, label=name, markersize=4, linewidth=1.5, **style)
        if np.isfinite(hw).any():
            ax.fill_between(x, y - hw, y + hw, color=style["color"], alpha=BAND_ALPHA, linewidth=0)


BAND_ALPHA = 0.15  # the shading of an interval band


def band_handle(label: str) -> Patch:
    """The legend entry that says what the shaded bands are (one for every series)."""
    return Patch(facecolor="0.4", alpha=2 * BAND_ALPHA, linewidth=0, label=label)


def has_bands(series: Series) -> bool:
    """Whether any point of ``series`` has a half width (a band is drawn)."""
    return any(p[2] is not None and math.isfinite(p[2]) for pts in series.values() for p in pts)


def _legend(ax: Any, series: Series, band_label: str | None) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if band_label and has_bands(series):
        handles.append(band_handle(band_label))
        labels.append(band_label)
    ax.legend(
        handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
    )


def plot_vs_length(
    series: Series,
    stem: str | Path,
    *,
    train_length: int | None,
    ylabel: str,
    title: str,
    styles: Mapping[str, Mapping[str, Any]] | None = None,
    xlabel: str = "evaluation length (tokens)",
    band_label: str | None = None,
) -> list[Path]:
    """A metric vs evaluation length, one line per encoding, bands from each point's half
    width (the table's interval) where there is one; ``band_label`` says in the legend what
    the bands are.

    log2-scaled x axis (ticks at the evaluated lengths, labelled with their multiple of L) and a
    vertical dashed line at ``train_length``. Saves ``stem.png`` and ``stem.pdf``.
    """
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    _draw_series(ax, series, styles)
    _length_axis(ax, [p[0] for pts in series.values() for p in pts], train_length)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    _legend(ax, series, band_label)
    return save_figure(fig, stem)


def plot_task_panels(
    panels: Mapping[str, tuple[Series, int | None]],
    stem: str | Path,
    *,
    ylabel: str = "exact match",
    title: str,
    styles: Mapping[str, Mapping[str, Any]] | None = None,
    band_label: str | None = None,
) -> list[Path]:
    """One panel per task (``panels[task] = (series, train_length)``) of a metric vs length;
    ``band_label`` names the bands in the legend."""
    fig, axes = _panel_grid(len(panels), 3, 4.2, "plot_task_panels needs at least one task panel")
    for ax, (task, (series, train_length)) in zip(axes.flat, panels.items(), strict=False):
        _draw_series(ax, series, styles)
        _length_axis(ax, [p[0] for pts in series.values() for p in pts], train_length)
        ax.set_title(task, fontsize=10)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel(ylabel)
    bands = any(has_bands(series) for series, _ in panels.values())
    return _finish_panels(fig, axes, len(panels), title, stem, band_label if bands else None)


def mean_curve(curves: Sequence[Sequence[float | None]]) -> np.ndarray:
    """Element-wise mean of curves of possibly different lengths; None/NaN entries are skipped.

    Offsets that no curve covers are NaN. Returns float64 ``[max length]``.
    """
    if not curves:
        raise ValueError("mean_curve needs at least one curve; got none")
    length = max(len(c) for c in curves)
    data = np.full((len(curves), length), np.nan)
    for i, c in enumerate(curves):
        data[i, : len(c)] = [np.nan if v is None else v for v in c]
    total = np.nansum(data, axis=0)
    count = np.isfinite(data).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def moving_average(x: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over ``window`` positions, ignoring NaN (NaN where all are)."""
    if window < 1:
        raise ValueError(f"window={window} must be >= 1")
    x = np.asarray(x, dtype=np.float64)
    if window == 1 or x.size == 0:
        return x.copy()
    finite = np.isfinite(x)
    kernel = np.ones(window)
    total = np.convolve(np.where(finite, x, 0.0), kernel, mode="same")
    count = np.convolve(finite.astype(np.float64), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1.0), np.nan)


def plot_loss_by_position(
    curves: Mapping[str, np.ndarray],
    stem: str | Path,
    *,
    train_length: int | None,
    window: int,
    title: str,
    ylabel: str = "bits per byte",
    styles: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Path]:
    """Loss at each window offset (already averaged over seeds and in the unit ``ylabel``
    names), smoothed over ``window``.

    The dashed vertical line marks the training length: offsets to its right have more
    context than any training window had.
    """
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    resolved = _styles_for(list(curves), styles)
    for name, curve in curves.items():
        style = resolved[name]
        style.pop("marker")
        smooth = moving_average(curve, window)
        ax.plot(np.arange(smooth.size), smooth, label=name, linewidth=1.3, **style)
    if train_length:
        ax.axvline(train_length, color="0.3", linestyle="--", linewidth=1, label="train length L")
    ax.set_xlabel("offset t in the evaluation window (t + 1 tokens of context)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    _legend(ax, curves, None)
    return save_figure(fig, stem)


def _count(n: float) -> str:
    """``33.7k``, ``1.23M``: a parameter count on an axis."""
    if n >= 1e6:
        return f"{n / 1e6:.3g}M"
    return f"{n / 1e3:.3g}k" if n >= 1e3 else f"{n:.0f}"


def plot_vs_params(
    panels: Mapping[str, Series],
    stem: str | Path,
    *,
    ylabel: str,
    title: str,
    styles: Mapping[str, Mapping[str, Any]] | None = None,
    columns: int = 2,
    band_label: str | None = None,
) -> list[Path]:
    """One panel per entry of ``panels`` (``panels[title] = series``, points ``(parameters,
    mean, ci_half_width_or_None)``): a metric against the number of parameters (log10 axis),
    one line per encoding with its band (``band_label`` names them in the legend), and a
    dotted line at zero. Saves PNG and PDF."""
    fig, axes = _panel_grid(len(panels), columns, 4.6, "plot_vs_params needs at least one panel")
    for ax, (name, series) in zip(axes.flat, panels.items(), strict=False):
        _draw_series(ax, series, styles)
        ax.axhline(0.0, color="0.3", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=10)
        # a tick per model size (counts within 5% are one size: a learned table's extra rows)
        ticks: list[float] = []
        for x in sorted(p[0] for pts in series.values() for p in pts):
            if not ticks or x > 1.05 * ticks[-1]:
                ticks.append(x)
        ax.set_xticks(ticks)
        ax.set_xticklabels([_count(x) for x in ticks])
        ax.minorticks_off()
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("parameters")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    bands = any(has_bands(series) for series in panels.values())
    return _finish_panels(fig, axes, len(panels), title, stem, band_label if bands else None)


def _panel_grid(n: int, columns: int, width: float, empty: str) -> tuple[Figure, np.ndarray]:
    """A figure of ``n`` panels, at most ``columns`` a row, each ``width`` x 3.4 inches:
    ``(figure, axes [rows, columns])``; ``empty``: the error when ``n`` is 0."""
    if n == 0:
        raise ValueError(f"{empty}; got none")
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, 3.4 * rows))
    return fig, fig.subplots(rows, cols, squeeze=False)


def _finish_panels(fig, axes, n: int, title: str, stem, band_label: str | None) -> list[Path]:
    """Hide the unused panels past the first ``n``, add the title and one legend for every
    panel's series (each label once, then ``band_label``'s band when given) beside the
    figure, and save it."""
    handles: dict[str, Any] = {}
    for ax in list(axes.flat)[:n]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    if band_label:
        handles[band_label] = band_handle(band_label)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.legend(
        list(handles.values()),
        list(handles.keys()),
        loc="upper left",
        bbox_to_anchor=(1.0, 0.95),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    return save_figure(fig, stem)
