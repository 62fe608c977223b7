"""The gradebook's plots (grader/outputs/gradebook.py), checked by their artists, not pixels.

The score histogram: bins that keep a 91 apart from a 100 (a perfect score has a bin of its
own), every bar with its count written on it. The pass-rate chart: as tall as its tests
need, every test's label readable (no two overlap) and every bar with its percentage.
"""

from __future__ import annotations

import pytest

from grader.outputs.gradebook import (pass_rates_figure, plot_score_histogram,
                                      plot_test_pass_rates, score_distribution,
                                      score_histogram_figure)


def _summary(totals: list[float], max_total: float = 100.0, tests: dict | None = None) -> dict:
    return {"students": len(totals), "graded_ok": len(totals), "max_total": max_total,
            "score": score_distribution(totals, max_total), "tests": tests or {}}


def _bars(ax):
    from matplotlib.patches import Rectangle
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_histogram_bins_keep_91_apart_from_100():
    hist = score_distribution([91, 100, 100, 95, 99.5, 0, 4.5, 5], 100.0)["histogram"]
    edges, counts = hist["bin_edges"], hist["counts"]
    assert len(edges) == len(counts) + 1
    assert edges[-2:] == [100, 100] and counts[-1] == 2          # full marks alone
    assert all(b - a == 5 for a, b in zip(edges[:-2], edges[1:-1], strict=True))  # bins of 5
    def bin_of(x):
        return next(i for i in range(len(counts) - 1) if edges[i] <= x < edges[i + 1])
    assert counts[bin_of(91)] == 1 and counts[bin_of(95)] == 2     # 95 and 99.5 together
    assert counts[0] == 2 and counts[1] == 1                       # 0, 4.5 | 5
    assert sum(counts) == 8


@pytest.mark.parametrize("max_total, width", [(10, 1), (20, 1), (37, 2), (100, 5), (250, 25)])
def test_histogram_bins_are_whole_numbers_of_points(max_total, width):
    edges = score_distribution([max_total], max_total)["histogram"]["bin_edges"]
    inner = edges[:-1]
    assert inner[0] == 0 and inner[-1] == max_total and edges[-1] == max_total
    assert all(b - a == width for a, b in zip(inner, inner[1:-1], strict=False))
    assert 0 < inner[-1] - inner[-2] <= width


def test_histogram_bars_carry_their_counts(tmp_path):
    totals = [91, 100, 100, 100, 95, 50, 50, 0]
    summary = _summary(totals)
    fig = score_histogram_figure(summary)
    ax = fig.axes[0]
    counts = summary["score"]["histogram"]["counts"]
    bars = _bars(ax)
    assert len(bars) == len(counts)
    shown = {t.get_text() for t in ax.texts}
    assert shown == {str(c) for c in counts if c}                # a label on every non-empty bar
    by_label = {}
    for text in ax.texts:
        x, _ = text.xy if hasattr(text, "xy") else text.get_position()
        bar = next(b for b in bars if b.get_x() <= x <= b.get_x() + b.get_width())
        by_label[text.get_text()] = bar.get_height()
    assert all(int(label) == height for label, height in by_label.items())
    # the perfect score's bar stands apart, and says so
    full = bars[-1]
    assert full.get_height() == 3 and full.get_x() >= 100
    assert any("100" in t.get_text() for t in ax.get_xticklabels())
    assert plot_score_histogram(summary, tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"


def _tests(n: int) -> dict:
    labs = ("lab1_attention", "lab2_multihead", "lab3_positional", "lab4_transformer_block")
    return {f"{labs[i * 4 // n]}: test_{i}_with_a_fairly_long_descriptive_name":
            {"lab": labs[i * 4 // n], "test": f"test_{i}_with_a_fairly_long_descriptive_name",
             "points": 1, "visibility": "hidden" if i % 3 == 0 else "public",
             "passed": i, "pass_rate": round((i % 11) / 10, 4) if i % 11 <= 10 else 1.0}
            for i in range(n)}


@pytest.mark.parametrize("n", [4, 66, 120])
def test_pass_rate_chart_is_readable(n, tmp_path):
    summary = _summary([50.0] * 10, tests=_tests(n))
    fig = pass_rates_figure(summary)
    ax = fig.axes[0]
    assert len(_bars(ax)) == n
    # the height grows with the tests: at least ~0.22 inch per test
    assert fig.get_size_inches()[1] >= 0.22 * n
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) == n and all(t.get_fontsize() >= 8 for t in labels)
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.y0)
    assert all(a.y1 <= b.y0 + 0.5 for a, b in zip(boxes, boxes[1:], strict=False)), \
        "test labels overlap"
    # every bar says its percentage, inside the axes
    rates = [f"{100 * t['pass_rate']:.0f}%" for t in summary["tests"].values()]
    texts = [t.get_text() for t in ax.texts]
    assert sorted(texts) == sorted(rates)
    xmax = ax.get_xlim()[1]
    assert all(t.get_window_extent(renderer).x1 <= ax.get_window_extent(renderer).x1 + 0.5
               for t in ax.texts) and xmax > 100
    legend = ax.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == \
        list(dict.fromkeys(t["lab"] for t in summary["tests"].values()))
    assert plot_test_pass_rates(summary, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
