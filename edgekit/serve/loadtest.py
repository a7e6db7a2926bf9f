"""`edgekit loadtest`: drive an `edgekit serve` server on loopback and report latency, throughput and batching.

Threads, one keep-alive `http.client.HTTPConnection` each, so a request's latency is the server's and not a
fresh TCP handshake's. Steady profiles keep exactly `concurrency` requests in flight until the deadline; the
burst profile releases `concurrency` requests at one instant (a Barrier), waits for all of them, idles, repeats.
The server's own batching figures come from two scrapes of /metrics, before and after: their difference is
this run's batches only, whatever the server did before. Behind Serve's proxy one scrape reaches one replica, so
each scrape is repeated (a new connection each time) until every replica /healthz counts has answered.
"""

from __future__ import annotations

import http.client
import ipaddress
import itertools
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from rich.table import Table

from edgekit.errors import EdgekitError
from edgekit.io import write_json
from edgekit.runtime.latency import percentile
from edgekit.serve.metrics import (  # noqa: F401 (parse_metrics: API)
    parse_metrics,
    scrape_all,
    server_summary,
    wait_for_replicas,
)


@dataclass(frozen=True)
class Profile:
    """A load shape: `concurrency` requests in flight at all times, or (burst) released together, then idle."""

    name: str
    concurrency: int
    burst: bool = False
    idle_s: float = 0.0


log = logging.getLogger("edgekit")
REPLICA_WAIT_S = 30.0  # the most a load test waits for every replica of a just-started server to answer
PROFILES: dict[str, Profile] = {
    "low": Profile("low", 4),
    "high": Profile("high", 64),
    "burst": Profile("burst", 200, burst=True, idle_s=1.0),
}

def check_loopback(url: str) -> None:
    """Refuse anything but an http:// URL whose host resolves only to loopback addresses: a load test is
    meant for the local server, never someone else's."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise EdgekitError(f"{url}: only http:// URLs are supported (got scheme {parts.scheme or 'none'!r})")
    host = parts.hostname
    if not host:
        raise EdgekitError(f"{url}: no host in the URL")
    try:
        port = parts.port or 80
    except ValueError:
        raise EdgekitError(f"{url}: the port is not a number in 0-65535") from None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise EdgekitError(f"{url}: cannot resolve {host!r} ({e}); loadtest only drives a loopback server") from None
    addrs = {info[4][0].split("%")[0] for info in infos}  # an IPv6 address may carry a scope: "fe80::1%eth0"
    outside = sorted(a for a in addrs if not ipaddress.ip_address(a).is_loopback)
    if outside or not addrs:
        raise EdgekitError(f"{url}: {host} resolves to {', '.join(outside) or 'nothing'}, not loopback; "
                           "loadtest only drives a server on this machine (localhost, 127.0.0.1, [::1])")


class _Client:
    """One keep-alive connection to the server, closed after any failure: it is then in an unknown state, and
    http.client opens a fresh one on the next request."""

    def __init__(self, host: str, port: int, timeout_s: float):
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        self.reused = False

    def connect(self) -> None:
        try:
            self.conn.connect()
        except OSError:
            self.conn.close()  # the first request connects again and reports the error

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            self.conn.request("GET", path)
            resp = self.conn.getresponse()
            return resp.status, resp.read()
        finally:
            self.conn.close()

    def post(self, path: str, text: str) -> tuple[str, float, str | None]:
        """One /predict call: ("ok" | "error" | "timeout", wall latency in ms, error message or None)."""
        body = json.dumps({"text": text}).encode("utf-8")
        for retry in (False, True):
            t0 = time.perf_counter()
            try:
                self.conn.request("POST", path, body, {"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                data = resp.read()  # read it all, or the connection cannot carry the next request
            except TimeoutError:
                self.conn.close()
                self.reused = False
                return "timeout", 1000 * (time.perf_counter() - t0), None
            except Exception as e:  # a worker must survive anything, or a burst barrier hangs
                self.conn.close()
                stale = self.reused and isinstance(e, (ConnectionResetError, BrokenPipeError))
                self.reused = False
                if stale and not retry:
                    continue  # the server closed an idle keep-alive connection: not its failure, resend once
                return "error", 1000 * (time.perf_counter() - t0), f"{type(e).__name__}: {e}"
            ms = 1000 * (time.perf_counter() - t0)
            self.reused = True
            if resp.status != 200:
                try:
                    detail = json.loads(data)["error"]
                except Exception:  # any odd body: show its start instead
                    detail = data[:200].decode("utf-8", "replace")
                return "error", ms, f"HTTP {resp.status}: {detail}"
            try:
                if isinstance(json.loads(data), dict):
                    return "ok", ms, None
            except ValueError:
                pass
            return "error", ms, "HTTP 200 with a body that is not a JSON object"


def run(url: str, texts: list[str], profile: str | Profile = "high", duration_s: float = 30.0,
        timeout_s: float = 10.0, progress: bool = True) -> dict:
    """Load the server at `url` (loopback only) with `texts`, cycled in order, for about `duration_s`.

    Requests in flight at the deadline finish (or time out); none start after it. A burst profile always runs
    at least one burst. Returns the figures as a JSON-serializable dict (see `render`)."""
    check_loopback(url)
    if isinstance(profile, str):
        if profile not in PROFILES:
            raise EdgekitError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
        profile = PROFILES[profile]
    if not texts:
        raise EdgekitError("loadtest needs at least one utterance to send")
    if duration_s <= 0 or timeout_s <= 0 or profile.concurrency < 1:
        raise EdgekitError("duration, timeout and concurrency must be positive")
    load = LoadRun(url, texts, profile, duration_s, timeout_s)
    load.check_server()
    since, before = time.time(), load.scrape()
    start, measured, client_cpu = load.drive(progress)
    after = load.scrape()
    return load.result(start, measured, client_cpu, server_summary(before, after, since) | {"replicas": load.replicas})


class LoadRun:
    """One `run`: the server it drives, the workers (steady, or burst with their coordinator) and what they
    recorded."""

    def __init__(self, url: str, texts: list[str], profile: Profile, duration_s: float, timeout_s: float):
        parts = urlsplit(url)
        self.url, self.texts, self.profile, self.duration_s, self.timeout_s = url, texts, profile, duration_s, timeout_s
        self.host, self.port, self.base = parts.hostname, parts.port or 80, parts.path.rstrip("/")
        self.replicas = 1  # how many replicas to scrape /metrics for (check_server)
        self.counter, self.lock = itertools.count(), threading.Lock()
        # (kind, ms, error, when it ended: monotonic s); list.append is atomic: workers share it without a lock
        self.records: list[tuple[str, float, str | None, float]] = []
        # interrupted: stop now; finished: burst rounds are over
        self.interrupted, self.finished = threading.Event(), threading.Event()
        self.barrier = threading.Barrier(profile.concurrency + 1)  # the workers and the coordinator
        self.deadline = 0.0

    def client(self) -> _Client:
        return _Client(self.host, self.port, self.timeout_s)

    def check_server(self) -> None:
        """Refuse a server that does not answer /healthz; count its replicas (all there can be: autoscaling, its
        most), and give every one a moment to answer."""
        try:
            status, health = self.client().get(self.base + "/healthz")
        except (OSError, http.client.HTTPException) as e:
            raise EdgekitError(f"{self.url} is not answering ({type(e).__name__}: {e}); is `edgekit serve` "
                               "running?") from None
        if status != 200:
            raise EdgekitError(f"{self.url}/healthz answered HTTP {status}; the server is not ready")
        try:
            body = json.loads(health)
            self.replicas = max(1, int(body.get("max_replicas") or body.get("replicas") or 1))
        except (ValueError, TypeError, AttributeError):  # not an edgekit server's health: scrape once
            self.replicas = 1
        if self.replicas > 1:
            # A server that just became healthy may have a replica the proxy does not route to yet: the first
            # /metrics scrape would miss it and the figures leave it out ("1 of 2"). Give every replica a moment.
            if not wait_for_replicas(self.port, lambda: True, REPLICA_WAIT_S, host=self.host,
                                     path=self.base + "/healthz"):
                log.warning("not every replica answered /healthz within %.0f s: the server figures may leave some "
                            "out", REPLICA_WAIT_S)

    def scrape_one(self) -> dict | None:
        try:
            status, body = self.client().get(self.base + "/metrics")
        except (OSError, http.client.HTTPException):
            return None
        return parse_metrics(body.decode("utf-8", "replace")) if status == 200 else None

    def scrape(self) -> dict:
        return scrape_all(self.scrape_one, self.replicas)

    def next_text(self) -> str:
        with self.lock:
            return self.texts[next(self.counter) % len(self.texts)]

    def send(self, c: _Client) -> None:
        self.records.append((*c.post(self.base + "/predict", self.next_text()), time.monotonic()))

    def steady_worker(self) -> None:
        c = self.client()
        while not self.interrupted.is_set() and time.monotonic() < self.deadline:
            self.send(c)

    def burst_worker(self) -> None:
        c = self.client()
        c.connect()  # connect before the release, so the burst is requests and not 200 handshakes
        while True:
            self.barrier.wait()
            if self.finished.is_set():
                return
            self.send(c)
            self.barrier.wait()

    def coordinator(self) -> None:
        while True:
            self.barrier.wait()  # release: every worker sends now
            self.barrier.wait()  # every request of this burst is done
            # idle; an interrupt wakes it
            self.interrupted.wait(max(0.0, min(self.profile.idle_s, self.deadline - time.monotonic())))
            if self.interrupted.is_set() or time.monotonic() >= self.deadline:
                break
        self.finished.set()
        self.barrier.wait()  # one last release, to let the workers see `finished` and exit

    def drive(self, progress: bool) -> tuple[float, float, float]:
        """Run the workers until the deadline: (when they started: monotonic s, seconds measured, this client's CPU
        in cores)."""
        profile = self.profile
        target = self.burst_worker if profile.burst else self.steady_worker
        threads = [threading.Thread(target=target, daemon=True) for _ in range(profile.concurrency)]
        if profile.burst:
            threads.append(threading.Thread(target=self.coordinator, daemon=True))
        start, cpu0 = time.monotonic(), time.process_time()
        self.deadline = start + self.duration_s
        for t in threads:
            t.start()
        try:
            _wait(threads, start, self.duration_s, self.records, profile.name if progress else None)
        except KeyboardInterrupt:
            self.interrupted.set()
            raise
        measured = time.monotonic() - start
        # on the server's own machine the client competes with it for the CPU: say how much it took (all its threads)
        return start, measured, (time.process_time() - cpu0) / measured

    def result(self, start: float, measured: float, client_cpu: float, server: dict) -> dict:
        """The run's figures (see `render`); server: the server's own, from its /metrics."""
        records, profile = self.records, self.profile
        counts = {kind: sum(1 for r in records if r[0] == kind) for kind in ("ok", "error", "timeout")}
        latencies = sorted(ms for kind, ms, _, _ in records if kind == "ok")
        n = len(records)
        first_error = next((err for kind, _, err, _ in records if kind == "error"), None)
        if first_error is None and counts["timeout"]:
            first_error = f"timed out after {self.timeout_s:g} s"
        return {
            "url": self.url, "profile": profile.name, "concurrency": profile.concurrency,
            "duration_s": round(measured, 3), "requests": n,
            "ok": counts["ok"], "errors": counts["error"], "timeouts": counts["timeout"],
            "error_rate": round(counts["error"] / n, 4) if n else 0.0,
            "timeout_rate": round(counts["timeout"] / n, 4) if n else 0.0,
            "throughput_rps": round(counts["ok"] / measured, 2),
            "client_cpu_cores": round(client_cpu, 3),
            "latency_ms": {"p50": percentile(latencies, 50, digits=3), "p90": percentile(latencies, 90, digits=3),
                           "p99": percentile(latencies, 99, digits=3),
                           "mean": round(sum(latencies) / len(latencies), 3) if latencies else None},
            "server": server,
            "first_error": first_error,
            # about 60 steps: a burst (200 requests in ~0.2 s, then 1 s idle) shows as its waves on a 30 s run
            "timeline": timeline(records, start, step_s=min(1.0, max(0.1, round(measured / 60, 1)))),
        }


def timeline(records: list, start: float, step_s: float = 1.0) -> dict:
    """The run step by step (`step_s` each), by when each request ended: answered, failed (errors and timeouts),
    and the answered ones' p50 and p99 latency (ms; None in a step without one). For the plot beside loadtest.json."""
    n = max((int((end - start) / step_s) for *_, end in records), default=-1) + 1
    ok: list[list[float]] = [[] for _ in range(n)]
    failed = [0] * n
    for kind, ms, _, end in records:
        k = int((end - start) / step_s)
        if kind == "ok":
            ok[k].append(ms)
        else:
            failed[k] += 1
    for bucket in ok:
        bucket.sort()
    return {"step_s": step_s, "ok": [len(b) for b in ok], "failed": failed,
            "p50_ms": [percentile(b, 50, digits=3) for b in ok], "p99_ms": [percentile(b, 99, digits=3) for b in ok]}


def _wait(threads, start: float, duration_s: float, records: list, label: str | None) -> None:
    """Join the workers, drawing a progress bar over the duration (on stderr) when `label` is given."""
    if label is None:
        for t in threads:
            t.join()
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("loadtest {task.description}"), BarColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[n]} requests"), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=duration_s, n=0)
        for t in threads:
            while t.is_alive():
                t.join(0.1)
                bar.update(task, completed=min(time.monotonic() - start, duration_s), n=len(records))


def render(result: dict) -> Table:
    """One rich table of a `run` result, a figure per row with its unit in the row header (fits 80 columns)."""
    def num(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    lat, srv = result["latency_ms"], result["server"]
    hist = srv["batch_histogram"]
    rows = [
        ("requests", str(result["requests"])),
        ("ok", str(result["ok"])),
        ("errors", f"{result['errors']} ({100 * result['error_rate']:.1f}%)"),
        ("timeouts", f"{result['timeouts']} ({100 * result['timeout_rate']:.1f}%)"),
        ("throughput (ok req/s)", num(result["throughput_rps"], "{:.1f}")),
        *((f"latency {k} (ms)", num(lat[k])) for k in ("p50", "p90", "p99", "mean")),
        ("mean batch size (requests)", num(srv["mean_batch_size"])),
        ("batches by size (size:count)", (" ".join(f"{k}:{v}" for k, v in hist.items() if v) or "none")
         if hist else "-"),
        ("mean queue time (ms)", num(srv["mean_queue_ms"])),
        ("provider", srv["provider"] or "-"),
        ("replicas in these figures", f"{srv.get('replicas_seen') or '-'} of {srv.get('replicas') or '-'}"),
        ("this client's CPU (cores)", num(result.get("client_cpu_cores"))),
    ]
    if result["first_error"]:
        rows.append(("first error", result["first_error"]))
    table = Table(title=f"loadtest {result['url']} ({result['profile']}, concurrency {result['concurrency']}, "
                        f"{result['duration_s']:.1f} s)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def save(result: dict, path) -> None:
    """Write `result` as JSON, atomically (a temp file beside `path`, then renamed over it)."""
    write_json(path, result)
