"""What batching can buy a server on this machine: `edgekit serve PKG` batched and one request at a time
(`--max-batch 1`), beside the same HTTP path with no model at all, each under `edgekit loadtest`.

The model-free server is Ray Serve as `edgekit serve` runs it (Serve's proxy, as many replicas taking HTTP straight
from it, the same request checks) whose replicas answer /predict with a fixed prediction. "One at a time" is each
replica answering one request at a time (`--max-batch 1`), as many replicas as the batched server has. No batching
can make a server faster than the model-free one: every request still crosses the client, the proxy and the
replica. So when its throughput is under 3x the one-at-a-time server's, no batching reaches 3x on these cores,
whatever the model.

Each variant runs on a fresh server, in turn, `--rounds` times (figures on a shared machine drift by the minute, so
only runs side by side are compared):

    python examples/serve_ceiling.py PKG ../shared/data/snips [--proxy haproxy|python] [--duration 20] [--rounds 2]
                                     [--replicas N] [--threads N] [--access-log] [--out build/ceiling]

--replicas, --threads (default: the package's, as `edgekit serve` runs it) and --access-log apply to all three
servers.

Writes one loadtest JSON a run and `summary.json` under --out, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

VARIANTS = {  # name -> the server command's arguments after the package (None: the model-free server)
    "batched": [],
    "one at a time": ["--max-batch", "1"],
    "no model": None,
}


def noop_server(package: Path, port: int, proxy: str | None, replicas: int | None, threads: int | None,
                access_log: bool = False) -> None:
    """Serve a fixed prediction behind Serve's proxy, as `edgekit serve` would serve `package`; until SIGTERM."""
    import threading

    from ray import serve
    from starlette.responses import JSONResponse, PlainTextResponse

    from edgekit.runtime import Package
    from edgekit.serve import app as srv

    pkg = Package.load(package)
    # a fixed count: the package's (replicas = 0 counted by srv.start as for `edgekit serve`), or --replicas
    settings = srv.settings_of(pkg.manifest, autoscale=False, proxy=proxy, replicas=replicas, threads=threads,
                               access_log=access_log or None)
    intents = json.loads((package / pkg.manifest["labels"]).read_text())["intents"]
    answer = {"intent": intents[0], "confidence": 0.99, "slots": [], "tags": ["O"] * 8}

    @serve.deployment(name="edgekit", max_ongoing_requests=settings.max_ongoing_requests,
                      logging_config={"enable_access_log": settings.access_log})
    class NoModel:
        def __init__(self, replicas: int):
            import uuid

            self.id, self.replicas = uuid.uuid4().hex[:8], replicas

        async def __call__(self, request):
            path = request.url.path.rstrip("/")
            if path == "/healthz":
                return JSONResponse({"status": "ok", "provider": "none", "batched": False, "replica": self.id,
                                     "replicas": self.replicas})
            if path == "/metrics":
                return PlainTextResponse("")
            body = json.loads(await request.body())
            item = srv.check_item(body, intents, settings.max_text_chars)  # the same checks as a replica's
            return JSONResponse(answer | {"text_chars": len(item["text"])})

    stop = threading.Event()

    def on_signal():  # after ray.init, as `edgekit serve` does: Ray installs its own SIGTERM handler
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())

    def app(s):  # the replicas srv.start counted
        return NoModel.options(num_replicas=s.replicas, ray_actor_options={"num_cpus": s.threads}).bind(s.replicas)

    srv.start(package, settings, port=port, after_init=on_signal, app=app)  # the same Ray, proxy and fallback
    stop.wait()
    srv.stop()


def wait_ready(port: int, proc: subprocess.Popen, limit_s: float = 180) -> None:
    """Return once every replica answers /healthz, so no run starts while one is still loading; exit if the
    server dies or they do not all answer within `limit_s`."""
    from edgekit.serve.metrics import wait_for_replicas

    if not wait_for_replicas(port, lambda: proc.poll() is None, limit_s):
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before answering")
        raise SystemExit(f"port {port}: not every replica answered within {limit_s:.0f} s")


def one_run(variant: str, package: Path, data: Path, port: int, duration: float, out: Path, proxy: str,
            layout: list[str]) -> dict:
    """Start a fresh server of `variant`, load it with `edgekit loadtest --profile high`, stop it.
    layout: --replicas / --threads arguments for the server."""
    edgekit = Path(sys.executable).with_name("edgekit")
    extra = VARIANTS[variant]
    cmd = ([sys.executable, __file__, "--noop-server", str(package), "--port", str(port), "--proxy", proxy, *layout]
           if extra is None else [str(edgekit), "serve", str(package), "--port", str(port), "--proxy", proxy,
                                  *layout, *extra])
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        subprocess.run([str(edgekit), "loadtest", url, "--data", str(data), "--profile", "high",
                        "--duration", str(duration), "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return json.loads(out.read_text())


def main() -> None:
    """Run the variants in turn, print a line a run and the ratios, write summary.json."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", type=Path)
    ap.add_argument("data", type=Path, nargs="?")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=8431)
    ap.add_argument("--out", type=Path, default=Path("build/ceiling"))
    ap.add_argument("--proxy", choices=["haproxy", "python"], default="haproxy", help="Serve's proxy (all variants)")
    ap.add_argument("--replicas", type=int, choices=range(0, 1025), metavar="N",
                    help="replicas of every server, 0: one per CPU (default: the package's)")
    ap.add_argument("--threads", type=int, choices=range(1, 257), metavar="N",
                    help="ONNX Runtime threads per replica (default: the package's)")
    ap.add_argument("--access-log", action="store_true", help="Ray Serve's access log on (all variants)")
    ap.add_argument("--noop-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.noop_server:
        return noop_server(args.package, args.port, args.proxy, args.replicas, args.threads, args.access_log)
    layout = [*(["--replicas", str(args.replicas)] if args.replicas is not None else []),
              *(["--threads", str(args.threads)] if args.threads is not None else []),
              *(["--access-log"] if args.access_log else [])]
    if args.data is None:
        ap.error("DATA is required")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rnd in range(1, args.rounds + 1):
        for variant in VARIANTS:
            name = f"{variant.replace(' ', '_')}_{rnd}.json"
            r = one_run(variant, args.package, args.data, args.port, args.duration, args.out / name, args.proxy,
                        layout)
            rows.append({"round": rnd, "variant": variant, "rps": r["throughput_rps"], "errors": r["errors"],
                         "timeouts": r["timeouts"], "p50_ms": r["latency_ms"]["p50"], "p99_ms": r["latency_ms"]["p99"],
                         "mean_batch": r["server"]["mean_batch_size"],
                         "replicas_seen": r["server"].get("replicas_seen")})
            print(f"round {rnd} {variant:>14}: {r['throughput_rps']:7.1f} req/s, p50 {r['latency_ms']['p50']} ms, "
                  f"p99 {r['latency_ms']['p99']} ms, mean batch {r['server']['mean_batch_size']}, "
                  f"{r['errors']} errors, {r['timeouts']} timeouts", flush=True)
    ratios = []
    for rnd in range(1, args.rounds + 1):
        rps = {row["variant"]: row["rps"] for row in rows if row["round"] == rnd}
        ratios.append({"round": rnd, "batched_over_one": round(rps["batched"] / rps["one at a time"], 2),
                       "no_model_over_one": round(rps["no model"] / rps["one at a time"], 2)})
        print(f"round {rnd}: batched / one at a time {ratios[-1]['batched_over_one']}x; the model-free ceiling / "
              f"one at a time {ratios[-1]['no_model_over_one']}x")
    summary = {"cpu_count": os.cpu_count(), "duration_s": args.duration, "proxy": args.proxy,
               "replicas": args.replicas, "threads": args.threads,
               "access_log": "on" if args.access_log else "the package's", "runs": rows, "ratios": ratios}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
