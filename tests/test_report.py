"""Report statistics against numbers worked out by hand, and the writers' files."""

from __future__ import annotations

import csv
import json
import math
from html.parser import HTMLParser

import pytest

from cuda_l1.errors import UserError
from cuda_l1.evaluate.verdict import Verdict
from cuda_l1.report import (
    ResultRow,
    baseline_speedups,
    build_summary,
    compare_runs,
    fast_p,
    geomean,
    mean,
    median,
    read_results_csv,
    task_outcomes,
    task_speedups,
    write_all,
    write_comparison,
)
from cuda_l1.report import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def ok(ref_ms: float, cand_ms: float, speedup: float | None = None) -> Verdict:
    speedup = ref_ms / cand_ms if speedup is None else speedup
    return Verdict(status="ok", speedup=speedup, reference_ms=ref_ms, candidate_ms=cand_ms,
                   ci=[speedup * 0.9, speedup * 1.1])


def failed(status: str, reason: str) -> Verdict:
    return Verdict(status=status, reasons=[reason])


def row(task: str, level: int, origin: str, verdict: Verdict) -> ResultRow:
    return ResultRow(task_id=f"id-{task}", task_name=task, level=level, origin=origin, verdict=verdict)


def run_rows() -> list[ResultRow]:
    """Four tasks, hand-made:

    A (level 1): eager 1.0x (2.0 ms), compile 1.6x (1.25 ms), llm:x 2.0x (1.0 ms), llm:y incorrect
    B (level 1): eager 1.0x (4.0 ms), llm:x 0.5x (8.0 ms)
    C (level 2): nothing correct (compile_error, incorrect)
    D (level 2): llm:x 4.0x (0.25 ms), llm:y 4.0x too (0.2 ms; rounded toward 1), cudagraph 2.0x (0.5 ms)
    """
    return [
        row("A", 1, "eager", ok(2.0, 2.0)),
        row("A", 1, "compile", ok(2.0, 1.25)),
        row("A", 1, "llm:x", ok(2.0, 1.0)),
        row("A", 1, "llm:y", failed("incorrect", "max abs diff 0.3 > 1e-2")),
        row("B", 1, "eager", ok(4.0, 4.0)),
        row("B", 1, "llm:x", ok(4.0, 8.0)),
        row("C", 2, "llm:x", failed("compile_error", "nvcc: syntax error")),
        row("C", 2, "llm:y", failed("incorrect", "output shape (2, 3) != (3, 2)")),
        row("D", 2, "llm:x", ok(1.0, 0.25)),
        row("D", 2, "llm:y", ok(1.0, 0.2, speedup=4.0)),
        row("D", 2, "cudagraph", ok(1.0, 0.5)),
    ]


# ---------------------------------------------------------------- plain statistics


def test_mean_median_geomean_by_hand():
    assert mean([1.0, 2.0, 6.0]) == pytest.approx(3.0)  # 9 / 3
    assert median([4.0, 1.0, 2.0, 1.0]) == pytest.approx(1.5)  # sorted 1, 1, 2, 4 -> (1 + 2) / 2
    assert median([5.0, 1.0, 3.0]) == pytest.approx(3.0)
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)  # sqrt(16)
    assert geomean([0.5, 2.0]) == pytest.approx(1.0)  # halving and doubling cancel
    assert mean([]) is None and median([]) is None and geomean([]) is None
    with pytest.raises(ValueError):
        geomean([1.0, 0.0])


# ---------------------------------------------------------------- best candidate and missing rules


def test_best_candidate_per_task_and_tie():
    outcomes = {o.task_name: o for o in task_outcomes(run_rows())}
    assert outcomes["A"].best.origin == "llm:x"  # 2.0 beats compile 1.6 and eager 1.0
    assert outcomes["B"].best.origin == "eager"  # 1.0 beats llm:x 0.5
    assert outcomes["C"].best is None and outcomes["C"].status == "incorrect"  # got further than compile_error
    # D: llm:x and llm:y both read 4.0: the earlier row wins, so its 0.25 ms is the best time.
    assert outcomes["D"].best.origin == "llm:x"
    assert outcomes["D"].best.candidate_ms == 0.25


def test_missing_as_one_counts_failed_tasks_as_reference():
    # best per task: A 2.0, B 1.0, C none -> 1.0, D 4.0
    values = task_speedups(run_rows(), "one")
    assert sorted(values) == [1.0, 1.0, 2.0, 4.0]
    assert mean(values) == pytest.approx(2.0)  # (2 + 1 + 1 + 4) / 4 = 8 / 4
    assert median(values) == pytest.approx(1.5)  # 1, 1, 2, 4 -> (1 + 2) / 2
    assert geomean(values) == pytest.approx(2 ** 0.75)  # (2 * 1 * 1 * 4) ** (1/4) = 8 ** 0.25


def test_missing_as_exclude_drops_failed_tasks():
    values = task_speedups(run_rows(), "exclude")
    assert sorted(values) == [1.0, 2.0, 4.0]
    assert mean(values) == pytest.approx(7 / 3)  # (2 + 1 + 4) / 3
    assert median(values) == pytest.approx(2.0)
    assert geomean(values) == pytest.approx(2.0)  # 8 ** (1/3)


def test_fast_p_kernelbench_definition():
    rows = run_rows()
    # Denominator: all 4 tasks, C included. Strictly greater than p.
    assert fast_p(rows, 0.0) == pytest.approx(3 / 4)  # A, B, D correct
    assert fast_p(rows, 1.0) == pytest.approx(2 / 4)  # A 2.0, D 4.0; B is exactly 1.0
    assert fast_p(rows, 1.5) == pytest.approx(2 / 4)
    assert fast_p(rows, 2.0) == pytest.approx(1 / 4)  # only D: A is exactly 2.0
    assert fast_p(rows, 4.0) == 0.0
    assert fast_p([], 1.0) is None


def test_origins_restrict_who_competes_for_best():
    rows = run_rows()
    # LLM rows only: A 2.0, B 0.5, C none -> 1.0, D 4.0
    values = task_speedups(rows, "one", origins=["llm:*"])
    assert mean(values) == pytest.approx(1.875)  # (2 + 0.5 + 1 + 4) / 4 = 7.5 / 4
    assert median(values) == pytest.approx(1.5)  # 0.5, 1, 2, 4 -> (1 + 2) / 2
    assert geomean(values) == pytest.approx(math.sqrt(2))  # (2 * 0.5 * 1 * 4) ** (1/4) = 4 ** 0.25
    assert fast_p(rows, 1.0, origins=["llm:*"]) == pytest.approx(2 / 4)


def test_speedup_over_baselines_uses_times_of_the_same_run():
    rows = run_rows()
    # eager: A 2.0 ms / 1.0 ms = 2.0; B 4.0 / 4.0 = 1.0 (eager is B's best); C no best; D no eager row
    assert baseline_speedups(rows, "eager") == pytest.approx([2.0, 1.0])
    assert baseline_speedups(rows, "compile") == pytest.approx([1.25])  # A: 1.25 / 1.0
    assert baseline_speedups(rows, "cudagraph") == pytest.approx([2.0])  # D: 0.5 / 0.25 (first of the tie)
    assert baseline_speedups(rows, "compile-ro") == []
    # LLM rows only: B's best becomes llm:x at 8.0 ms -> 4.0 / 8.0 = 0.5
    assert baseline_speedups(rows, "eager", origins=["llm:*"]) == pytest.approx([2.0, 0.5])


def test_a_baseline_measured_twice_uses_its_fastest_time():
    rows = [
        row("A", 1, "eager", ok(2.0, 2.0)),
        row("A", 1, "eager", ok(2.0, 1.6)),
        row("A", 1, "llm:x", ok(2.0, 0.8)),
    ]
    assert baseline_speedups(rows, "eager") == pytest.approx([2.0])  # 1.6 / 0.8, not 2.0 / 0.8


def test_all_tasks_failed():
    rows = [row("A", 1, "llm:x", failed("timeout", "over 60 s")), row("B", 3, "llm:x", failed("rejected", "x"))]
    assert fast_p(rows, 0.0) == 0.0
    assert task_speedups(rows, "one") == [1.0, 1.0]
    assert task_speedups(rows, "exclude") == []
    summary = build_summary(rows, "exclude")
    assert summary["overall"]["speedup"]["mean"] is None
    assert summary["overall"]["correct_rate"] == 0.0
    assert build_summary(rows, "one")["overall"]["speedup"]["geomean"] == pytest.approx(1.0)


def test_correct_candidate_without_speedup_counts_only_as_correct():
    rows = [row("A", 1, "llm:x", Verdict(status="ok", speedup=None))]
    assert fast_p(rows, 0.0) == 1.0
    assert fast_p(rows, 0.5) == 0.0
    assert task_speedups(rows, "exclude") == []


def test_bad_missing_rule_is_a_user_error():
    with pytest.raises(UserError):
        build_summary(run_rows(), "zero")


# ---------------------------------------------------------------- summary


def test_build_summary_overall_and_levels():
    summary = build_summary(run_rows(), "one")
    assert summary["rules"]["missing_as"] == "one"
    assert "1.0" in summary["rules"]["missing"]
    overall = summary["overall"]
    assert (overall["n_tasks"], overall["n_correct"], overall["n_missing"]) == (4, 3, 1)
    assert overall["speedup"]["mean"] == pytest.approx(2.0)
    assert overall["fast_p"] == pytest.approx({"0": 0.75, "1": 0.5, "1.2": 0.5, "1.5": 0.5, "2": 0.25})
    assert overall["correct_rate"] == pytest.approx(0.75)
    assert overall["candidate_ok_rate"] == pytest.approx(8 / 11)  # 8 ok rows out of 11
    counts = overall["status_counts"]
    assert (counts["ok"], counts["incorrect"], counts["compile_error"], counts["timeout"]) == (8, 2, 1, 0)
    assert overall["over_baseline"]["eager"]["n"] == 2
    assert overall["over_baseline"]["eager"]["geomean"] == pytest.approx(math.sqrt(2))  # sqrt(2.0 * 1.0)
    assert overall["over_baseline"]["compile-ro"] == {"n": 0, "mean": None, "median": None, "geomean": None,
                                                      "min": None, "max": None}

    level1, level2 = summary["levels"]["1"], summary["levels"]["2"]
    # level 1: A 2.0, B 1.0
    assert level1["speedup"]["mean"] == pytest.approx(1.5)
    assert level1["speedup"]["geomean"] == pytest.approx(math.sqrt(2))
    assert level1["fast_p"]["1"] == pytest.approx(0.5)
    # level 2: C missing -> 1.0, D 4.0
    assert level2["speedup"]["mean"] == pytest.approx(2.5)  # (1 + 4) / 2
    assert level2["speedup"]["geomean"] == pytest.approx(2.0)  # sqrt(4)
    assert level2["fast_p"]["0"] == pytest.approx(0.5)
    assert level2["over_baseline"]["cudagraph"]["mean"] == pytest.approx(2.0)

    excluded = build_summary(run_rows(), "exclude")
    assert excluded["rules"]["missing_as"] == "exclude"
    assert excluded["levels"]["2"]["speedup"]["mean"] == pytest.approx(4.0)  # only D
    assert excluded["overall"]["fast_p"] == overall["fast_p"]  # the rule never changes fast_p

    tasks = {t["task_name"]: t for t in summary["tasks"]}
    assert tasks["A"]["best_origin"] == "llm:x" and tasks["A"]["speedup"] == pytest.approx(2.0)
    assert tasks["A"]["over_baseline"]["eager"] == pytest.approx(2.0)
    assert tasks["C"]["status"] == "incorrect" and tasks["C"]["best_origin"] is None
    assert tasks["C"]["reasons"] == ["output shape (2, 3) != (3, 2)"]


def test_dict_rows_flat_and_nested_give_the_same_summary():
    nested = [{"task_id": r.task_id, "task_name": r.task_name, "level": r.level, "origin": r.origin,
               "verdict": r.verdict.to_dict()} for r in run_rows()]
    flat = [{"task_id": r.task_id, "task_name": r.task_name, "level": r.level, "strategy": r.origin,
             "status": r.status, "speedup": r.verdict.speedup, "reference_ms": r.verdict.reference_ms,
             "candidate_ms": r.verdict.candidate_ms, "ci": r.verdict.ci, "reasons": r.verdict.reasons}
            for r in run_rows()]
    expected = build_summary(run_rows())
    assert build_summary(nested) == expected
    assert build_summary(flat) == expected
    with pytest.raises(UserError):
        build_summary([{"task_id": "x", "origin": "eager"}])  # neither verdict nor status


# ---------------------------------------------------------------- writers


class _TagCounter(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: dict[str, int] = {}
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag not in ("meta", "img", "br"):
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()


def test_write_all_produces_json_csv_html_and_pngs(tmp_path):
    rows = run_rows()
    paths = write_all(tmp_path, rows, missing_as="one", title="Test <run>", notes=["H200, torch 2.11"])
    assert set(paths) == {"summary", "results", "report", "hist", "tasks", "fast_p"}

    summary = json.loads(paths["summary"].read_text())
    assert summary["overall"]["speedup"]["mean"] == pytest.approx(2.0)
    assert summary["rules"]["missing_as"] == "one"

    with paths["results"].open(newline="") as handle:
        lines = list(csv.DictReader(handle))
    assert len(lines) == len(rows)
    best = [(line["task_name"], line["origin"]) for line in lines if line["best"] == "1"]
    assert best == [("A", "llm:x"), ("B", "eager"), ("D", "llm:x")]
    assert [line["reasons"] for line in lines if line["task_name"] == "C"] == [
        "nvcc: syntax error", "output shape (2, 3) != (3, 2)"]

    # Reading the CSV back gives the same statistics (the route for comparing runs made elsewhere).
    assert build_summary(read_results_csv(paths["results"])) == build_summary(rows)

    for key in ("hist", "tasks", "fast_p"):
        data = paths[key].read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 2000, key

    text = paths["report"].read_text()
    parser = _TagCounter()
    parser.feed(text)
    assert parser.open == []
    assert parser.tags["img"] == 3 and parser.tags["table"] >= 4
    assert text.count("data:image/png;base64,") == 3  # self-contained
    assert "Test &lt;run&gt;" in text and "<run>" not in text  # escaped
    assert "count as speedup 1.0" in text  # the rule is stated
    assert "output shape (2, 3) != (3, 2)" in text  # failure reasons shown
    assert "H200, torch 2.11" in text


def test_plots_with_no_data_still_write_png(tmp_path):
    rows = [row("A", 1, "llm:x", failed("timeout", "slow"))]
    for path in (
        plots.plot_speedup_hist(rows, tmp_path / "h.png", missing_as="exclude"),
        plots.plot_task_bars(rows, tmp_path / "t.png", missing_as="exclude"),
        plots.plot_fast_p([], tmp_path / "f.png"),
    ):
        assert path.read_bytes().startswith(PNG_SIGNATURE)


# ---------------------------------------------------------------- two runs side by side


def second_run_rows() -> list[ResultRow]:
    """Run B: A 4.0x, B nothing correct, D 2.0x, E 1.5x (E only here; C only in run A)."""
    return [
        row("A", 1, "llm:x", ok(2.0, 0.5)),
        row("B", 1, "llm:x", failed("incorrect", "nan in output")),
        row("D", 2, "llm:x", ok(1.0, 0.5)),
        row("E", 3, "llm:x", ok(3.0, 2.0)),
    ]


def test_compare_runs_by_hand(tmp_path):
    comparison = compare_runs(run_rows(), second_run_rows(), labels=("A100", "H200"), missing_as="one")
    s = comparison["summary"]
    assert (s["n_tasks_a"], s["n_tasks_b"], s["n_common"]) == (4, 4, 3)
    assert s["only_a"] == ["C"] and s["only_b"] == ["E"]
    ratios = {t["task_name"]: t["ratio"] for t in comparison["tasks"]}
    # A: 4.0 / 2.0 = 2; B: run B has nothing correct -> 1.0, run A's best is 1.0 -> 1; D: 2.0 / 4.0 = 0.5
    assert ratios == pytest.approx({"A": 2.0, "B": 1.0, "D": 0.5})
    assert s["ratio"]["geomean"] == pytest.approx(1.0)  # (2 * 1 * 0.5) ** (1/3)
    assert s["ratio"]["mean"] == pytest.approx(3.5 / 3)
    assert (s["b_faster"], s["a_faster"], s["same"]) == (1, 1, 1)
    # over the common tasks only: run A has 2, 1, 4 -> mean 7/3; run B 4, 1, 2 -> mean 7/3
    assert s["speedup_a"]["mean"] == pytest.approx(7 / 3) and s["speedup_b"]["mean"] == pytest.approx(7 / 3)
    assert s["fast_p_b"]["0"] == pytest.approx(2 / 3)  # B failed in run B

    excluded = compare_runs(run_rows(), second_run_rows(), labels=("A100", "H200"), missing_as="exclude")
    assert [t["ratio"] for t in excluded["tasks"]] == pytest.approx([2.0, None, 0.5])

    paths = write_comparison(tmp_path, comparison)
    assert json.loads(paths["compare_json"].read_text())["summary"]["n_common"] == 3
    text = paths["compare_html"].read_text()
    assert "A100 vs H200" in text and "2.000x" in text

    with pytest.raises(UserError):
        compare_runs(run_rows(), second_run_rows(), labels=("same", "same"))
