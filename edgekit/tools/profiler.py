"""`edgekit profile OUT`: where a package's time goes, op by op, on its runtime.

ONNX Runtime: its own profiler (`SessionOptions.enable_profiling`), one event per node run; ops are grouped by
type and their time is set against the measured `model_run` total, so the shares say how much of a call the
listed ops explain (the rest is the session's own work between nodes).

ExecuTorch: per-op times come from ETDump (`enable_etdump=True` at load, read with
`executorch.devtools.Inspector`), which needs a runtime built with the event tracer
(`EXECUTORCH_ENABLE_EVENT_TRACER`). The PyPI wheel is built without it, so there the ETDump is empty and the
package's ONNX model is profiled instead, with a warning that says so. (Reading a real ETDump through the
Inspector is not wired in: no runtime here writes one to test it against.)
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from edgekit.errors import EdgekitError

log = logging.getLogger("edgekit")


def etdump_available(pte: Path, inputs: list) -> bool:
    """True when this ExecuTorch runtime writes per-op events (a build with the event tracer)."""
    import torch
    from executorch.extension.pybindings import portable_lib

    with tempfile.TemporaryDirectory() as d:
        data = Path(pte).read_bytes()  # alive as long as the module: it runs from these bytes, never a mapping
        m = portable_lib._load_for_executorch_from_buffer(data, enable_etdump=True)
        m.run_method("forward", [torch.from_numpy(x) for x in inputs])
        m.write_etdump_result_to_file(str(Path(d) / "run.etdp"))
        return (Path(d) / "run.etdp").is_file()


def profile_onnx(model: Path, inputs: list[list], threads: int = 1, warmup: int = 20,
                 disabled_optimizers: list[str] | None = None) -> dict:
    """Per-op-type time of `model` over `inputs` (one run each, after `warmup` unprofiled-in-the-totals runs).
    disabled_optimizers: as the package's sessions leave out (the manifest's `onnx_disabled_optimizers`)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.enable_profiling, so.profile_file_prefix = True, str(Path(d) / "ort")
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=disabled_optimizers or [])
        names = [i.name for i in sess.get_inputs()]
        for x in inputs[:warmup] + inputs:
            sess.run(None, dict(zip(names, x)))
        events = json.loads(Path(sess.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    if len(runs) < warmup + len(inputs):
        raise EdgekitError("ONNX Runtime's profile has fewer runs than were made")
    start = runs[warmup]["ts"]  # events of the warm-up runs are left out
    measured = [e for e in events if e.get("ts", 0) >= start]
    total_us = sum(e["dur"] for e in measured if e.get("name") == "model_run")
    ops: dict[str, list] = {}
    for e in measured:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            ops.setdefault(op, [0, 0.0])
            ops[op][0] += 1
            ops[op][1] += e["dur"]
    n, op_us = len(inputs), sum(us for _, us in ops.values())
    # share: of the ops' summed time (the column sums to 100%); covered: how much of the measured model_run time
    # the ops explain (the rest is the session's own work between nodes, which profiling inflates)
    rows = [{"op": op, "count": c / n, "ms_per_run": us / 1000 / n, "share": us / op_us}
            for op, (c, us) in sorted(ops.items(), key=lambda kv: -kv[1][1])]
    return {"runs": n, "ms_per_run": total_us / 1000 / n, "rows": rows, "covered": op_us / total_us}


def profile(package: Path, texts: list[str], runtime: str | None = None, threads: int = 1) -> dict:
    """The package's hotspots on `runtime` (default: its primary), as profile.json's content."""
    from edgekit.runtime import Package, Predictor

    pkg = Package.load(package)
    runtime = runtime or pkg.manifest["primary_runtime"]
    if runtime not in pkg.manifest["models"]:
        raise EdgekitError(f"{package}: no {runtime} model in this package")
    note = None
    if runtime == "executorch":
        pred = Predictor.open(pkg, "executorch")
        x = pred.inputs(pred.tokenizer.encode(texts[0], pkg.max_len))
        if etdump_available(pkg.model_path("executorch"), x):  # never the case with the PyPI wheel
            raise EdgekitError("reading ETDump per-op times (executorch.devtools.Inspector) is not wired in yet; "
                               "--runtime onnx profiles the package's ONNX model")
        if "onnx" not in pkg.manifest["models"]:
            raise EdgekitError("this ExecuTorch runtime has no event tracer (ETDump is empty): rebuild it with "
                               "EXECUTORCH_ENABLE_EVENT_TRACER=ON to profile a .pte op by op")
        note = ("ExecuTorch: this runtime was built without the event tracer (ETDump is empty; the PyPI wheel "
                "is), so the package's ONNX model, the same graph and decoding, was profiled instead")
        log.warning(note)
        runtime = "onnx"
    pred = Predictor.open(pkg, runtime)
    inputs = [pred.inputs(pred.tokenizer.encode(t, pkg.max_len)) for t in texts]
    if runtime == "onnx" and pkg.dynamic_seq:  # as the runtime sends them
        from edgekit.runtime.backends import cut

        inputs = [cut(x) for x in inputs]
    res = profile_onnx(pkg.model_path("onnx"), inputs, threads,
                       disabled_optimizers=pkg.onnx_disabled_optimizers)
    return {"package": str(package), "runtime": runtime, "threads": threads, "note": note} | res


def table(res: dict, package: Path):
    """The hotspot table (rich): op, runs per call, ms per call, share."""
    from rich.table import Table

    t = Table(title=f"{package} on {res['runtime']}: {res['ms_per_run']:.3f} ms per call under the profiler; "
                    f"ops explain {100 * res['covered']:.0f}% of it")
    for col in ("op", "per call", "ms per call", "share"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for r in res["rows"]:
        t.add_row(r["op"], f"{r['count']:g}", f"{r['ms_per_run']:.4f}", f"{100 * r['share']:.1f}%")
    return t


def add_to_report(package: Path, res: dict) -> bool:
    """The top 10 into the package's report.json, and report.md rendered again from it; False without a report."""
    from edgekit.io import write_json, write_text
    from edgekit.reporting.markdown import render_markdown
    from edgekit.runtime.jsonfile import REPORT_BYTES, read_json

    path = Path(package) / "report.json"
    if not path.is_file():
        return False
    try:
        rep = read_json(path, REPORT_BYTES, "report")
    except ValueError as e:  # not a report of ours: leave it as it is
        raise EdgekitError(f"{path}: cannot add the profile to it ({e})") from None
    if not isinstance(rep, dict):
        raise EdgekitError(f"{path}: not a build report (a JSON object)")
    rep["profile"] = {k: v for k, v in res.items() if k != "rows"} | {"rows": res["rows"][:10]}
    write_json(path, rep)
    write_text(Path(package) / "report.md", render_markdown(rep))
    return True
