"""report.md: a human-readable view of report.json (which is built from the pass records)."""

from __future__ import annotations


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.2f}"


def _size(n) -> str:
    if n is None:
        return "—"
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def render_markdown(rep: dict) -> str:
    """One comparison table (a row per stage), then package files and latency."""
    ds = rep["dataset"]
    oos = any("oos_recall" in r for r in rep["stages"])
    lines = [f"# edgekit build report: {ds['name']} → {rep['target']}", "",
             f"Task `{rep['task']}`, data `{ds['source']}` ({ds['format']}): "
             + ", ".join(f"{k} {v}" for k, v in ds["sizes"].items())
             + f"; {ds['intents']} intents, {ds['slot_tags']} slot tags. "
             + f"Sequence length {ds['lengths']['max_len']} (p99 of pieces {ds['lengths']['p99']:.0f}; "
             + f"{100 * ds['lengths']['truncated_share']:.2f}% of train+dev utterances truncated).", ""]
    for note in ds.get("notes", []):
        lines.append(f"- {note}")
    lines += ["", "## Stages (test split)", "",
              "| stage | intent acc | slot F1 | exact match |" + (" in-scope acc | OOS recall |" if oos else "")
              + " params | size | seconds |",
              "|---|---:|---:|---:|" + ("---:|---:|" if oos else "") + "---:|---:|---:|"]
    for r in rep["stages"]:
        name = r["name"] + (f" ({r['runtime']})" if r.get("runtime") else "")
        lines.append(f"| {name} | {_pct(r.get('intent_acc'))} | {_pct(r.get('slot_f1'))} | "
                     f"{_pct(r.get('exact_match'))} |"
                     + (f" {_pct(r.get('in_scope_acc'))} | {_pct(r.get('oos_recall'))} |" if oos else "")
                     + f" {r['params']:,} | {_size(r['size_bytes'])} | {r['seconds']:.1f} |")
    export = next((p for p in rep.get("passes", []) if p["name"] == "export"), None)
    if export:
        lines += ["", "## Exported artifacts against eager (test split)", "",
                  "| runtime | agreement (intent + all slot tags) | max abs diff (logits) | intent acc | slot F1 |",
                  "|---|---:|---:|---:|---:|"]
        for rt in ("executorch", "onnx"):
            if rt in export["extra"]:
                e = export["extra"][rt]
                lines.append(f"| {rt} | {_pct(e['extra']['agreement_with_eager'])} | "
                             f"{e['extra']['parity']['max_abs_diff']:.2e} | {_pct(e['metrics']['intent_acc'])} | "
                             f"{_pct(e['metrics'].get('slot_f1'))} |")
    if rep.get("package"):
        pk = rep["package"]
        lines += ["", "## Package", "",
                  f"Size for the primary runtime ({pk['runtime']}): **{_size(pk['size_bytes'])}** "
                  + "(" + ", ".join(f"{k}: {_size(v)}" for k, v in pk["size_bytes_per_runtime"].items()) + ").",
                  "", "| file | bytes |", "|---|---:|"]
        lines += [f"| {f} | {b:,} |" for f, b in pk["files"].items()]
    if rep.get("latency"):
        lines += ["", "## Latency (model call, single utterance, after warm-up, real test utterances)", "",
                  "| runtime | p50 ms | p99 ms | threads | sequence length |", "|---|---:|---:|---:|---:|"]
        for rt, lat in rep["latency"].items():
            lines.append(f"| {rt} | {lat['p50_ms']:.2f} | {lat['p99_ms']:.2f} | {lat['threads']} | {lat['max_len']} |")
        lines += ["", "Measured on the build machine's CPU through the ExecuTorch and ONNX Runtime Python bindings "
                  "(the same C++ runtimes an app links); no phone was measured."]
    warns = [w for p in rep.get("passes", []) for w in p.get("warnings", [])]
    if warns:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warns]
    return "\n".join(lines) + "\n"
