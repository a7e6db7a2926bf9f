"""report.md: a human-readable view of report.json (which is built from the pass records)."""

from __future__ import annotations

from edgekit.record import AGAINST
from edgekit.reporting.common import pass_of as _pass
from edgekit.reporting.common import pct as _pct
from edgekit.reporting.common import size as _size
from edgekit.reporting.data_check import lines as data_check_lines
from edgekit.reporting.decoding import decoding_section
from edgekit.reporting.labels import by_label_section
from edgekit.runtime.package import RUNTIME_NAMES, RUNTIMES


def _header(rep: dict) -> list[str]:
    """Title, the dataset, its notes, over-budget warnings and the stages reused from the cache."""
    ds = rep["dataset"]
    lines = [f"# edgekit build report: {ds['name']} → {rep['target']}", "",
             f"Task `{rep['task']}`, data `{ds['source']}` ({ds['format']}): "
             + ", ".join(f"{k} {v}" for k, v in ds["sizes"].items())
             + f"; {ds['intents']} intents, {ds['slot_tags']} slot tags. "
             + f"Sequence length {ds['lengths']['max_len']} (p99 of pieces {ds['lengths']['p99']:.0f}; "
             + f"{100 * ds['lengths']['truncated_share']:.2f}% of train+dev utterances truncated).", ""]
    for note in ds.get("notes", []):
        lines.append(f"- {note}")
    strict = rep.get("config", {}).get("strict")
    for o in rep.get("over_budget") or []:
        if str(o.get("budget", "")).startswith("limits."):  # a size or latency budget ([limits]): held after the package
            lines += ["", f"**Over budget.** {o['message']}. The package is written as built; no setting was changed "
                      "to meet the budget (the passes' own settings decide the student's shape)."]
            continue
        lines += ["", f"**Over budget.** {o['message']}. "
                  + ("--strict: no package was written for this build. " if strict else
                     "The package is that best try. ")
                  + "A looser budget reuses this stage's tries from the stage cache."]
    lim = rep.get("limits") or {}
    if lim:
        said = []
        if "size" in lim:
            said.append(f"size {lim['size']['bytes']:,} bytes against {lim['size']['max_bytes']:,} "
                        f"({'met' if lim['size']['met'] else 'missed'}; {lim['size']['counts']})")
        if "latency" in lim:
            p50 = lim["latency"]["p50_ms"]
            said.append(f"p50 {'unmeasured' if p50 is None else f'{p50:.3f} ms'} against {lim['latency']['max_ms']:g} "
                        f"ms ({'met' if lim['latency']['met'] else 'missed'}; {lim['latency']['where']})")
        lines += ["", "Budgets ([limits]): " + "; ".join(said) + "."]
    ranking = (rep.get("search") or {}).get("ranking")
    if ranking:  # search.rank_epochs: the shortlist's brief distillations (edgekit/engine/rank.py)
        from edgekit.reporting.frontier import label

        cands = rep["search"]["candidates"]
        said = [f"{label(cands[r['index']])}: score {r['score']:.3f}" for r in ranking["candidates"]]
        lines += ["", f"Size search ranked by {ranking['epochs']}-epoch distillation ({ranking['seconds']:.0f} s; first "
                  f"how far past the dev budgets, then the drops in units of their budgets, summed): " + "; ".join(said) + f". Built: "
                  f"{label(cands[ranking['winner']])} (the prior's pick: {label(cands[ranking['prior']])})."]
    reused = [r["name"] for r in rep["stages"] if r.get("reused")]
    if reused:
        lines += ["", f"Reused from the stage cache (inputs and settings unchanged): {', '.join(reused)}; their "
                  "seconds are those of the run that made them."]
    return lines


def _stage_table(rep: dict) -> list[str]:
    """The comparison table, a row per stage, and the size-against-accuracy plot."""
    oos = any("oos_recall" in r for r in rep["stages"])
    rts = [rt for rt in RUNTIMES if any(rt in r.get("latency", {}) for r in rep["stages"])]
    lines = ["", "## Stages (test split)", "",
             "Decoded as the package answers (intent whitelist, constrained BIO decoding; out-of-scope rejection "
             "only in the package row); slot F1 argmax: the same model with plain per-word argmax."
             + (" Latency: model call, single utterance, 1 thread, after warm-up, real test utterances, all "
                "measured in one run by the package stage; only exported graphs have one (`edgekit bench "
                "--compare-teacher` times the FP32 teacher)." if rts else ""), "",
             "| stage | intent acc | slot F1 | slot F1 argmax | exact match |"
             + (" in-scope acc | OOS recall |" if oos else "") + " params | size | seconds |"
             + "".join(f" {RUNTIME_NAMES[rt]} p50 / p99 ms |" for rt in rts),
             "|---|---:|---:|---:|---:|" + ("---:|---:|" if oos else "") + "---:|---:|---:|" + "---:|" * len(rts)]
    distill = _pass(rep, "distill") or {}
    for r in rep["stages"]:
        name = r["name"] + (f" ({r['runtime']})" if r.get("runtime") else "")
        if r["name"] == "prune" and distill.get("extra", {}).get("shipped_prune"):
            name += " (first try; the shipped student was pruned less: see distill)"
        lat = r.get("latency", {})
        lines.append(f"| {name} | {_pct(r.get('intent_acc'))} | {_pct(r.get('slot_f1'))} | "
                     f"{_pct(r.get('slot_f1_argmax'))} | {_pct(r.get('exact_match'))} |"
                     + (f" {_pct(r.get('in_scope_acc'))} | {_pct(r.get('oos_recall'))} |" if oos else "")
                     + f" {r['params']:,} | {_size(r['size_bytes'])} | {r['seconds']:.1f} |"
                     + "".join(f" {lat[rt]['p50_ms']:.2f} / {lat[rt]['p99_ms']:.2f} |" if rt in lat else " — |"
                               for rt in rts))
    if "stages" in rep.get("plots", {}):
        lines += ["", f"![size against accuracy by stage]({rep['plots']['stages']})"]
    return lines


def _exported(rep: dict) -> list[str]:
    """Each runtime's export scored against the eager model."""
    export = _pass(rep, "export")
    if not export:
        return []
    lines = ["", "## Exported artifacts against eager (test split)", "",
             "| runtime | against eager | agreement (intent + all slot tags) | max abs diff (logits) | "
             "intent acc | slot F1 |", "|---|---|---:|---:|---:|---:|"]
    for rt in RUNTIMES:
        if rt in export["extra"]:
            e = export["extra"][rt]
            against = AGAINST.get(e["extra"].get("against"), "—")  # older records do not say
            lines.append(f"| {rt} | {against} | {_pct(e['extra']['agreement_with_eager'])} | "
                         f"{e['extra']['parity']['max_abs_diff']:.2e} | {_pct(e['metrics']['intent_acc'])} | "
                         f"{_pct(e['metrics'].get('slot_f1'))} |")
    return lines


def _package_files(rep: dict) -> list[str]:
    """The package's size per runtime and its files."""
    if not rep.get("package"):
        return []
    pk = rep["package"]
    return ["", "## Package", "",
            f"Size for the primary runtime ({pk['runtime']}): **{_size(pk['size_bytes'])}** "
            + "(" + ", ".join(f"{k}: {_size(v)}" for k, v in pk["size_bytes_per_runtime"].items()) + ").",
            "", "| file | bytes |", "|---|---:|"] + [f"| {f} | {b:,} |" for f, b in pk["files"].items()]


def _latency(rep: dict) -> list[str]:
    """The package's single-utterance latency per runtime, with and without the decoding graph."""
    if not rep.get("latency"):
        return ["", "## Latency", "", "Not measured (`package.bench_utterances = 0`)."] if rep.get("package") else []
    lines = ["", "## Latency (model call, single utterance, after warm-up, real test utterances)", "",
             "| runtime | p50 ms | p99 ms | p50 ms without decoding | decoding overhead (p50) | threads | "
             "sequence length (utterances run at it) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for rt, lat in rep["latency"].items():
        raw = lat.get("without_decoding")
        lengths = (", ".join(f"{L} ({n})" for L, n in lat["buckets"].items()) if lat.get("buckets")
                   else str(lat["max_len"]))
        lines.append(f"| {rt} | {lat['p50_ms']:.2f} | {lat['p99_ms']:.2f} | "
                     + (f"{raw['p50_ms']:.2f} | {100 * lat['decoding_overhead']:+.1f}% |" if raw else "— | — |")
                     + f" {lat['threads']} | {lengths} |")
    return lines + ["", "Measured on the build machine's CPU through the ExecuTorch and ONNX Runtime Python "
                    "bindings (the same C++ runtimes an app links); no phone was measured."
                    + ("" if any("without_decoding" in v for v in rep["latency"].values()) else
                       " The graph without decoding was not exported (`decoding.compare_argmax = false`).")]


def _provider(rep: dict) -> list[str]:
    """The execution provider the shipped package was scored on, when the package names one."""
    if not (pkg := rep.get("package", {})).get("provider"):
        return []
    runtime = RUNTIME_NAMES.get(pkg.get("runtime"), pkg.get("runtime"))
    return ["", f"The shipped package was scored on {runtime}, provider {pkg['provider']}."]


def _warnings(rep: dict) -> list[str]:
    """Every pass's warnings."""
    warns = [w for p in rep.get("passes", []) for w in p.get("warnings", [])]
    return ["", "## Warnings", ""] + [f"- {w}" for w in warns] if warns else []


def _tries(p: dict) -> list[str]:
    out = []
    for k, t in enumerate(p["extra"].get("tries", []), 1):
        drops = ", ".join(f"{k2} {v:.2f}" for k2, v in t["drops"].items())
        r = t.get("dev", {}).get("rejecting")  # out-of-scope data: the intent drop is judged with rejection on
        how = (f" (rejection on: in scope {100 * r['in_scope_acc']:.2f}, out-of-scope recall "
               f"{100 * r['oos_recall']:.1f})" if r else "")
        out.append(f"  - try {k}: {t['setting']}: dev drop {drops}{how} → {'pass' if t['passed'] else 'back off'}")
    return out


def _compression(rep: dict) -> list[str]:
    passes = {p["name"]: p for p in rep.get("passes", [])}
    if not any(n in passes for n in ("trim_vocab", "prune", "distill")):
        return []
    teacher = passes.get("teacher")
    lines = ["", "## Compression", ""]
    settings = rep.get("config", {}).get("settings")
    if settings:
        c, d = settings["compress"], settings["distill"]
        lines.append(f"Settings: vocabulary budget {c.get('vocab_budget') or 'none'}, parameter share "
                     f"{c.get('param_share')} (non-embedding) / {c.get('total_share')} (total), back-off caps "
                     f"{c.get('max_param_share') or c.get('param_share')} / "
                     f"{c.get('max_total_share') or c.get('total_share')}"
                     f", distillation T = {d.get('temperature')}, α = {d.get('alpha')}, {d.get('epochs')} epochs"
                     + (", slot head on the mean of each word's pieces" if d.get("word_pool") else "") + "; "
                     f"accuracy budget against the teacher on dev: {rep.get('budget', {})}.")
        lines.append("")
    a = (teacher or {}).get("extra", {}).get("assistant")
    if a:  # distill.assistant: the build's teacher learned from distill.teacher first
        f, t = a["fine_tuned"], a["taught_by"]
        lines.append(f"- **teacher assistant**: the fine-tuned teacher ({f['key']}: test intent "
                     f"{_pct(f['test']['intent_acc'])}%, slot F1 {_pct(f['test'].get('slot_f1'))}%) distilled from "
                     f"`{t['base']}` ({t['key']}) for {a['epochs']} epochs at lr {a['lr']}, on {a['augmented']:,} "
                     f"extra utterances; the student is pruned from it and learns from it.")
    if "trim_vocab" in passes:
        e = passes["trim_vocab"]["extra"]
        # vocab_task counts the base words too when they are kept
        whole = "task and base vocabulary" if e.get("base_words") else "task vocabulary"
        lines.append(f"- **trim_vocab**: {e['vocab_before']:,} → {e['vocab_after']:,} pieces ({whole} "
                     f"{e['vocab_task']:,}, budget {e['budget'] or 'none'}"
                     + (f"; the base vocabulary's {e['base_words']:,} most frequent words kept beside it, "
                        f"{e['base_pieces_added']:,} of them new" if e.get("base_words") else "") + "); word embedding "
                     f"{_size(e['embedding_bytes_before'])} → {_size(e['embedding_bytes_after'])}. Tokenization "
                     f"equal to the teacher's on {_pct(e['tokenization_agreement_full'])}% of task utterances at "
                     f"the full task vocabulary"
                     + (f", {_pct(e['tokenization_agreement_budget'])}% under the budget" if e["budget"] else "")
                     + f". Test intent agreement with the teacher: {_pct(e.get('intent_agreement_with_teacher'))}%.")
        if e.get("full_vocab"):
            fv, bt = e["full_vocab"]["test"], passes["trim_vocab"]["metrics"]
            lines.append(f"  - cost of the budget (test): full task vocabulary ({e['full_vocab']['vocab']:,} pieces, "
                         f"{e['full_vocab']['params']:,} params) intent {_pct(fv['intent_acc'])} / slot F1 "
                         f"{_pct(fv.get('slot_f1'))}; budgeted ({e['vocab_after']:,} pieces) intent "
                         f"{_pct(bt['intent_acc'])} / slot F1 {_pct(bt.get('slot_f1'))}.")
        lines += _tries(passes["trim_vocab"])
    if "prune" in passes:
        e = passes["prune"]["extra"]
        lines.append(f"- **prune**: non-embedding parameters {e['nonembedding_before']:,} → "
                     f"{e['nonembedding_after']:,} (target {e['target_params']:,}); layers {e['layers_before']} → "
                     f"{e['layers_after']} (kept {e['kept_layers']}); heads per layer {e['heads']}; FFN channels "
                     f"per layer {e['ffn']}. Dev before distillation: intent {_pct(e['dev']['intent_acc'])}, slot F1 "
                     f"{_pct(e['dev'].get('slot_f1'))}.")
    if "distill" in passes:
        e = passes["distill"]["extra"]
        lines.append(f"- **distill**: best epoch {e.get('best_epoch')} of {e['epochs']}; student non-embedding "
                     f"parameters {_pct(e['share_of_teacher_nonembedding'])}% of the teacher's, all parameters "
                     f"{_pct(e['share_of_teacher_total'])}%"
                     + (f" ({passes['distill']['params_after']:,} of {teacher['params_after']:,})" if teacher else "")
                     + ".")
        if e.get("unlabelled"):
            lines.append(f"- {e['unlabelled']:,} unlabelled utterances (`distill.unlabelled`), labelled by the "
                         "teacher, beside the augmented ones.")
        if e.get("teacher"):  # distill.teacher: another base model taught
            t = e["teacher"]
            lines.append(f"- taught by `{t['base']}` (teacher {t['key']}, dev intent {_pct(t['dev']['intent_acc'])}, "
                         f"slot F1 {_pct(t['dev'].get('slot_f1'))})"
                         + (f"; its hidden states of layers {e['layer_map']}" if e.get("layer_map") else "")
                         + (" through projections {} → {}".format(*e["hidden_projection"])
                            if e.get("hidden_projection") else "")
                         + f"; its outputs {'reused' if t['targets_reused'] else 'stored'} ({t['targets_key']}).")
        lines += _tries(passes["distill"])
    return lines


def _quantization(rep: dict) -> list[str]:
    """What was quantized for each runtime: XNNPACK's INT8 (quantize stage), with what fell back to FP32 and why
    and the 10 least accurate layers, and ONNX Runtime's own pass on its export (export stage)."""
    q, export = _pass(rep, "quantize"), _pass(rep, "export")
    oq = export and export["extra"].get("onnx", {}).get("extra", {}).get("quantize")
    if not q and not oq:
        return []
    weight_only = oq and oq["method"] == "weight_only"
    lines = ["", "## Quantization (8-bit weights)" if weight_only and not q else "## Quantization (INT8)", ""]
    if q:
        lines += _xnnpack_int8(q)
    emb4 = (f"; word embeddings 4-bit in groups of {oq['embedding']['group']} (GatherBlockQuantized)"
            if oq and oq.get("embedding") else "; word embeddings FP32")
    if weight_only:
        n, n4 = oq["quantized_matmuls"], oq.get("weight4_matmuls") or 0  # onnx_linear_bits 4: weight4's at 4 bits
        eight = f"{oq['weight_bits']}-bit weights in blocks of {oq['block']}"
        four = f"4-bit weights in blocks of {oq.get('weight4_block')}"
        bits = eight if not n4 else four if n4 >= n else f"{n4} with {four} and the rest with {eight}"
        lines.append(f"- ONNX Runtime (weight only, quantize.onnx_weight_only): {n} MatMuls, {bits}, FP32 "
                     f"activations (MatMulNBits), nothing calibrated" + emb4 + ".")
    elif oq:
        lines.append(f"- ONNX Runtime (quantize_static, QDQ, per-channel): {oq['quantized_matmuls']} MatMul/Gemm "
                     f"layers, calibration {oq['method']}"
                     + (f" {oq['percentile']}" if oq.get("percentile") else "") + f" on {oq['calib_samples']} "
                     f"utterances; nodes {oq['nodes_before']} → {oq['nodes_after']} (QDQ pairs added)" + emb4 + ".")
    rows = q["extra"].get("quant_layers", [])[:10] if q else []
    if rows:
        lines += ["", "Least accurate layers (isolated: each fed the FP32 model's input; all layers in report.json "
                  "`quant_layers`):", "", "| layer | weight bits | SQNR dB | activation scale | zero point | "
                  "output scale | weight scale min / mean / max |", "|---|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            act = (f"{r['act_scale']:.4g} | {r['act_zero_point']}" if r.get("act_scale") is not None
                   else "per call | per call")
            lines.append(f"| {r['layer']} | {r.get('weight_bits', 8)} | {r['sqnr_db']:.1f} | {act} | "
                         + (f"{r['out_scale']:.4g}" if r["out_scale"] is not None else "—")
                         + f" | {r['weight_scale_min']:.3g} / {r['weight_scale_mean']:.3g} / "
                         f"{r['weight_scale_max']:.3g} |")
    return lines


def _xnnpack_int8(q: dict) -> list[str]:
    """The quantize stage: XNNPACK's INT8 eager model (PT2E), its tries and its FP32 fallbacks."""
    e = q["extra"]
    emb = e.get("embedding") or {}
    lines = [f"ExecuTorch/XNNPACK (PT2E, XNNPACKQuantizer): {e['quantized_linears']} of {e['linears']} Linear layers "
             f"INT8 (per-channel weights, activations calibrated on {e['calib_samples']} train utterances"
             + (f"; {len(e['weight4_layers'])} of them with 4-bit weights and INT8 input quantized per call, "
                "XNNPACK qd8-f32-qc4w" if e.get("weight4_layers") else "") + "); "
             + (f"word embeddings {emb['bits']}-bit" + (f" in groups of {emb['group']}" if emb.get("group") else "")
                + f" (SQNR {emb['sqnr_db']} dB)" if emb else "word embeddings FP32")
             + f"; weights {_size(q['bytes_before'])} → {_size(q['bytes_after'])}. Attention products, softmax and "
             "LayerNorm stay FP32."]
    for t in e.get("tries", []):
        lines.append(f"- {len(t['fp32_layers'])} layers FP32: dev drop against the FP32 model "
                     + ", ".join(f"{k} {v:.2f} pts" for k, v in t["drop_pts"].items()))
    for f in e.get("fp32_layers", []):
        lines.append(f"- FP32 fallback `{f['layer']}`: {f['why']}")
    return lines


def _fusion(rep: dict) -> list[str]:
    """Fixed-shape fusion: ONNX Runtime's offline optimizations, and XNNPACK's share of ExecuTorch compute ops."""
    fuse = _pass(rep, "fuse")
    if not fuse:
        return []
    lines = []
    et = fuse["extra"].get("executorch", {})
    raw = et.get("raw_delegation")
    if "delegated_share" in et:
        lines.append(f"- ExecuTorch: {_pct(et['delegated_share'])}% of compute ops in XNNPACK "
                     f"({et['delegated_compute_ops']} delegated, {et['portable_compute_ops']} portable; data "
                     "movement not counted)"
                     + (f"; the model without the decoding graph: {_pct(raw['delegated_share'])}% "
                        f"({raw['delegated_compute_ops']} / {raw['portable_compute_ops']})" if raw else "")
                     + f"; {et.get('delegate_calls')} delegate calls.")
    on = fuse["extra"].get("onnx")
    if on and "fused" in on:  # a server graph: the transformer optimizer, then its precision
        fused = ", ".join(f"{k} {v}" for k, v in on["fused"].items())
        q = on.get("int8")
        lines.append(f"- ONNX Runtime transformer optimizer (bert): fused {fused}; fully optimized: "
                     f"{'yes' if on['fully_optimized'] else 'no'}; nodes {on['nodes_before']} → {on['nodes_after']}.")
        lines.append(f"- precision {on['precision']}"
                     + (f" ({q['mode']} INT8: " + ", ".join(f"{k} {v}" for k, v in q["quantized_ops"].items()) + ")"
                        if q else "")
                     + (f"; the decoding graph's {on['fp32_nodes']} nodes stay FP32" if on.get("fp32_nodes") else "")
                     + (f"; on this CPU ONNX Runtime added {on['cpu_casts_inserted']} Cast nodes around FP16 nodes "
                        "without a CPU kernel" if on.get("cpu_casts_inserted") else "")
                     + f". Answers equal to the FP32 export's on {_pct(on['agreement'])}% of {on['checked']} test "
                     "utterances"
                     + (f"; answered in batches of {on['batch_parity']['batch']}, "
                        f"{_pct(on['batch_parity']['agree'])}% equal to one by one" if on.get("batch_parity") else "")
                     + ".")
    elif on:
        lines.append(f"- ONNX Runtime, offline graph optimization (extended): nodes {on['nodes_before']} → "
                     f"{on['nodes_after']}; fused against unfused on {on['checked']} test utterances: "
                     f"{_pct(on['agreement'])}% identical answers.")
    if len(fuse["extra"].get("tries", [])) > 1:  # a precision lost more than the budget against the unfused graph
        lines += ["- dev answers against the unfused graph's, by precision tried:"] + _tries(fuse)
    return ["", "## Fusion (fixed shapes)", ""] + lines if lines else []


def _batches(rep: dict) -> list[str]:
    """A server package's throughput by batch size, and the provider that ran."""
    rows = [(rt, lat["batches"]) for rt, lat in rep.get("latency", {}).items() if lat.get("batches")]
    if not rows:
        return []
    lines = ["", "## Batched throughput", "", "| runtime | provider | threads | batch | p50 ms per batch | "
             "utterances/s |", "|---|---|---:|---:|---:|---:|"]
    for rt, b in rows:
        for size, v in b.items():
            if isinstance(v, dict):
                lines.append(f"| {rt} | {b['provider']} | {b['threads']} | {size} | {v['p50_ms']:.2f} | "
                             f"{v['per_second']:.0f} |")
    return lines + ["", "The model call alone, on the build machine; `edgekit serve` adds HTTP and queueing "
                    "(`edgekit loadtest` measures the whole)."]


def _profile(rep: dict) -> list[str]:
    """`edgekit profile`'s top 10 ops, when it was run on this package."""
    p = rep.get("profile")
    if not p:
        return []
    lines = ["", f"## Hotspots ({p['runtime']}, `edgekit profile`)", "",
             f"{p['runs']} test utterances, {p['threads']} thread(s): {p['ms_per_run']:.3f} ms per call under the "
             f"profiler; the ops explain {100 * p['covered']:.0f}% of it (the rest is the session's work between "
             "nodes). Share: of the ops' summed time." + (f" {p['note']}." if p.get("note") else ""), "",
             "| op | runs per call | ms per call | share |", "|---|---:|---:|---:|"]
    return lines + [f"| {r['op']} | {r['count']:g} | {r['ms_per_run']:.4f} | {100 * r['share']:.1f}% |"
                    for r in p["rows"]]


# report.md, section by section: each renderer takes report.json's dict and gives its lines (none when the build
# has nothing to show there), each section but the header starting with a blank line.
SECTIONS = (_header, _stage_table, by_label_section, data_check_lines, _compression, _quantization, _exported, _fusion,
            decoding_section, _profile, _package_files, _latency, _batches, _provider, _warnings)


def render_markdown(rep: dict) -> str:
    """The header, one comparison table (a row per stage), what each pass did, then package files and latency."""
    return "\n".join(line for section in SECTIONS for line in section(rep)) + "\n"
