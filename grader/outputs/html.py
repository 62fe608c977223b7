"""The HTML feedback report: one self-contained page per submission.

``write_feedback_html(result, path)`` writes, atomically, a page that shows per lab and test
the result, the points, the message, the named mistake (``TestResult.diagnosis``) and, for
failed public tests, pictures: the student's attention weights beside the expected ones and
their difference, or the student's positional-encoding table beside the expected one (heatmaps
of one 2-D slice, drawn with Pillow and matplotlib's colour maps, embedded as base64 PNG
data URIs).
The page needs no server, no network and no other file.

Hidden tests show what their visibility allows: the name, the result, the value-free message
and the diagnosis; never values or pictures (their arrays are not even kept: the grader drops
them, and this module ignores any that a hand-built result carries).

``grader feedback SUBMISSION --out DIR`` grades and writes DIR/feedback.html;
``grader grade SUBMISSION --out DIR --html`` writes it beside results.json.
"""

from __future__ import annotations

import base64
import html
import io
import struct
from pathlib import Path

from grader.outputs.atomic import atomic_write_text
from grader.outputs.text import (Cause, cause_of, handed_in_text, missing_lab_line,
                                 not_handed_in, shared_causes)
from grader.results import LabResult, SubmissionResult, TestResult, is_grader_fault

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto;
       max-width: 72em; padding: 0 1em; color: #1d1d1f; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 2px solid #ddd; padding-bottom: 0.2em; }
.total { font-size: 1.15em; }
.notes li, .lab-message { color: #6a4a00; }
table.tests { border-collapse: collapse; width: 100%; }
table.tests th, table.tests td { border-bottom: 1px solid #e3e3e3; padding: 0.45em 0.6em;
                                 text-align: left; vertical-align: top; }
table.tests th { background: #f5f5f7; }
td.result { font-weight: 600; white-space: nowrap; }
tr.passed td.result { color: #1a7f37; }
tr.failed td.result { color: #c62828; }
td.points { white-space: nowrap; text-align: right; }
.visibility { font-size: 0.8em; color: #666; background: #eee; border-radius: 0.6em;
              padding: 0 0.5em; margin-left: 0.4em; }
.desc { color: #555; font-size: 0.9em; margin-top: 0.2em; }
pre.message { white-space: pre-wrap; word-break: break-word; margin: 0; font-size: 0.88em;
              background: #fafafa; padding: 0.4em 0.5em; border-radius: 4px; }
.diagnosis { margin: 0.5em 0 0; padding: 0.45em 0.6em; background: #fff4e5;
             border-left: 4px solid #f0a020; border-radius: 3px; }
figure.picture { margin: 0.6em 0 0; }
figure.picture img { max-width: 100%; height: auto; border: 1px solid #e3e3e3;
                     image-rendering: pixelated; }
figure.picture figcaption { font-size: 0.85em; color: #555; }
footer { margin-top: 3em; font-size: 0.85em; color: #777; }
nav.contents { background: #f5f5f7; border-radius: 4px; padding: 0.5em 1em; }
nav.contents ol { margin: 0.3em 0 0; }
.failed-count { color: #c62828; }
nav.lab-nav { font-size: 0.85em; margin: -0.3em 0 0.6em; }
ul.causes { list-style: none; padding: 0; margin: 0.6em 0; }
li.cause { margin: 0.4em 0; padding: 0.5em 0.7em; background: #fff4e5;
           border-left: 4px solid #f0a020; border-radius: 3px; }
.seen { color: #6a4a00; white-space: nowrap; }
tr.pictures td { border-bottom: 1px solid #e3e3e3; padding: 0 0.6em 0.8em; }
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def points_text(value: float) -> str:
    return f"{value:g}"


# --------------------------------------------------------------------------------------------
# pictures
# --------------------------------------------------------------------------------------------


CELL_PX = (5, 80)            # pixels per array cell: at least, at most
PANEL_PX = 320               # a panel's longer side aims at this many pixels (64 cells: 5 px)
PAGE_PX = 1100               # the report's width (72em): a picture never wider, never scaled
PANELS_PER_ROW = 2           # yours | expected, then the difference below
MAGENTA = (255, 0, 255, 255)  # NaN and inf cells


def heatmap_cell_px(rows: int, cols: int) -> int:
    """Pixels per cell of a rows x cols heatmap: a panel of about PANEL_PX, cells of 5-80 px."""
    return int(max(CELL_PX[0], min(CELL_PX[1], -(-PANEL_PX // max(rows, cols, 1)))))


def _ticks(n: int, cell: int) -> list[int]:
    """Indices to label along an axis of n cells: 0, every step (at least 28 px apart), n-1."""
    step = next(s for s in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1 << 30) if s * cell >= 28)
    ticks = list(range(0, n, step))
    if ticks[-1] != n - 1:
        if (n - 1 - ticks[-1]) * cell < 20 and len(ticks) > 1:
            ticks.pop()          # too close to the last index to both be read
        ticks.append(n - 1)
    return ticks


def _colour(array, cmap_name: str, lo: float, hi: float):
    """(rows, cols) float array -> (rows, cols, 4) uint8 RGBA; non-finite cells magenta."""
    import matplotlib
    import numpy as np

    finite = np.isfinite(array)
    scaled = np.clip((np.where(finite, array, lo) - lo) / (hi - lo), 0.0, 1.0)
    rgba = matplotlib.colormaps[cmap_name](scaled, bytes=True)
    rgba[~finite] = MAGENTA
    return rgba


def picture_png(picture: dict) -> bytes:
    """A PNG of one picture: the student's 2-D slice, the expected one and their difference.

    Heatmaps drawn cell by cell with Pillow (colour maps from matplotlib: viridis for values,
    with "yours" on the colour scale of "expected"; RdBu, centred on 0, for the difference),
    each with its title, axis names, index labels and a colour bar with its end and middle
    values; two panels a row, each about PANEL_PX on its longer side (a 64x64 slice gets
    5-pixel cells), so the picture fits the page at its own size. A few ms a picture, where
    a matplotlib figure took ~0.3 s: a batch draws one per failed public test.
    """
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    student, expected = picture["student"].double(), picture["expected"].double()
    difference = picture.get("difference")
    finite = [t[t.isfinite()] for t in (student, expected)]
    values = [float(v) for t in finite if t.numel() for v in (t.min(), t.max())]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    panels = [("yours", student.numpy(), "viridis", lo, hi, True),
              ("expected", expected.numpy(), "viridis", lo, hi, True)]
    if difference is not None:
        diff = difference.double()
        finite_diff = diff[diff.isfinite()]
        bound = (float(finite_diff.abs().max()) if finite_diff.numel() else 1.0) or 1.0
        panels.append(("yours - expected", diff.numpy(), "RdBu_r", -bound, bound, True))

    rows, cols = student.shape
    cell = heatmap_cell_px(rows, cols)
    width, height = cols * cell, rows * cell
    title_font, label_font = ImageFont.load_default(size=15), ImageFont.load_default(size=12)
    top, left, bottom, bar, gap = 28, 46, 38, 78, 24
    panel_w, panel_h = left + width + bar, top + height + bottom
    per_row = min(PANELS_PER_ROW, len(panels))
    grid_rows = -(-len(panels) // per_row)
    canvas = Image.new("RGB", (gap + per_row * (panel_w + gap), grid_rows * panel_h + 6),
                       "white")
    draw = ImageDraw.Draw(canvas)
    row_name, col_name = str(picture.get("rows", "")), str(picture.get("cols", ""))
    for i, (label, array, cmap, vmin, vmax, with_bar) in enumerate(panels):
        x0 = gap + (i % per_row) * (panel_w + gap) + left
        y0 = (i // per_row) * panel_h + top
        rgba = _colour(array, cmap, vmin, vmax)
        block = np.repeat(np.repeat(rgba, cell, axis=0), cell, axis=1)
        canvas.paste(Image.fromarray(block, "RGBA").convert("RGB"), (x0, y0))
        draw.rectangle((x0 - 1, y0 - 1, x0 + width, y0 + height), outline="#888888")
        draw.text((x0 + width / 2, y0 - top + 6), label, fill="black", font=title_font,
                  anchor="mt")
        # axis names and index labels (at the cells' centres)
        for j in _ticks(cols, cell):
            x = x0 + j * cell + cell / 2
            draw.line((x, y0 + height, x, y0 + height + 3), fill="#444444")
            draw.text((x, y0 + height + 4), str(j), fill="#444444", font=label_font,
                      anchor="mt")
        draw.text((x0 + width / 2, y0 + height + 20), col_name, fill="#222222",
                  font=label_font, anchor="mt")
        for j in _ticks(rows, cell):
            y = y0 + j * cell + cell / 2
            draw.line((x0 - 4, y, x0 - 1, y), fill="#444444")
            draw.text((x0 - 6, y), str(j), fill="#444444", font=label_font, anchor="rm")
        if row_name:   # written upwards along the rows axis
            box = draw.textbbox((0, 0), row_name, font=label_font)
            text = Image.new("RGB", (box[2] + 2, box[3] + 2), "white")
            ImageDraw.Draw(text).text((1, 1), row_name, fill="#222222", font=label_font)
            text = text.rotate(90, expand=True)
            canvas.paste(text, (x0 - left + 1, int(y0 + max(0, (height - text.height) / 2))))
        if with_bar:
            bx = x0 + width + 10
            ramp = np.linspace(vmax, vmin, height).reshape(height, 1).repeat(12, axis=1)
            strip = _colour(ramp, cmap, vmin, vmax)
            canvas.paste(Image.fromarray(strip, "RGBA").convert("RGB"), (bx, y0))
            draw.rectangle((bx - 1, y0 - 1, bx + 12, y0 + height), outline="#888888")
            draw.text((bx + 15, y0), f"{vmax:.3g}", fill="#444444", font=label_font)
            if height >= 60:
                draw.text((bx + 15, y0 + height / 2), f"{(vmax + vmin) / 2:.3g}",
                          fill="#444444", font=label_font, anchor="lm")
            draw.text((bx + 15, y0 + height), f"{vmin:.3g}", fill="#444444",
                      font=label_font, anchor="ld")
    buffer = io.BytesIO()
    canvas.save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


def curve_png(picture: dict) -> bytes:
    """A PNG of a resource picture: the student's figures against the length, beside the
    reference curve (matplotlib, ~0.3 s: drawn only for a failed resource test)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    ax = fig.add_subplot()
    few = len(picture["x"]) <= 12       # a long curve (a loss history): a line, no labels
    ax.plot(picture["x"], picture["yours"], "o-" if few else "-", color="#c0392b", label="yours")
    ax.plot(picture["x"], picture["reference"], "--", color="#555555",
            label=picture["reference_label"])
    for x, y in zip(picture["x"], picture["yours"], strict=False) if few else ():
        ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)
    ax.set_xlabel(picture["x_label"])
    ax.set_ylabel(picture["unit"])
    ax.set_title(picture["title"], fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _picture_html(picture: dict) -> str:
    if picture.get("kind") == "resource":
        png = curve_png(picture)
        data = base64.b64encode(png).decode("ascii")
        width, height = struct.unpack(">II", png[16:24])
        caption = picture.get("title", "")
        return (f'<figure class="picture"><img width="{width}" height="{height}" '
                f'alt="{_e("plot: " + caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_e(caption)}</figcaption></figure>")
    png = picture_png(picture)
    data = base64.b64encode(png).decode("ascii")
    width, height = struct.unpack(">II", png[16:24])      # the PNG's IHDR
    caption = picture.get("title", "")
    student = picture["student"]
    if not bool(student.isfinite().all()):
        caption += " - magenta cells are NaN or inf in your result"
    alt = f"heatmaps: {caption}"
    return (f'<figure class="picture"><img width="{width}" height="{height}" alt="{_e(alt)}" '
            f'src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


# --------------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------------


def _test_rows(t: TestResult, causes: list[Cause], lab: LabResult) -> str:
    """The test's row and, for a public test with pictures (a failed one's, or a passed
    training test's loss curve), a full-width row of them."""
    hidden = t.visibility != "public"
    state = "passed" if t.passed else "failed"
    badge = '<span class="visibility">hidden</span>' if hidden else ""
    desc = f'<div class="desc">{_e(t.description)}</div>' if t.description else ""
    details, pictures = [], []
    if t.passed and t.message and not hidden:   # what a passed test reports (lab 8's training)
        details.append(f'<pre class="message report">{_e(t.message)}</pre>')
    if not t.passed:
        if t.message:
            details.append(f'<pre class="message">{_e(t.message)}</pre>')
        cause = cause_of(t, causes)
        if cause is not None:
            details.append(f'<p class="diagnosis see"><strong>Diagnosis:</strong> see <a href="#'
                           f'{_e(_cause_id(lab, causes.index(cause)))}">\'{_e(cause.name)}\'</a>'
                           " above</p>")
        elif t.diagnosis:
            details.append(f'<p class="diagnosis"><strong>Diagnosis:</strong> {_e(t.diagnosis)}</p>')
    if not hidden:      # a passed test's picture too: lab 8's loss curve
        for picture in t.artifacts or []:
            try:
                pictures.append(_picture_html(picture))
            except Exception:  # noqa: BLE001 - a picture that cannot be drawn is left out
                continue
    row = (f'<tr class="test {state}" data-test="{_e(t.name)}" data-visibility="{_e(t.visibility)}">'
           f'<td class="name"><code>{_e(t.name)}</code>{badge}{desc}</td>'
           f'<td class="result">{"pass" if t.passed else "FAIL"}</td>'
           f'<td class="points">{points_text(t.score)} / {points_text(t.max_score)}</td>'
           f'<td class="details">{"".join(details)}</td></tr>')
    if pictures:       # the whole table's width: heatmaps drawn to be read at their own size
        row += (f'<tr class="pictures {state}" data-pictures-for="{_e(t.name)}">'
                f'<td colspan="4">{"".join(pictures)}</td></tr>')
    return row


def _cause_id(lab: LabResult, index: int) -> str:
    return f"cause-{lab.name}-{index + 1}"


def _lab_title(lab: LabResult) -> str:
    return f"{lab.name} - {lab.title}" if lab.title else lab.name


def _lab_nav(labs: list[LabResult], i: int) -> str:
    links = ['<a href="#contents">contents</a>']
    if i > 0:
        links.append(f'<a href="#{_e(labs[i - 1].name)}">previous: {_e(labs[i - 1].name)}</a>')
    if i < len(labs) - 1:
        links.append(f'<a href="#{_e(labs[i + 1].name)}">next: {_e(labs[i + 1].name)}</a>')
    return f'<nav class="lab-nav">{" | ".join(links)}</nav>'


def _contents(result: SubmissionResult) -> str:
    items = []
    for lab in result.labs:
        failed = sum(not t.passed for t in lab.tests)
        extra = f' <span class="failed-count">({failed} failed)</span>' if failed else ""
        items.append(f'<li><a href="#{_e(lab.name)}">{_e(_lab_title(lab))}</a>: '
                     f"{points_text(lab.score)} / {points_text(lab.max_score)}{extra}</li>")
    return (f'<nav id="contents" class="contents"><strong>Labs</strong>'
            f'<ol>{"".join(items)}</ol></nav>')


def _causes_html(lab: LabResult, causes: list[Cause]) -> str:
    """Each diagnosis shared by several failed tests of the lab, written out once."""
    items = []
    for i, c in enumerate(causes):
        what = (f"<strong>{_e(c.name)}:</strong> {_e(c.hint)}" if c.hint
                else f"<strong>{_e(c.name)}</strong>")
        items.append(f'<li class="cause" id="{_e(_cause_id(lab, i))}"><strong>Likely cause:'
                     f'</strong> {what} <span class="seen">(seen in {len(c.tests)} tests)</span>'
                     "</li>")
    if not items:
        return ""
    return f'<ul class="causes">{"".join(items)}</ul>'


def render_feedback_html(result: SubmissionResult) -> str:
    """The whole report as one HTML document (no external resources)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Feedback: {_e(result.submission)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>Feedback for {_e(result.submission)}</h1>",
        f'<p class="total">Total: <strong>{points_text(result.score)} / '
        f"{points_text(result.max_score)}</strong></p>",
    ]
    covered = handed_in_text(result)
    if covered:
        parts.append(f'<p class="handed-in">{_e(covered[0].upper() + covered[1:])}</p>')
    if result.fault is not None:
        parts.append(f'<p class="lab-message">{_e(result.status)}</p>')
    if is_grader_fault(result.fault):
        parts.append('<p class="lab-message">This is not your code\'s doing: the grader could '
                     'not grade the submission, and it will be graded again.</p>')
    if result.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in result.notes)
                     + "</ul>")
    if result.labs:
        parts.append(_contents(result))
    for i, lab in enumerate(result.labs):
        causes = shared_causes(lab)
        parts.append(f'<section class="lab" id="{_e(lab.name)}">')
        parts.append(f"<h2>{_e(_lab_title(lab))}: {points_text(lab.score)} / "
                     f"{points_text(lab.max_score)}</h2>")
        parts.append(_lab_nav(result.labs, i))
        if not_handed_in(lab):      # one line, not a row per test of a file that is not there
            parts.append(f'<p class="lab-message missing">{_e(missing_lab_line(lab))}</p>'
                         "</section>")
            continue
        if lab.message:
            parts.append(f'<p class="lab-message"><code>{_e(lab.file)}</code>: {_e(lab.message)}</p>')
        parts.append(_causes_html(lab, causes))
        parts.append('<table class="tests"><thead><tr><th>test</th><th>result</th>'
                     "<th>points</th><th>what happened</th></tr></thead><tbody>")
        parts.extend(_test_rows(t, causes, lab) for t in lab.tests)
        parts.append("</tbody></table></section>")
    # The pictures are explained only where the page has some (not every failure has one).
    pictured = any('class="picture' in p for p in parts)
    parts.append(
        "<footer>A <em>diagnosis</em> names a classic mistake: the grader ran that mistake on "
        "the same inputs and it reproduced what your code returned. A mistake seen in several "
        "tests of a lab is explained once, at the top of the lab. "
        + ("Pictures show, for some failed public tests, one slice of your result beside the "
           "expected one. " if pictured else "")
        + "Hidden tests show no values.</footer>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def write_feedback_html(result: SubmissionResult, path) -> Path:
    """Write the report for ``result`` to ``path`` (atomically); returns the path."""
    path = Path(path)
    atomic_write_text(path, render_feedback_html(result))
    return path
