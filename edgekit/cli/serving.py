"""`edgekit serve`, `web` and `loadtest`: the commands that run a server or drive one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from edgekit.cli.options import Format, Provider, check_providers, command
from edgekit.errors import EdgekitError


@command()
def serve(
    package: Path = typer.Argument(..., help="Package folder written by `edgekit build` (a server profile's "
                                   "batches; a phone package is served one utterance per call)."),
    host: str = typer.Option("127.0.0.1", help="Address of the HTTP endpoints (default loopback only; Ray's own "
                             "ports listen on every interface: docs/serving.md)."),
    port: int = typer.Option(8000, help="HTTP port."),
    replicas: Optional[int] = typer.Option(None, help="Fixed replica count (overrides the profile's autoscaling); "
                                           "0: one per --threads CPUs of the Ray cluster."),
    address: Optional[str] = typer.Option(None, help="Join a running Ray cluster (e.g. ray://head:10001 or "
                                          "head:6379) instead of starting a local one."),
    max_batch: Optional[int] = typer.Option(None, help="Largest batch (default: the profile's); 1 answers one "
                                            "request at a time."),
    batch_wait_ms: Optional[float] = typer.Option(None, help="How long a batch waits to fill (ms)."),
    provider: Provider = None,
    threads: Optional[int] = typer.Option(None, help="ONNX Runtime threads per replica."),
    proxy: Optional[str] = typer.Option(None, help="haproxy (default: Serve's HAProxy ingress) or python (Serve's "
                                        "Python proxy); a local Ray only: a cluster keeps its own."),
    access_log: Optional[bool] = typer.Option(None, "--access-log/--no-access-log", help="Ray Serve's log line per "
                                              "request in each replica's log file (default: the profile's, off)."),
):
    """Serve a package over HTTP on Ray Serve, with dynamic batching.

    POST /predict, POST /predict_batch, GET /healthz, GET /metrics (Prometheus). Ctrl-C or SIGTERM stops it and
    every process it started."""
    import signal
    import threading

    from edgekit.runtime import Package
    from edgekit.serve import app as srv
    from edgekit.serve.ray_env import check_port

    pkg = Package.load(package)  # a bad package is one `error:` line and exit 2 (main)
    try:
        settings = srv.settings_of(pkg.manifest, replicas=replicas, autoscale=False if replicas is not None else None,
                                   max_batch=max_batch, batch_wait_ms=batch_wait_ms, providers=check_providers(provider),
                                   threads=threads, proxy=proxy, access_log=access_log)
    except ValueError as e:
        raise EdgekitError(f"serve: {e}") from None
    try:
        import ray  # noqa: F401
        from ray import serve as _  # noqa: F401
    except ImportError:
        raise EdgekitError("edgekit serve needs Ray Serve: pip install -e '.[serve]' in the edgekit checkout") from None
    stop = threading.Event()

    def on_signal():  # ray.init installs its own SIGTERM handler (a stack dump and abort): ours goes on after it
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())

    if not address:  # a port in use is one line before Ray starts, not Serve's traceback after
        check_port(host, port)
    on_signal()
    try:
        typer.echo(f"starting Ray Serve: {srv.describe(settings, address)}", err=True)
        settings = srv.start(package, settings, host, port, address, after_init=on_signal)
        typer.echo(f"serving {package} at http://{host}:{port} with {srv.describe(settings, address)} (POST "
                   "/predict, /predict_batch; GET /healthz, /metrics); Ctrl-C stops", err=True)
        stop.wait()
    finally:
        typer.echo("stopping", err=True)
        srv.stop(address)


@command()
def web(
    package: Path = typer.Argument(..., help="Package folder with an ONNX model (best: built with --target web)."),
    port: int = typer.Option(8080, help="HTTP port on 127.0.0.1 (0: any free port)."),
    site: Optional[Path] = typer.Option(None, help="The page's folder (default: examples/web of this checkout, "
                                        "after `npm ci && npm run build` there)."),
):
    """Serve the in-browser demo on 127.0.0.1, the package running in the tab.

    onnxruntime-web (WASM) runs the package; each keystroke shows the intent, confidence, the whole answer's
    path_confidence, slots and latency. Ctrl-C
    or SIGTERM stops it."""
    import signal
    import threading

    from edgekit.serve import web as w

    server, url, warning = w.start(package, "127.0.0.1", port, site or w.SITE)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    typer.echo(f"serving {package} with the web page at {url} (it runs in the browser, offline once loaded); "
               "Ctrl-C stops", err=True)
    stop.wait()
    server.shutdown()
    typer.echo("stopping", err=True)


@command()
def loadtest(
    url: str = typer.Argument(..., help="Server URL on this machine, e.g. http://127.0.0.1:8000."),
    data: Path = typer.Option(..., "--data", help="Dataset whose utterances are sent (the split below)."),
    format: Format = None,
    profile: str = typer.Option("high", help="low (4 concurrent), high (64) or burst (200 at once, repeated)."),
    duration: float = typer.Option(30.0, help="Seconds; it stops by itself."),
    timeout: float = typer.Option(10.0, help="Seconds before a request counts as timed out."),
    split: str = typer.Option("test", help="train, dev or test."),
    out: Path = typer.Option(Path("loadtest.json"), help="Where the figures are written (JSON)."),
):
    """Load-test a running `edgekit serve` on loopback.

    Latency p50/p90/p99, throughput, errors and timeouts, and the server's mean batch size and queue time from
    /metrics."""
    from rich.console import Console

    from edgekit.data.dataset import SPLITS, load_dataset
    from edgekit.reporting.plots import loadtest_timeline
    from edgekit.serve import loadtest as lt

    lt.check_loopback(url)  # before anything else: no traffic leaves the machine
    if split not in SPLITS:
        raise EdgekitError(f"unknown --split {split!r}; choose {', '.join(SPLITS)}")
    texts = [ex.text for ex in load_dataset(data, format).splits[split]]
    result = lt.run(url, texts, profile, duration, timeout)
    Console().print(lt.render(result))
    lt.save(result, out)
    # beside the JSON: loadtest.json -> loadtest.png
    plot = loadtest_timeline(result, out.with_suffix(".png") if out.suffix != ".png" else out.with_suffix(".t.png"))
    typer.echo(f"written: {out}" + (f", {plot}" if plot else ""), err=True)
