"""Scores by label as markdown: report.md's short section (the few lowest-F1 intents and slot types) and the
whole tables `edgekit eval --out` writes to labels.md. Input: edgekit.scoring.score.by_label's dict."""

from __future__ import annotations

from edgekit.reporting.common import pass_of, pct

WORST = 5  # rows report.md shows of each table


def table_lines(table: dict, what: str, limit: int | None = None) -> list[str]:
    """One markdown table, lowest F1 first (ties: the larger support first), then its micro and macro rows."""
    rows = sorted(table["rows"], key=lambda r: (r["f1"], -r["support"], r["label"]))
    shown = rows if limit is None else rows[:limit]
    lines = [f"| {what} | F1 | precision | recall | support | answered |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['label'].replace('|', '∣')} | {pct(r['f1'])} | {pct(r['precision'])} | {pct(r['recall'])} | "
              f"{r['support']:,} | {r['predicted']:,} |" for r in shown]
    mi, ma = table["micro"], table["macro"]
    lines.append(f"| *all {len(rows)}, micro* | {pct(mi['f1'])} | {pct(mi['precision'])} | {pct(mi['recall'])} | "
                 f"{mi['support']:,} | {mi['predicted']:,} |")
    lines.append(f"| *macro (mean of the {len(rows)})* | {pct(ma['f1'])} | {pct(ma['precision'])} | "
                 f"{pct(ma['recall'])} | | |")
    return lines


def by_label_section(rep: dict) -> list[str]:
    """report.md: the WORST lowest-F1 intents and slot types of the package as shipped (its primary runtime, test
    split), and the confusion picture when the build drew one; [] for a build without the package's scores."""
    pkg = pass_of(rep, "package") or {}
    by = pkg.get("extra", {}).get("by_label")
    if not by:
        return []
    lines = ["", f"## Scores by label (package, {by['runtime']}, {by['split']} split)", "",
             f"The {WORST} lowest F1 of each; support: gold utterances (slot types: gold spans), answered: how often "
             "the package said it. Every label in report.json (`passes` → package → `extra.by_label`).", ""]
    lines += table_lines(by["intents"], "intent", WORST)
    if by.get("slots"):
        lines += [""] + table_lines(by["slots"], "slot type", WORST)
    if "confusion" in rep.get("plots", {}):
        lines += ["", f"![intent confusion, row-normalised]({rep['plots']['confusion']})"]
    return lines


def labels_markdown(res: dict) -> str:
    """labels.md for `edgekit eval --out`: every intent and slot type, lowest F1 first."""
    by = res["by_label"]
    lines = [f"# Scores by label: {res['package']} ({res['runtime']}, {res['split']} split, {res['n']:,} utterances)",
             "", "Lowest F1 first; support: gold utterances (slot types: gold spans, conlleval), answered: how often "
             "the package said it. The same figures are in eval.json `by_label`.", ""]
    lines += table_lines(by["intents"], "intent")
    if by.get("slots"):
        lines += [""] + table_lines(by["slots"], "slot type")
    return "\n".join(lines) + "\n"
