"""The README's SNIPS frontier: test intent accuracy and slot F1 against package bytes, edgekit's packages beside
published reference points.

Each edgekit group is one build setting over several distillation seeds, read from the builds' report.json (the
package stage's test figures as shipped, the primary runtime's bytes and p50): the mean is drawn, the seeds' range
as an error bar. Figures recorded from builds on another machine (docs/experiments.md) come in as --point.

    python examples/snips_frontier.py --group "2 MB, rank-64 table=B0,B1,B2" --group "1.06 MB, --max-latency=L" \\
        --point "4 MB, android today (3 seeds),4032553,98.24,94.13" --out docs/frontier.png

(B0-B2: the 2 MB builds of docs/experiments.md's 2026-12-07 entry, seeds 0-2; L: its --max-latency build.)

Reference points (REFERENCES, with their sources) are placed by their published size; where only parameters are
published they are counted at 32 bits (the papers report FP32 models), and the label says so. Intent-only models
have no slot point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# name, bytes, intent accuracy, slot F1 (None: intent-only), how the bytes were counted, source
REFERENCES = [
    ("JointBERT (BERT-base)", 110e6 * 4, 98.6, 97.0, "110 M params at FP32", "Chen et al. 2019, arXiv 1902.10909"),
    ("DistilBERT, joint", 66e6 * 4, 98.0, 96.1, "66 M params at FP32", "monologg/JointBERT's README"),
    ("LIDSNet (intent-only)", 0.63e6, 98.0, None, "0.63 MB", "Agarwal et al. 2021; size: Papers with Code"),
]


def group(label: str, folders: list[str]) -> dict:
    """One setting's seeds: {label, mb, intent, slot (means), *_range (min, max), p50_ms, n}."""
    reps = [json.loads((Path(f) / "report.json").read_text()) for f in folders]
    metrics = [next(p for p in r["passes"] if p["name"] == "package")["metrics"] for r in reps]
    if any(m.get("slot_f1") is None for m in metrics):
        raise SystemExit(f"{label}: a build without slots (this figure is SNIPS's, with slots)")
    intent = [100 * m["intent_acc"] for m in metrics]
    slot = [100 * m["slot_f1"] for m in metrics]
    size = [r["package"]["size_bytes"] for r in reps]
    p50 = [(r.get("latency") or {}).get(r["package"]["runtime"], {}).get("p50_ms") for r in reps]
    p50 = [p for p in p50 if p is not None]
    return {"label": label, "mb": max(size) / 1e6, "intent": statistics.mean(intent), "slot": statistics.mean(slot),
            "intent_range": (min(intent), max(intent)), "slot_range": (min(slot), max(slot)),
            "p50_ms": statistics.median(p50) if p50 else None, "n": len(reps)}


def point(spec: str) -> dict:
    """LABEL,BYTES,INTENT,SLOT: a setting's mean recorded in docs/experiments.md."""
    label, size, intent, slot = spec.rsplit(",", 3)
    return {"label": label, "mb": int(size) / 1e6, "intent": float(intent), "slot": float(slot),
            "intent_range": None, "slot_range": None, "p50_ms": None, "n": None}


def draw(ours: list[dict], out: Path) -> Path:
    """Two panels, intent accuracy over slot F1, against megabytes on a log axis; the 2 MB budget as a line."""
    from edgekit.reporting.figure import figure, save

    plt, fig, (ax_i, ax_s) = _two_panels(figure)
    for ax, key, name in ((ax_i, "intent", "test intent accuracy (%)"), (ax_s, "slot", "test slot F1 (%)")):
        for k, g in enumerate(sorted(ours, key=lambda g: g["mb"])):
            rng = g[f"{key}_range"]
            err = [[g[key] - rng[0]], [rng[1] - g[key]]] if rng else None
            ax.errorbar([g["mb"]], [g[key]], yerr=err, fmt="o", color="C3", capsize=3)
            note = g["label"] + (f"\n{g['n']} seed{'s' if g['n'] > 1 else ''}" if g["n"] else "") + \
                (f", p50 {g['p50_ms']:.2f} ms" if g["p50_ms"] is not None else "")
            # alternately above and below its point: neighbouring packages' notes do not overlap
            ax.annotate(note, (g["mb"], g[key]), textcoords="offset points", xytext=(6, 4 if k % 2 else -16),
                        fontsize=7)
        for label, size, intent, slot, how, _ in REFERENCES:
            y = intent if key == "intent" else slot
            if y is not None:
                right = size > 100e6  # near the right edge: the note goes to the left of its point
                ax.plot([size / 1e6], [y], "s", color="C0")
                ax.annotate(f"{label}\n({how}, published)", (size / 1e6, y), textcoords="offset points",
                            xytext=(-6 if right else 6, -4), fontsize=7, color="C0", ha="right" if right else "left")
        ax.axvline(2.0, color="C3", linestyle="--", alpha=0.5, label="2 MB: an app team's budget")
        ax.set_xscale("log")
        ax.set_xlim(0.4, 1000)
        ax.margins(y=0.15)
        ax.set_ylabel(name)
    ax_s.set_xlabel("model size (MB, log scale): edgekit's package as ExecuTorch ships it (model, tokenizer, labels,"
                    " manifest)")
    ax_i.set_title("SNIPS: edgekit packages (red, mean and seed range) and published models (blue)", fontsize=10)
    ax_i.legend(loc="lower right", fontsize=7)
    return save(plt, fig, out)


def _two_panels(figure):
    plt, fig, ax = figure(8.0, 6.4)
    fig.delaxes(ax)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for a in (top, bottom):
        a.grid(True, alpha=0.3)
    return plt, fig, (top, bottom)


def main() -> None:
    """Read the groups and points, print them as JSON lines, draw the figure."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", action="append", default=[], help="LABEL=DIR,DIR,...: one setting's seeds")
    ap.add_argument("--point", action="append", default=[], help="LABEL,BYTES,INTENT,SLOT from docs/experiments.md")
    ap.add_argument("--out", type=Path, default=Path("docs/frontier.png"))
    a = ap.parse_args()
    ours = [group(label, dirs.split(",")) for label, dirs in (g.split("=", 1) for g in a.group)]
    ours += [point(p) for p in a.point]
    for g in ours:
        print(json.dumps(g))
    print(draw(ours, a.out))


if __name__ == "__main__":
    main()
