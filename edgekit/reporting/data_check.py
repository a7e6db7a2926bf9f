"""report.md's section on the data check a build ran (report.json `data_check`, edgekit.data.check) and, with
--label-issues, the label-issue search's summary (report.json `label_issues`)."""

from __future__ import annotations


def label_issues_text(summary: dict) -> str:
    """The label-issue search's figures in a sentence: per kind, the rows flagged of those judged, and the
    out-of-fold accuracy of the model that judged them (edgekit.data.label_issues)."""
    parts = []
    for kind, accuracy in (("intent", "accuracy"), ("slots", "tag accuracy per word")):
        s = summary.get(kind)
        if isinstance(s, dict) and "flagged" in s:
            acc = f", out-of-fold {accuracy} {100 * s['oof_accuracy']:.2f}%" if "oof_accuracy" in s else ""
            parts.append(f"{kind}: {s['flagged']:,} of {s.get('rows', 0):,} utterances flagged{acc}")
    if parts and isinstance(summary.get("features"), dict) and "fit_seconds" in summary:
        feats = summary["features"]
        reused = all(summary[k].get("fit_reused") for k in ("intent", "slots") if isinstance(summary.get(k), dict))
        how = "read back" if feats.get("cached") else "computed"
        fit = "fit read back and ranking" if reused else "fit and ranking"
        parts.append(f"cost: features {feats.get('seconds', 0):.1f} s ({how}), {fit} {summary['fit_seconds']:.1f} s")
    return "; ".join(parts) or "nothing judged"


def lines(report: dict) -> list[str]:
    """A short section: the findings per kind, the first of each with its file and line; nothing when the build
    ran no check (a report from before it)."""
    check, issues = report.get("data_check"), report.get("label_issues")
    if not check and not issues:
        return []
    out = ["", "## Data check", ""]
    if check is not None and not check.get("total"):
        out.append("No findings (`edgekit data check` lists what it looks for).")
    elif check is not None:
        data = report.get("dataset", {}).get("source", "DATA")
        out += [f"{check['total']:,} findings, warnings only unless the build ran with `--strict-data`; "
                f"`edgekit data check {data}` lists them all.", "", "| kind | findings | first |", "|---|---:|---|"]
        first = {}
        for f in check.get("findings", []):
            first.setdefault(f["kind"], f)
        for kind, n in check["counts"].items():
            f = first.get(kind)
            said = f"`{f['where']}` {f['message']}".replace("|", "\\|") if f else ""
            out.append(f"| {kind} | {n:,} | {said} |")
    if issues:
        out += ["", f"Label issues (train split; `{issues.get('file', 'label_issues.jsonl')}` ranks them): "
                f"{label_issues_text(issues)}."]
    return out
