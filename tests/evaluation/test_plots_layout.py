"""What the cost plot and the p̂_A ECDF look like, measured on the drawn figure
(evaluation/plots.py): every text inside the figure, point labels that overlap neither each
other nor another point and sit nearest their own point, the legend off the points; the ECDF's
axes leave a margin past its first and last steps."""

import matplotlib
import numpy as np
import pytest
from matplotlib.figure import Figure

from smoothcert.evaluation.plots import plot_cost_frontier, plot_pa_ecdf
from smoothcert.runs.records import Records

matplotlib.use("Agg")


def records(name: str, passes: int, accuracy: float, rows: int = 100, pa: float = 1.0) -> Records:
    """A CERTIFY file of ``rows`` examples, ``accuracy`` (%) of them certified at radius 1,
    n0 + n = ``passes``; the first ``pa`` fraction of them with p̂_A = 1 (all n votes)."""
    certified = np.arange(rows) < round(accuracy * rows / 100)
    n = passes - 10
    full = np.arange(rows) < round(pa * rows)
    data = {"idx": np.arange(rows), "label": np.zeros(rows, dtype=int),
            "predict": np.zeros(rows, dtype=int), "radius": np.where(certified, 2.0, 0.1),
            "correct": np.ones(rows, dtype=int), "n0": np.full(rows, 10),
            "n": np.full(rows, n), "nA": np.where(full, n, np.linspace(0, n, rows).astype(int))}
    return Records(f"{name}.tsv", tuple(data), data)


def drawn(monkeypatch, plot, *args):
    """The figure ``plot`` saves, drawn (its layout final)."""
    captured = []
    real = Figure.savefig

    def keep(fig, *a, **k):
        captured.append(fig)
        return real(fig, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot(*args)
    (fig,) = captured
    fig.canvas.draw()
    return fig


def boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


# crowded as the ensembles study's cost figure: two files at one point, neighbours whose
# labels collided, a long name at the right end
COST_FILES = [("seed0", 10_100, 82.0), ("seed1", 10_100, 69.0), ("ensemble_k2", 20_775, 84.0),
              ("ensemble_exact", 21_519, 82.0), ("ensemble", 30_300, 82.0),
              ("ensemble_softmax", 30_300, 82.0), ("ensemble_k3", 30_300, 73.0),
              ("ensemble_softmax_consensus_exact", 31_000, 80.0)]


def test_cost_plot_labels_legend_and_texts_do_not_collide(tmp_path, monkeypatch):
    files = [records(*spec) for spec in COST_FILES]
    fig = drawn(monkeypatch, plot_cost_frontier, files, tmp_path / "cost.png", 1.0)
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    width, height = fig.get_size_inches()
    drawn_box = fig.get_tightbbox(renderer)  # inches: ticks, axis labels, legend as drawn
    assert (drawn_box.x0 >= -0.01 and drawn_box.y0 >= -0.01 and drawn_box.x1 <= width + 0.01
            and drawn_box.y1 <= height + 0.01), drawn_box
    for t in [*ax.texts, ax.xaxis.label, ax.yaxis.label]:  # point labels: nothing cut off
        box = t.get_window_extent(renderer)
        assert (box.x0 >= fig.bbox.x0 - 1 and box.x1 <= fig.bbox.x1 + 1
                and box.y0 >= fig.bbox.y0 - 1 and box.y1 <= fig.bbox.y1 + 1), t.get_text()
    points = [ax.transData.transform((x, y)) for _, x, y in COST_FILES]
    legends = [*fig.legends, *([ax.get_legend()] if ax.get_legend() else [])]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert not any(box.x0 <= px <= box.x1 and box.y0 <= py <= box.y1 for px, py in points)
    labels = [t for t in ax.texts if t.get_text().strip()]
    named = sorted(name for t in labels for name in t.get_text().split("\n"))
    assert named == sorted(name for name, _, _ in COST_FILES)  # every file named once
    label_boxes = [t.get_window_extent(renderer) for t in labels]
    for i, a in enumerate(label_boxes):
        assert not any(boxes_overlap(a, b) for b in label_boxes[i + 1:]), labels[i].get_text()
        own = ax.transData.transform(labels[i].xy)
        distance = [_distance(a, p) for p in points]
        assert min(distance) == pytest.approx(_distance(a, own)), labels[i].get_text()


def _distance(box, point) -> float:
    """Pixels from ``point`` to the nearest point of ``box``."""
    dx = max(box.x0 - point[0], 0.0, point[0] - box.x1)
    dy = max(box.y0 - point[1], 0.0, point[1] - box.y1)
    return float(np.hypot(dx, dy))


def test_ecdf_steps_end_inside_the_axes(tmp_path, monkeypatch):
    """Most examples at p̂_A = 1: the ECDF's largest step is at x = 1; it must be drawn
    inside the axes, clear of the frame, as its start at 0."""
    files = [records("a", 1010, 80.0, pa=0.6), records("b", 1010, 70.0, pa=0.3)]
    fig = drawn(monkeypatch, plot_pa_ecdf, files, tmp_path / "ecdf.png")
    (ax,) = fig.axes
    left, right = ax.get_xlim()
    bottom, top = ax.get_ylim()
    pixels = ax.transData.transform([(left, bottom), (right, top)])
    width = pixels[1, 0] - pixels[0, 0]
    for line in ax.get_lines():
        x = np.asarray(line.get_xdata(), dtype=float)
        if np.all(x == x[0]):
            continue  # the dotted line at ½
        assert (right - x.max()) >= 0 and (right - 1.0) / (right - left) * width >= 5
        assert (0.0 - left) / (right - left) * width >= 5
    assert bottom < 0.0 and top > 1.0
