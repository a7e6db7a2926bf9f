"""report.md's section on the decoding graph: the out-of-scope policy and its curve, argmax against constrained
slots, what rejection costs."""

from __future__ import annotations

from edgekit.reporting.common import pass_of as _pass
from edgekit.reporting.common import pct as _pct
from edgekit.runtime.package import RUNTIMES


def decoding_section(rep: dict) -> list[str]:
    """The decoding graph: out-of-scope policy, argmax against constrained slots, rejection figures."""
    export = _pass(rep, "export")
    if not export or "decoding" not in export["extra"]:
        return []
    d = export["extra"]["decoding"]
    lines = ["", "## Decoding in the graph (test split)", "",
             f"Intents allowed by the build: {', '.join(d['allowed_intents']) if d['allowed_intents'] else 'all'}. "
             f"Out-of-scope: {d['policy']} (threshold {d['threshold']:.4f} on the {d.get('score', 'confidence')}); "
             f"{d['calibration']}."]
    t = (_pass(rep, "fuse") or {}).get("extra", {}).get("threshold")
    if t:  # the fuse stage lowered the server graph's precision, and chose the threshold again on its dev scores
        b, a = t["dev_before"], t["dev_after"]
        lines.append(f"The shipped graph's precision moves its scores: its threshold, chosen again on its own dev "
                     f"{t['score']}, is **{t['after']:.4f}** (dev in-scope {_pct(b['in_scope_acc'])} → "
                     f"{_pct(a['in_scope_acc'])}, OOS recall {_pct(b['oos_recall'])} → {_pct(a['oos_recall'])}, "
                     f"in-scope refused {_pct(b['refused_in_scope'])} → {_pct(a['refused_in_scope'])}).")
    if d.get("calibration_error"):
        e = d["calibration_error"]
        lines.append(f"Confidence calibration: {d['temperature_note']}. Expected calibration error (in-scope, 15 "
                     f"bins): dev {e['dev_before']:.4f} → {e['dev_after']:.4f}, test {e['test_before']:.4f} → "
                     f"{e['test_after']:.4f}.")
    ch = d.get("intent_slot_choice")
    if ch:
        lines.append(f"Intent-to-slot whitelist {'on' if ch['used'] else 'off'}: teacher dev slot F1 "
                     f"{_pct(ch['teacher_dev_slot_f1_with'])} with it, {_pct(ch['teacher_dev_slot_f1_without'])} "
                     "without (kept unless it costs).")
    if d.get("candidates"):
        lines += ["", "| policy and score (dev) | AUROC | threshold | in-scope acc | OOS recall |",
                  "|---|---:|---:|---:|---:|"]
    for name, c in d.get("candidates", {}).items():
        thr = "none" if c["threshold"] is None else f"{c['threshold']:.4f}"
        lines.append(f"| {name}{' (chosen)' if name == d['policy'] else ''} | {c.get('dev_auroc', float('nan')):.4f} "
                     f"| {thr} | {_pct(c['dev']['in_scope_acc'])} | {_pct(c['dev']['oos_recall'])} |")
    c = d.get("oos_curve")
    if c:
        ch = c["chosen"]
        lines += ["", f"In-scope accuracy against out-of-scope recall on {c['split']} ({c['model']} model, "
                  f"{c['score']} threshold swept; AUROC {c['auroc']:.4f}); {'its' if t else 'the shipped'} threshold gives "
                  f"**{_pct(ch['in_scope_acc'])} in-scope, {_pct(ch['oos_recall'])} recall**:", "",
                  "| threshold | in-scope acc | OOS recall | in-scope refused |", "|---:|---:|---:|---:|"]
        pts = c["points"]
        for p in pts[:: max(1, len(pts) // 10)]:
            thr = "none" if p["threshold"] is None else f"{p['threshold']:.4f}"
            lines.append(f"| {thr} | "
                         f"{_pct(p['in_scope_acc'])} | {_pct(p['oos_recall'])} | {_pct(p['refused_in_scope'])} |")
        if "oos" in rep.get("plots", {}):
            lines += ["", f"![out-of-scope curve]({rep['plots']['oos']})"]
    elif d.get("oos_recall") == "unknown":
        lines += ["", "**Out-of-scope recall is unknown**: the data has no out-of-scope examples, so nothing "
                  "measures how often a request outside these intents is refused."]
    lines += ["", "| runtime | slot F1 argmax | slot F1 constrained | invalid BIO argmax | invalid BIO constrained | "
              "intent acc with rejection | in-scope acc | OOS recall | rejected |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rt in RUNTIMES:
        if rt in export["extra"]:
            e = export["extra"][rt]["extra"]["decoding"]
            w = e["with_rejection"]
            a = e.get("argmax", {"slot_f1": None, "invalid_bio": "—"})  # not with decoding.compare_argmax = false
            lines.append(f"| {rt} | {_pct(a['slot_f1'])} | {_pct(e['constrained']['slot_f1'])} | "
                         f"{a['invalid_bio']} | {e['constrained']['invalid_bio']} | {_pct(w['intent_acc'])} | "
                         f"{_pct(w.get('in_scope_acc'))} | {_pct(w.get('oos_recall'))} | {_pct(e['rejected_share'])} |")
    compared = any("argmax" in export["extra"][rt]["extra"]["decoding"] for rt in RUNTIMES
                   if rt in export["extra"])
    lines += ["", "Argmax: the same model exported without the decoding graph"
              + ("" if compared else ", not exported in this build (`decoding.compare_argmax = false`)")
              + ". The stage rows above score the graph with rejection off (the model's own answers); the package "
              "row scores it as shipped (rejection on)."]
    return lines
