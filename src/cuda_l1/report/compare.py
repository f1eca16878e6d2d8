"""Two runs side by side (e.g. the same candidates on two GPU types): per-task speedups and their ratio.

Tasks are matched by task id. Statistics cover the tasks both runs measured, so the two columns are
always over the same set; tasks found in one run only are counted but not compared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from cuda_l1.errors import UserError
from cuda_l1.report import aggregates
from cuda_l1.report.html import esc, fmt, fmt_rate, page, table


def _speedup(outcome: aggregates.TaskOutcome, missing_as: str) -> float | None:
    value = outcome.best_speedup
    if value is None and missing_as == "one":
        return 1.0
    return value


def compare_runs(
    rows_a: Iterable,
    rows_b: Iterable,
    labels: Sequence[str] = ("A", "B"),
    missing_as: str = "one",
    origins: Sequence[str] | None = None,
    thresholds: Sequence[float] = aggregates.FAST_P_THRESHOLDS,
) -> dict:
    """Per task: the best speedup in each run and ratio = speedup in B / speedup in A; and a summary.

    missing_as applies to a task with no correct candidate in one run: "one" compares it as 1.0,
    "exclude" leaves the task out of the ratio.
    """
    aggregates.check_missing_rule(missing_as)
    if len(labels) != 2 or labels[0] == labels[1]:
        raise UserError(f"compare needs two different run labels, got {list(labels)!r}.")
    label_a, label_b = labels
    runs_a = {o.task_id: o for o in aggregates.task_outcomes(rows_a, origins)}
    runs_b = {o.task_id: o for o in aggregates.task_outcomes(rows_b, origins)}
    common = [task_id for task_id in runs_a if task_id in runs_b]

    tasks = []
    for task_id in common:
        a, b = runs_a[task_id], runs_b[task_id]
        speed_a, speed_b = _speedup(a, missing_as), _speedup(b, missing_as)
        tasks.append(
            {
                "task_id": task_id,
                "task_name": a.task_name,
                "level": a.level,
                "speedup_a": speed_a,
                "speedup_b": speed_b,
                "origin_a": a.best.origin if a.best else None,
                "origin_b": b.best.origin if b.best else None,
                "status_a": a.status,
                "status_b": b.status,
                "ratio": speed_b / speed_a if speed_a is not None and speed_b is not None else None,
            }
        )
    ratios = [t["ratio"] for t in tasks if t["ratio"] is not None]
    common_a = [runs_a[t] for t in common]
    common_b = [runs_b[t] for t in common]
    summary = {
        "labels": [label_a, label_b],
        "missing_as": missing_as,
        "ratio_rule": f"per task, speedup in {label_b} / speedup in {label_a}, over tasks in both runs",
        "n_tasks_a": len(runs_a),
        "n_tasks_b": len(runs_b),
        "n_common": len(common),
        "only_a": [runs_a[t].task_name for t in runs_a if t not in runs_b],
        "only_b": [runs_b[t].task_name for t in runs_b if t not in runs_a],
        "speedup_a": aggregates.describe(aggregates.task_speedups(common_a, missing_as)),
        "speedup_b": aggregates.describe(aggregates.task_speedups(common_b, missing_as)),
        "fast_p_a": {aggregates.fast_p_key(p): aggregates.fast_p(common_a, p) for p in thresholds},
        "fast_p_b": {aggregates.fast_p_key(p): aggregates.fast_p(common_b, p) for p in thresholds},
        "ratio": aggregates.describe(ratios),
        "b_faster": sum(r > 1 for r in ratios),
        "a_faster": sum(r < 1 for r in ratios),
        "same": sum(r == 1 for r in ratios),
    }
    return {"summary": summary, "tasks": tasks}


def compare_section(comparison: Mapping) -> str:
    """The comparison as an HTML section (a summary table and a per-task table)."""
    s = comparison["summary"]
    label_a, label_b = s["labels"]
    head = ["", "n", "mean", "median", "geomean", *[f"fast_{p}" for p in s["fast_p_a"]]]

    def line(name, d, fast):
        return [name, d["n"], fmt(d["mean"], 3, "x"), fmt(d["median"], 3, "x"), fmt(d["geomean"], 3, "x"),
                *[fmt_rate(v) for v in fast.values()]]

    blank = [""] * len(s["fast_p_a"])
    overview = table(
        head,
        [line(label_a, s["speedup_a"], s["fast_p_a"]), line(label_b, s["speedup_b"], s["fast_p_b"]),
         [f"ratio {label_b}/{label_a}", s["ratio"]["n"], fmt(s["ratio"]["mean"], 3, "x"),
          fmt(s["ratio"]["median"], 3, "x"), fmt(s["ratio"]["geomean"], 3, "x"), *blank]],
    )
    per_task = table(
        ["level", "task", f"speedup {label_a}", f"best in {label_a}", f"speedup {label_b}",
         f"best in {label_b}", f"{label_b}/{label_a}"],
        [[t["level"], t["task_name"], fmt(t["speedup_a"], 3, "x"), t["origin_a"] or t["status_a"],
          fmt(t["speedup_b"], 3, "x"), t["origin_b"] or t["status_b"], fmt(t["ratio"], 3, "x")]
         for t in comparison["tasks"]],
        text_columns=(1, 3, 5),
    )
    only = ""
    if s["only_a"] or s["only_b"]:
        only = (f"<p class=\"note\">Only in {esc(label_a)}: {esc(', '.join(s['only_a']) or 'none')}. "
                f"Only in {esc(label_b)}: {esc(', '.join(s['only_b']) or 'none')}.</p>")
    return (
        f"<h2>{esc(label_a)} vs {esc(label_b)}</h2>"
        f"<p>{s['n_common']} tasks in both runs; {esc(s['ratio_rule'])}; tasks with no correct candidate: "
        f"{esc(s['missing_as'])}. {esc(label_b)} faster on {s['b_faster']}, {esc(label_a)} faster on "
        f"{s['a_faster']}, equal on {s['same']}.</p>{only}{overview}<h3>Per task</h3>{per_task}"
    )


def write_comparison(out_dir: str | Path, comparison: Mapping, title: str | None = None) -> dict[str, Path]:
    """Write compare.html and compare.json into out_dir; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    label_a, label_b = comparison["summary"]["labels"]
    html_path = out_dir / "compare.html"
    html_path.write_text(page(title or f"cuda-l1: {label_a} vs {label_b}", compare_section(comparison)),
                         encoding="utf-8")
    json_path = out_dir / "compare.json"
    json_path.write_text(json.dumps(comparison, indent=2) + "\n", encoding="utf-8")
    return {"compare_html": html_path, "compare_json": json_path}
