"""`edgekit compare DEVICE SERVER --data DATA`: the device package and a server, on the same utterances in the
same run, side by side, and the device-first cascade between them.

- Device: the package in this process through edgekit.runtime, at its profile's thread count; one utterance per
  call (tokenize, model, decode), after warm-up.
- Server: `edgekit serve` over real HTTP on loopback (started here from a package folder and stopped after, or
  a URL), one request at a time and under the `high` load-test profile.
- Network: modeled, never measured: the device profile's `[network]` round-trip times added to the measured
  server time, and labelled as modeled.
- Cascade: the device answers; below τ on its score (`path_confidence` in a schema 4 package with slots, else
  `confidence`) the server does. τ is chosen on dev (the fewest escalations whose accuracy, exact match with
  slots, is within `cascade.max_gap_pts` of the server alone) and reported on test (edgekit.tools.cascade).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgekit.errors import EdgekitError
from edgekit.runtime.cascade import DEFAULT_TIMEOUT_S
from edgekit.runtime.latency import summary
from edgekit.runtime.package import MANIFEST


@dataclass
class CompareConfig:
    """How much to measure. latency_n: test utterances timed one by one on each side (after `warmup`);
    load_seconds: the `high` load test's length."""

    latency_n: int = 300
    warmup: int = 20
    load_profile: str = "high"
    load_seconds: float = 20.0

    def __post_init__(self):
        if self.latency_n < 10 or self.warmup < 0 or self.load_seconds <= 0:
            raise ValueError("latency_n must be >= 10, warmup >= 0 and load_seconds > 0")


# compare.json's latency summaries: {"p50": ..., "p90": ..., "p99": ..., "n": ...}, in ms, not rounded
QUANTILES = (50, 90, 99)


# -- the server -----------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 30.0,
             conn: http.client.HTTPConnection | None = None) -> tuple[int, bytes]:
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if conn is None:
        c.close()
    return r.status, data


@contextmanager
def server_for(target: str, log=print):
    """Yields the base URL of a server: `target` itself when it is a URL, else `edgekit serve target` on a free
    loopback port, stopped (SIGTERM, every process it started) when the block ends."""
    if target.startswith(("http://", "https://")):
        from edgekit.serve.loadtest import check_loopback

        check_loopback(target)
        yield target.rstrip("/")
        return
    port = _free_port()
    log(f"starting edgekit serve {target} on 127.0.0.1:{port}")
    proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "serve", target, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        from edgekit.serve.metrics import wait_for_replicas

        if not wait_for_replicas(port, lambda: proc.poll() is None, 240):
            if proc.poll() is not None:
                raise EdgekitError(f"edgekit serve {target} exited: {proc.stdout.read()[-2000:].strip()}")
            raise EdgekitError(f"edgekit serve {target}: not every replica answered /healthz within 240 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def server_answers(url: str, texts: list[str], batch: int = 16) -> list[dict]:
    """Every utterance answered by the server (POST /predict_batch), in order."""
    port = urlsplit(url).port
    out = []
    for s in range(0, len(texts), batch):
        status, data = _request(port, "POST", "/predict_batch", {"texts": texts[s:s + batch]}, timeout=120)
        if status != 200:
            raise EdgekitError(f"{url}/predict_batch answered {status}: {data[:300].decode(errors='replace')}")
        out += json.loads(data)["results"]
    return out


def server_latency(url: str, texts: list[str], warmup: int) -> list[float]:
    """Milliseconds per request, one at a time on one kept-alive connection (POST /predict)."""
    conn = http.client.HTTPConnection("127.0.0.1", urlsplit(url).port, timeout=30)
    times = []
    for k, t in enumerate(texts[:warmup] + texts):
        t0 = time.perf_counter()
        status, _ = _request(0, "POST", "/predict", {"text": t}, conn=conn)
        if status != 200:
            raise EdgekitError(f"{url}/predict answered {status}")
        if k >= warmup:
            times.append((time.perf_counter() - t0) * 1000)
    conn.close()
    return times


# -- the whole comparison -------------------------------------------------------------------------------------


def _report(package: Path) -> dict:
    """The package's report.json ({} without a readable one: the comparison then lacks the build's figures)."""
    from edgekit.runtime.jsonfile import REPORT_BYTES, read_json

    try:
        rep = read_json(Path(package) / "report.json", REPORT_BYTES, "report")
    except (OSError, ValueError):
        return {}
    return rep if isinstance(rep, dict) else {}


def device_side(package: Path, data, cfg: CompareConfig, log=print) -> dict:
    """Answers (as shipped) on dev and test, and single-utterance latency on test, in this process."""
    from edgekit.runtime import Package, Predictor
    from edgekit.runtime.backends import set_threads

    pkg = Package.load(package)
    rep = _report(package)
    threads = int(rep.get("latency", {}).get(pkg.manifest["primary_runtime"], {}).get("threads", 1))
    runtime = pkg.manifest["primary_runtime"]
    if runtime == "executorch":
        set_threads(threads)  # XNNPACK's pool: before the program loads
    pred = Predictor.open(pkg, runtime, threads=threads)
    log(f"device: {package} on {runtime}, {threads} thread(s)")
    answers = {s: [pred.predict(ex.text, warn=False) for ex in data.splits[s]] for s in ("dev", "test")}
    texts = [ex.text for ex in data.splits["test"]][: cfg.latency_n]
    for t in texts[: cfg.warmup]:
        pred.predict(t, warn=False)
    times = []
    for t in texts:
        t0 = time.perf_counter()
        pred.predict(t, warn=False)
        times.append((time.perf_counter() - t0) * 1000)
    settings = rep.get("config", {}).get("settings", {})
    return {"package": str(package), "runtime": runtime, "threads": threads, "answers": answers,
            "latency_ms": summary(times, QUANTILES, suffix=""), "times_ms": times,
            "size_bytes": rep.get("package", {}).get("size_bytes"),
            "profile": pkg.manifest.get("profile"),
            "network": settings.get("network") or _profile_table(pkg.manifest.get("profile"), "network"),
            "cascade": settings.get("cascade") or _profile_table(pkg.manifest.get("profile"), "cascade")}


def _profile_table(profile: str | None, table: str) -> dict:
    """A table of the named built-in profile (a package built before the table existed records none)."""
    from edgekit.engine.targets import available, load_target

    return load_target(profile).tables.get(table, {}) if profile in available() else {}


def server_side(target: str, data, cfg: CompareConfig, log=print) -> dict:
    """Answers on dev and test, latency one request at a time, and the load test, against a real server."""
    from edgekit.serve import loadtest

    out = {"target": target}
    if not target.startswith(("http://", "https://")):
        out["size_bytes"] = _report(Path(target)).get("package", {}).get("size_bytes")
    with server_for(target, log) as url:
        out["url"] = url
        out["answers"] = {s: server_answers(url, [ex.text for ex in data.splits[s]]) for s in ("dev", "test")}
        texts = [ex.text for ex in data.splits["test"]][: cfg.latency_n]
        out["times_ms"] = server_latency(url, texts, cfg.warmup)
        out["latency_ms"] = summary(out["times_ms"], QUANTILES, suffix="")
        log(f"server: {url}, one at a time p50 {out['latency_ms']['p50']:.2f} ms; `{cfg.load_profile}` load for "
            f"{cfg.load_seconds:g} s")
        lt = loadtest.run(url, [ex.text for ex in data.splits["test"]], cfg.load_profile, cfg.load_seconds,
                          progress=False)
        out["load"] = {k: lt[k] for k in ("profile", "concurrency", "requests", "errors", "timeouts",
                                          "throughput_rps", "latency_ms")}
    return out


def compare(device: Path, server: str, data_path: str, cfg: CompareConfig, log=print, fmt: str | None = None) -> dict:
    """The whole comparison as compare.json's content (see docs/compare.md). fmt: the data format (default:
    detected)."""
    from edgekit.data.dataset import build_seed, load_dataset
    from edgekit.errors import DataError
    from edgekit.scoring.score import labels_of, score
    from edgekit.tools.cascade import calibrate, expected_latency

    seed = build_seed(device)
    data = load_dataset(data_path, fmt, seed)  # splits the data lacks: as the device's build made them
    empty = [s for s in ("dev", "test") if not data.splits[s]]
    if empty:
        raise DataError(data_path, None, f"the {empty[0]} split is empty: compare calibrates the cascade on dev "
                                         "and measures test")
    other = build_seed(server) if not server.startswith(("http://", "https://")) else seed
    if data.split_from_train and other is not None and other != seed:
        log(f"warning: the device was built with --seed {seed}, the server with --seed {other}: {data_path} has no "
            f"{' or '.join(data.split_from_train)} split, so the server is scored partly on utterances it trained on")
    labels = labels_of(data)
    dev = device_side(device, data, cfg, log)
    srv = server_side(server, data, cfg, log)
    acc = {side: {s: score(data.splits[s], res["answers"][s], labels) for s in ("dev", "test")}
           for side, res in (("device", dev), ("server", srv))}
    cas = calibrate(data.splits, dev["answers"], srv["answers"], labels,
                    float(dev["cascade"].get("max_gap_pts", 0.1)))
    rtt = {k: float(v) for k, v in dev["network"].get("rtt_ms", {}).items()} or {"loopback": 0.0}
    factor = float(dev["network"].get("p99_rtt_factor", 3.0))
    d50, s50 = dev["latency_ms"]["p50"], srv["latency_ms"]["p50"]
    for p in cas["test_curve"]:
        p["expected_ms"] = {k: expected_latency(d50, p["escalation"], s50, r) for k, r in rtt.items()}
    cas["test"]["expected_ms"] = {k: expected_latency(d50, cas["test"]["escalation"], s50, r) for k, r in rtt.items()}
    return {
        "data": data_path, "utterances": {s: len(data.splits[s]) for s in ("dev", "test")},
        "device": {k: v for k, v in dev.items() if k not in ("answers",)} | {"accuracy": acc["device"]},
        "server": {k: v for k, v in srv.items() if k not in ("answers",)} | {"accuracy": acc["server"]},
        "network": {"modeled": True, "rtt_ms": rtt, "p99_rtt_factor": factor,
                    "note": "round trips are modeled from the device profile's [network] table, not measured; the "
                            f"p99 column assumes a round trip's p99 is {factor:g}x its median"},
        "cascade": cas,
    }


def record_threshold(device: Path, tau: float, timeout_s: float | None = None, score: str = "confidence") -> str:
    """Write `cascade.threshold` (exactly; and, schema 4, `cascade.score`) into the device package's manifest
    (temp file, then rename); returns the new package digest (the manifest changed, so the digest did)."""
    from edgekit.io import write_json
    from edgekit.runtime import Package

    pkg = Package.load(device)
    man = dict(pkg.manifest)
    man["cascade"] = {"threshold": float(tau),  # exact: a path score may be far below 1e-6
                      "timeout_s": (man.get("cascade") or {}).get("timeout_s") or timeout_s or DEFAULT_TIMEOUT_S}
    if man["schema_version"] >= 4:  # schema 3 has no score: its cascade escalates on the confidence
        man["cascade"]["score"] = score
    write_json(Path(device) / MANIFEST, man)
    return Package.load(device).digest


COLUMNS = ("", "size", "intent acc", "slot F1", "p50 ms", "p99 ms", "how")


def rows(res: dict) -> list[tuple[str, ...]]:
    """The side-by-side table's rows (COLUMNS), as text: the terminal table and compare.md print the same."""
    def pct(x):
        return "—" if x is None else f"{100 * x:.2f}"

    def size(b):
        return "—" if not b else f"{b / 1e6:.2f} MB"

    d, s, c, net = res["device"], res["server"], res["cascade"], res["network"]
    da, sa, lo = d["accuracy"]["test"], s["accuracy"]["test"], s["load"]["latency_ms"]
    out = [("device", size(d["size_bytes"]), pct(da["intent_acc"]), pct(da.get("slot_f1")),
            f"{d['latency_ms']['p50']:.2f}", f"{d['latency_ms']['p99']:.2f}",
            f"measured: {d['runtime']}, {d['threads']} thread(s), in process"),
           ("server, one at a time", size(s.get("size_bytes")), pct(sa["intent_acc"]), pct(sa.get("slot_f1")),
            f"{s['latency_ms']['p50']:.2f}", f"{s['latency_ms']['p99']:.2f}", "measured: HTTP on loopback"),
           (f"server, {s['load']['profile']} load", "", "", "", f"{lo['p50']:.2f}", f"{lo['p99']:.2f}",
            f"measured: {s['load']['concurrency']} concurrent, {s['load']['throughput_rps']:.1f} req/s")]
    for name, rtt in net["rtt_ms"].items():
        out.append((f"server + {name}", "", "", "", f"{s['latency_ms']['p50'] + rtt:.2f}",
                    f"{s['latency_ms']['p99'] + rtt * net['p99_rtt_factor']:.2f}",
                    f"modeled: + {rtt:g} ms round trip (p99 + {rtt * net['p99_rtt_factor']:g})"))
    ca = c["test"]
    for name, ms in ca["expected_ms"].items():
        out.append((f"cascade, {name}", size(d["size_bytes"]), pct(ca["accuracy"]["intent_acc"]),
                    pct(ca["accuracy"].get("slot_f1")), f"{ms:.2f}", "",
                    f"expected: {c.get('score', 'confidence')} τ {c['threshold']:.4f}, "
                    f"{100 * ca['escalation']:.1f}% escalated"))
    return out


def title(res: dict) -> str:
    return f"device vs server on {res['data']} (test, {res['utterances']['test']} utterances)"


def table(res: dict):
    """The side-by-side table (rich)."""
    from rich.table import Table

    t = Table(title=title(res))
    for col in COLUMNS:
        t.add_column(col, justify="left" if col in ("", "how") else "right")
    for row in rows(res):
        t.add_row(*row)
    return t


def markdown(res: dict) -> str:
    """The same table in Markdown (compare.md), to paste into a README or a pull request."""
    lines = [f"{title(res)}", "", "| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" if c in ("", "how") else "---:" for c in COLUMNS) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows(res)]) + "\n"


def write(res: dict, out: Path) -> dict[str, str]:
    """compare.json and its plots into `out`; returns {kind: file name}."""
    from edgekit.io import write_json, write_text
    from edgekit.reporting.plots import cascade_plot, latency_cdf, stages

    out.mkdir(parents=True, exist_ok=True)
    plots = {"latency": "latency_cdf.png", "cascade": "cascade.png", "stages": "stages.png"}
    latency_cdf(res, out / plots["latency"])
    cascade_plot(res, out / plots["cascade"])
    if stages(_report(Path(res["device"]["package"])), out / plots["stages"]) is None:
        plots.pop("stages")
    res["plots"] = plots
    write_json(out / "compare.json", res)
    write_text(out / "compare.md", markdown(res))
    return plots


def finish(res: dict, device: Path, out: Path, record: bool) -> list[str]:
    """After the table: the threshold written into the device manifest (when `record`), compare.json and the
    plots written; returns the lines to print."""
    c = res["cascade"]
    counts = c.get("counts", "intent")
    lines = [f"cascade: τ {c['threshold']:.4f} on the device's {c.get('score', 'confidence')}, chosen on dev (fewest "
             f"escalations within {c['max_gap_pts']:g} pt of the server alone, counting {counts}); test: "
             f"{100 * c['test']['escalation']:.1f}% escalated"]
    dev = c["dev"]
    if dev["escalation"] == 0:  # say why nothing escalates, so τ = 0 does not read as a failure to calibrate
        lines.append(f"  on dev the device alone is already within {c['max_gap_pts']:g} pt of the server "
                     f"({counts}: {100 * dev['device_accuracy']:.2f} against {100 * dev['server_accuracy']:.2f}): "
                     "escalating buys nothing there")
    if record:
        digest = record_threshold(device, c["threshold"], score=c.get("score", "confidence"))
        lines.append(f"recorded cascade.threshold in {device}/{MANIFEST}; new package digest sha256:{digest}")
    plots = write(res, out)
    return lines + [f"written: {out / 'compare.json'}, {out / 'compare.md'}, "
                    + ", ".join(str(out / p) for p in plots.values())]
