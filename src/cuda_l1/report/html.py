"""report.html: one self-contained page (figures embedded) with the tables of a summary."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from cuda_l1.report.rows import ResultRow, as_rows

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
tr.fail td { background: #fff4f4; } .rules li { margin: 0.2em 0; } .note { color: #555; }
.noisy { background: #ffe9e9; border: 2px solid #c44e52; padding: 0.6em 1em; font-weight: bold; }
.quiet { background: #eef7ee; border: 1px solid #55a868; padding: 0.4em 1em; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0; }
"""

_FIGURE_TITLES = {
    "hist": "Distribution of the best speedup per task",
    "tasks": "Best speedup per task",
    "fast_p": "fast_p curve",
}


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def fmt(value, digits: int = 2, suffix: str = "") -> str:
    """A number for a table cell; an en dash for missing values."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def short(text: str, limit: int = 400) -> str:
    """A failure reason cut to a readable length (compiler logs can run to megabytes)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def reasons_text(reasons: Iterable[str]) -> str:
    return "; ".join(short(r) for r in reasons or [])


def fmt_rate(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def table(headers: Sequence[str], rows: Iterable[Sequence], text_columns: Sequence[int] = (0,),
          row_classes: Sequence[str] | None = None) -> str:
    """An HTML table. Cells are escaped here; text columns are left-aligned."""
    text_columns = set(text_columns)

    def cell(tag: str, index: int, value) -> str:
        cls = ' class="text"' if index in text_columns else ""
        return f"<{tag}{cls}>{esc(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = []
    for n, row in enumerate(rows):
        cls = f' class="{esc(row_classes[n])}"' if row_classes and row_classes[n] else ""
        body.append(f"<tr{cls}>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head>\n<body>\n<h1>{esc(title)}</h1>\n"
        f"{body}\n</body></html>\n"
    )


def embed_png(path: str | Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _groups(summary: Mapping) -> list[tuple[str, Mapping]]:
    groups = [("all", summary["overall"])]
    groups += [(f"level {level}", group) for level, group in summary.get("levels", {}).items()]
    return groups


def overview_table(summary: Mapping) -> str:
    thresholds = list(summary["overall"]["fast_p"])
    headers = ["tasks", "n", "correct", *[f"fast_{p}" for p in thresholds], "mean", "median", "geomean"]
    rows = []
    for name, group in _groups(summary):
        speed = group["speedup"]
        rows.append(
            [name, group["n_tasks"], group["n_correct"], *[fmt_rate(group["fast_p"][p]) for p in thresholds],
             fmt(speed["mean"], 3, "x"), fmt(speed["median"], 3, "x"), fmt(speed["geomean"], 3, "x")]
        )
    return table(headers, rows)


def baseline_table(summary: Mapping) -> str:
    headers = ["tasks", "baseline", "n", "mean", "median", "geomean", "min", "max"]
    rows = []
    for name, group in _groups(summary):
        for baseline, d in group["over_baseline"].items():
            rows.append([name, baseline, d["n"], fmt(d["mean"], 3, "x"), fmt(d["median"], 3, "x"),
                         fmt(d["geomean"], 3, "x"), fmt(d["min"], 3, "x"), fmt(d["max"], 3, "x")])
    return table(headers, rows, text_columns=(0, 1))


def status_table(summary: Mapping) -> str:
    groups = _groups(summary)
    statuses = [s for s in groups[0][1]["status_counts"]]
    headers = ["tasks", "candidates", *statuses]
    rows = [[name, g["n_candidates"], *[g["status_counts"].get(s, 0) for s in statuses]] for name, g in groups]
    return table(headers, rows)


def task_table(summary: Mapping) -> str:
    baselines = list(summary.get("baselines", []))
    headers = ["level", "task", "status", "best strategy", "speedup", "95% CI", "reference ms", "best ms",
               "candidates", *[f"vs {b}" for b in baselines], "reasons (no correct candidate)"]
    rows, classes = [], []
    for task in summary["tasks"]:
        ci = task.get("ci")
        rows.append(
            [task["level"], task["task_name"], task["status"], task["best_origin"] or "–",
             fmt(task["speedup"], 3, "x"), f"{ci[0]:.3f} – {ci[1]:.3f}" if ci else "–",
             fmt(task["reference_ms"], 4), fmt(task["best_ms"], 4), task["n_candidates"],
             *[fmt(task["over_baseline"].get(b), 3, "x") for b in baselines],
             reasons_text(task.get("reasons"))]
        )
        classes.append("" if task["status"] == "ok" else "fail")
    text = (1, 2, 3, len(headers) - 1)
    return table(headers, rows, text_columns=text, row_classes=classes)


def candidate_section(rows: Sequence[ResultRow | Mapping]) -> str:
    """Every evaluated candidate, folded away by default (it can run to thousands of lines)."""
    headers = ["level", "task", "origin", "status", "speedup", "reference ms", "candidate ms", "reasons"]
    lines, classes = [], []
    for row in as_rows(rows):
        lines.append([row.level, row.task_name, row.origin, row.status, fmt(row.speedup, 3, "x"),
                      fmt(row.reference_ms, 4), fmt(row.candidate_ms, 4), reasons_text(row.verdict.reasons)])
        classes.append("" if row.ok else "fail")
    return (
        f"<h2>Candidates</h2><details><summary>{len(lines)} evaluated candidates</summary>"
        + table(headers, lines, text_columns=(1, 2, 3, 7), row_classes=classes)
        + "</details>"
    )


def rules_list(summary: Mapping) -> str:
    rules = summary["rules"]
    items = [
        f"<li><b>missing tasks ({esc(rules['missing_as'])}):</b> {esc(rules['missing'])}</li>",
        f"<li><b>best candidate:</b> {esc(rules['best'])}; competing: {esc(rules['candidates'])}</li>",
        f"<li><b>fast_p:</b> {esc(rules['fast_p'])}</li>",
        f"<li><b>speedup over a baseline:</b> {esc(rules['over_baseline'])}</li>",
    ]
    return '<ul class="rules">' + "".join(items) + "</ul>"


def provenance_section(prov: Mapping) -> str:
    """Date, command, versions, commit and hardware, as a two-column table."""
    git = prov.get("git") or {}
    commit = git.get("commit") or "not a git checkout"
    if git.get("dirty"):
        commit += " (with uncommitted changes)"
    versions = ", ".join(f"{k} {v}" for k, v in (prov.get("versions") or {}).items() if v)
    hw = prov.get("hardware") or {}
    hardware = "; ".join(x for x in [
        hw.get("cpu"), f"{hw.get('cpus_allowed', hw.get('cpu_count'))} CPU(s) usable" if hw.get("cpu_count") else "",
        ", ".join(hw.get("gpus") or []), hw.get("os")] if x)
    rows = [["date", prov.get("date", "")], ["command", prov.get("command", "")], ["versions", versions],
            ["git commit", commit], ["hardware", hardware]]
    return "<h2>Run</h2>" + table(["", ""], rows, text_columns=(0, 1))


def noise_section(noise: Mapping) -> str:
    """The A/A check in words and numbers; a banner when the host was too noisy."""
    if not noise.get("checked"):
        return ('<h2>Noise check</h2><p class="note">No A/A check in this run (no calibration, and no eager '
                "candidate that came out ok): nothing says how far identical code strays on this host.</p>")
    cls = "noisy" if noise.get("too_noisy") else "quiet"
    parts = [f'<p class="{cls}">{esc(text)}</p>' for text in noise.get("verdicts", [])]
    rows = []
    for check in (noise.get("calibration"), noise.get("eager")):
        if check:
            rows.append([check["kind"], check["what"], check["n_ok"], fmt(check.get("raw_median"), 3, "x"),
                         fmt(check.get("raw_min"), 3, "x"), fmt(check.get("raw_max"), 3, "x"),
                         f"1 ± {check['band']:g}", check["n_outside_band"], check["n_scored_off"],
                         "too noisy" if check["too_noisy"] else "ok"])
    parts.append(table(["check", "identical code", "n", "median raw", "min raw", "max raw", "band", "outside band",
                        "score ≠ 1.00", "verdict"], rows, text_columns=(0, 1, 9)))
    return "<h2>Noise check (A/A: the reference against itself)</h2>" + "".join(parts)


def report_body(summary: Mapping, plots: Mapping[str, str | Path] | None = None,
                notes: Sequence[str] = ()) -> str:
    parts = []
    noise = summary.get("noise")
    if noise and noise.get("too_noisy"):
        parts.append('<p class="noisy">This host was too noisy to measure speedups: identical code did not '
                     "measure as identical (see the noise check below). Do not publish these numbers.</p>")
    parts += [f"<p class=\"note\">{esc(note)}</p>" for note in notes]
    if summary.get("provenance"):
        parts.append(provenance_section(summary["provenance"]))
    if noise:
        parts.append(noise_section(noise))
    overall = summary["overall"]
    parts.append(
        f"<p>{overall['n_tasks']} tasks, {summary.get('n_rows', overall['n_candidates'])} evaluated "
        f"candidates; {overall['n_correct']} tasks with a correct candidate.</p>"
    )
    parts += ["<h2>Rules</h2>", rules_list(summary)]
    parts += ["<h2>Best candidate per task</h2>", overview_table(summary)]
    parts += ["<h2>Speedup over the baselines</h2>", baseline_table(summary)]
    parts += ["<h2>Verdicts</h2>", status_table(summary)]
    if plots:
        parts.append("<h2>Figures</h2>")
        for name, path in plots.items():
            caption = _FIGURE_TITLES.get(name, name)
            parts.append(f"<h3>{esc(caption)}</h3>{embed_png(path, caption)}")
    parts += ["<h2>Tasks</h2>", task_table(summary)]
    return "\n".join(parts)


def write_report(
    out_dir: str | Path,
    summary: Mapping,
    rows: Sequence[ResultRow | Mapping] | None = None,
    plots: Mapping[str, str | Path] | None = None,
    title: str = "cuda-l1 report",
    notes: Sequence[str] = (),
    extra_html: str = "",
) -> Path:
    """Write out_dir/report.html and return its path.

    rows: the result rows behind the summary, listed one per candidate in a folded section at the end
    (the per-task table comes from the summary, which holds each task's best and failure reasons).
    extra_html: a ready section appended at the end (e.g. `compare.compare_section`).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    body = report_body(summary, plots, notes)
    if rows:
        body += "\n" + candidate_section(rows)
    if extra_html:
        body += "\n" + extra_html
    path = out_dir / "report.html"
    path.write_text(page(title, body), encoding="utf-8")
    return path
