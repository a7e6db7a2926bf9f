"""The report's plots (matplotlib, PNG, written next to report.json and linked from report.md).

Each function takes report.json's content and a path, draws one figure from it, and returns the path, or None
when the report has nothing to draw. Files are written to a temp name and renamed.
"""

from __future__ import annotations

from pathlib import Path

from edgekit.engine.registry import MODEL_STAGES
from edgekit.reporting.common import pass_of
from edgekit.reporting.figure import figure, save

# The file names a build writes beside the package (edgekit verify accepts them as the build's, not the package's).
PLOTS = {"oos": "oos_curve.png", "stages": "stages.png", "confusion": "confusion.png", "frontier": "frontier.png"}


def oos_curve(rep: dict, path: Path) -> Path | None:
    """In-scope accuracy against out-of-scope recall as the rejection threshold sweeps (test split), with the
    shipped threshold marked. Only for data with out-of-scope examples."""
    export = next((p for p in rep.get("passes", []) if p["name"] == "export"), None)
    c = (export or {}).get("extra", {}).get("decoding", {}).get("oos_curve")
    if not c:
        return None
    plt, fig, ax = figure()
    pts = c["points"]
    ax.plot([100 * p["oos_recall"] for p in pts], [100 * p["in_scope_acc"] for p in pts], "-", color="C0",
            label=f"{c['score']} threshold swept (AUROC {c['auroc']:.3f})")
    ch = c["chosen"]
    ax.plot([100 * ch["oos_recall"]], [100 * ch["in_scope_acc"]], "o", color="C3", markersize=8,
            label=f"shipped: {100 * ch['in_scope_acc']:.1f}% in-scope, {100 * ch['oos_recall']:.1f}% recall")
    ax.set_xlabel("out-of-scope recall (%)")
    ax.set_ylabel("in-scope accuracy (%)")
    ax.set_title(f"Out-of-scope rejection, {rep['dataset']['name']} {c['split']} ({c['model']} model)")
    ax.legend(loc="lower left")
    return save(plt, fig, path)


def stages(rep: dict, path: Path) -> Path | None:
    """Size against accuracy, one point per model stage (teacher → trim → prune → distill → quantize) and the
    package as shipped, on a log size axis. With out-of-scope data the y axis is in-scope accuracy (stage rows
    score the model with rejection off, so their overall accuracy counts every out-of-scope utterance wrong)."""
    rows = [r for r in rep.get("stages", []) if r["name"] in MODEL_STAGES and r.get("size_bytes")]
    if len(rows) < 2:
        return None
    key = "in_scope_acc" if any(r.get("in_scope_acc") is not None for r in rows) else "intent_acc"
    label = "in-scope accuracy" if key == "in_scope_acc" else "intent accuracy"
    plt, fig, ax = figure()
    x = [r["size_bytes"] / 1e6 for r in rows]
    ax.plot(x, [100 * r[key] for r in rows], "-o", color="C0", label=label)
    for r, xi in zip(rows, x):
        ax.annotate(r["name"], (xi, 100 * r[key]), textcoords="offset points", xytext=(4, 6), fontsize=8)
    if any(r.get("slot_f1") is not None for r in rows):
        ax.plot(x, [100 * r["slot_f1"] for r in rows], "-s", color="C1", label="slot F1")
    pkg = next((r for r in rep["stages"] if r["name"] == "package" and r.get("size_bytes")), None)
    if pkg and pkg.get(key) is not None:
        ax.plot([pkg["size_bytes"] / 1e6], [100 * pkg[key]], "*", color="C3", markersize=13,
                label=f"package as shipped ({pkg.get('runtime', '')}, rejection on)")
    ax.set_xscale("log")
    ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500) if min(x) / 2 <= t <= max(x) * 2]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlabel("size (MB, log scale)")
    ax.set_ylabel("test score (%)")
    ax.set_title(f"Size against accuracy by stage, {rep['dataset']['name']} → {rep['target']}")
    ax.legend(loc="center left")
    return save(plt, fig, path)


def confusion(rep: dict, path: Path) -> Path | None:
    """The intents' confusion of the package as shipped (primary runtime, test split), row-normalised
    (edgekit.reporting.confusion); None for a build whose package stage has no scores by label."""
    by = ((pass_of(rep, "package") or {}).get("extra") or {}).get("by_label")
    if not by:
        return None
    from edgekit.reporting.confusion import confusion_plot

    return confusion_plot(by["confusion"], path, f"Intent confusion, {rep['dataset']['name']} {by['split']} "
                          f"(package, {by['runtime']})", by.get("oos"))


def latency_cdf(res: dict, path: Path) -> Path:
    """`edgekit compare`: the share of utterances answered within x ms, device against server (measured), and
    the server shifted by each modeled round trip (dashed)."""
    import numpy as np

    plt, fig, ax = figure()
    d, s = res["device"], res["server"]
    for label, ms, style in ((f"device ({d['runtime']}, {d['threads']} thread), measured", d["times_ms"], "-"),
                             ("server, one at a time over loopback HTTP, measured", s["times_ms"], "-")):
        x = np.sort(ms)
        ax.plot(x, 100 * np.arange(1, len(x) + 1) / len(x), style, label=label)
    for k, (name, rtt) in enumerate(res["network"]["rtt_ms"].items()):
        x = np.sort(s["times_ms"]) + rtt
        ax.plot(x, 100 * np.arange(1, len(x) + 1) / len(x), "--", color=f"C{k + 2}",
                label=f"server + {name} round trip {rtt:g} ms (modeled)")
    ax.set_xscale("log")
    ax.set_xlabel("latency per utterance (ms, log scale)")
    ax.set_ylabel("utterances answered within (%)")
    ax.set_title("Latency, device against server (test split)")
    ax.legend(loc="lower right", fontsize=8)
    return save(plt, fig, path)


def cascade_plot(res: dict, path: Path) -> Path:
    """`edgekit compare`: cascade accuracy and expected latency against the escalation rate (test), with the
    threshold chosen on dev marked and the device and server alone as reference lines."""
    plt, fig, ax = figure(h=5.2)
    c = res["cascade"]
    pts = c["test_curve"]
    x = [100 * p["escalation"] for p in pts]
    ch = c["test"]
    # the curve counts what calibration counted: exact match (intent and slots) with slots, else the intent
    what = c.get("counts", "intent")
    exact = ch.get("exact") if what == "exact match" else None
    alone = {side: exact[side] if exact else res[side]["accuracy"]["test"]["intent_acc"]
             for side in ("device", "server")}
    chosen = exact["cascade"] if exact else ch["accuracy"]["intent_acc"]
    ax.plot(x, [100 * p["accuracy"] for p in pts], "-", color="C0", label=f"cascade accuracy ({what})")
    ax.axhline(100 * alone["device"], color="C0", ls=":", label="device alone")
    ax.axhline(100 * alone["server"], color="C1", ls=":", label="server alone")
    ax.plot([100 * ch["escalation"]], [100 * chosen], "o", color="C3", markersize=8,
            label=f"τ = {c['threshold']:.3f} on {c.get('score', 'confidence')} (chosen on dev): "
                  f"{100 * ch['escalation']:.1f}% escalated")
    ax.set_xlabel("utterances escalated to the server (%)")
    ax.set_ylabel(f"test accuracy, {what} (%)")
    ax.set_xlim(0, min(100.0, max(10.0, 5 * 100 * ch["escalation"])))  # the trade-off sits at low escalation
    lo = min(100 * alone["device"], 100 * chosen) - 1
    hi = max([100 * p["accuracy"] for p in pts] + [100 * alone["server"]]) + 1
    ax.set_ylim(lo, min(100.2, hi))
    ax2 = ax.twinx()
    for k, name in enumerate(res["network"]["rtt_ms"]):
        ax2.plot(x, [p["expected_ms"][name] for p in pts], "--", color=f"C{k + 4}",
                 label=f"expected latency, {name} (modeled RTT)")
    ax2.set_ylabel("expected latency (ms)")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    # below the axes: inside, it hid the accuracy curve wherever it sat
    ax.legend(h1 + h2, l1 + l2, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=7)
    ax.set_title("Device-first cascade (test split)")
    return save(plt, fig, path)


def loadtest_timeline(res: dict, path: Path) -> Path | None:
    """`edgekit loadtest`: the requests that ended in each step of the run (failures stacked in red) and their p50
    and p99 latency; a burst profile shows each burst and the idle between. None for a run without a request."""
    tl = res.get("timeline") or {}
    if not tl.get("ok"):
        return None
    plt, fig, ax = figure(7.2, 4.2)
    t = [tl["step_s"] * (k + 0.5) for k in range(len(tl["ok"]))]
    ax.bar(t, tl["ok"], width=tl["step_s"] * 0.9, color="C0", alpha=0.35, label="answered")
    if any(tl["failed"]):
        ax.bar(t, tl["failed"], bottom=tl["ok"], width=tl["step_s"] * 0.9, color="C3", label="errors and timeouts")
    ax.set_xlabel("time into the run (s)")
    ax.set_ylabel(f"requests ended per {tl['step_s']:g} s")
    lat = ax.twinx()
    for q, style in (("p50", "-"), ("p99", "--")):
        lat.plot(t, tl[f"{q}_ms"], style, color="C1", marker=".", label=f"latency {q}")
    lat.set_ylabel("latency of the answered (ms)")
    lat.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + lat.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4,
              fontsize=8, frameon=False)
    ax.set_title(f"loadtest {res['profile']} (concurrency {res['concurrency']}): {res['throughput_rps']:.0f} req/s, "
                 f"p99 {res['latency_ms']['p99']} ms", fontsize=10)
    return save(plt, fig, path)


def write_plots(rep: dict, out: Path) -> dict[str, str]:
    """Every plot the report can draw, written into `out`; returns {kind: file name} for report.md to link."""
    from edgekit.reporting.frontier import frontier

    done = {}
    for kind, fn in (("oos", oos_curve), ("stages", stages), ("confusion", confusion), ("frontier", frontier)):
        if fn(rep, out / PLOTS[kind]) is not None:
            done[kind] = PLOTS[kind]
    return done
