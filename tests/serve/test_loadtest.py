"""edgekit.serve.loadtest against a real little HTTP server on 127.0.0.1 that records what it receives."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rich.console import Console

from edgekit.errors import EdgekitError
from edgekit.serve import loadtest
from edgekit.serve.loadtest import Profile, check_loopback, parse_metrics, render, run, save

BEFORE = """# HELP edgekit_batch_size batch sizes
# TYPE edgekit_batch_size histogram
edgekit_batch_size_bucket{le="1"} 3
edgekit_batch_size_bucket{le="2"} 5
edgekit_batch_size_bucket{le="4"} 5
edgekit_batch_size_bucket{le="+Inf"} 5
edgekit_batch_size_sum 7
edgekit_batch_size_count 5
edgekit_queue_seconds_sum 1.5
edgekit_queue_seconds_count 10
edgekit_requests_total{endpoint="/predict"} 7
edgekit_provider_info{provider="CPUExecutionProvider"} 1
"""
# Since BEFORE: batches of 1, 2, 4, 4 (sum 11, count 4) and 11 requests queued 0.55 s in all (50 ms each).
AFTER = """edgekit_batch_size_bucket{le="1"} 4
edgekit_batch_size_bucket{le="2"} 7
edgekit_batch_size_bucket{le="4"} 9
edgekit_batch_size_bucket{le="+Inf"} 9
edgekit_batch_size_sum 18
edgekit_batch_size_count 9
edgekit_queue_seconds_sum 2.05
edgekit_queue_seconds_count 21
edgekit_provider_info{provider="CPUExecutionProvider"} 1
"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real server does

    def log_message(self, *args):
        pass

    def reply(self, status: int, body: bytes, ctype: str = "application/json"):
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (a timeout test): nothing to answer

    def do_GET(self):
        srv = self.server
        if self.path == "/healthz":
            self.reply(200, b"ok", "text/plain")
        elif self.path == "/metrics" and srv.metrics is not None:
            srv.scrapes += 1
            text = srv.metrics[min(srv.scrapes, len(srv.metrics)) - 1]  # first scrape: the first text, and so on
            self.reply(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self.reply(404, b'{"error": "not found"}')

    def do_POST(self):
        srv = self.server
        text = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"]
        with srv.lock:
            srv.texts.append(text)
            srv.ports.add(self.client_address[1])
            srv.inflight += 1
            srv.max_inflight = max(srv.max_inflight, srv.inflight)
            srv.lock.notify_all()
            if srv.hold:  # keep every request open until `hold` are in flight together (or 5 s pass)
                srv.lock.wait_for(lambda: srv.max_inflight >= srv.hold, timeout=5)
        try:
            if text == "slow":
                time.sleep(0.5)
            if text == "boom":
                self.reply(500, b'{"error": "boom went the model"}')
            else:
                time.sleep(srv.delay)
                self.reply(200, json.dumps({"intent": "play", "confidence": 0.9, "slots": []}).encode())
        finally:
            with srv.lock:
                srv.inflight -= 1


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
    srv.request_queue_size = 512  # the default backlog of 5 would drop a burst's connections
    srv.server_bind()
    srv.server_activate()
    srv.handle_error = lambda *a: None
    srv.texts, srv.ports, srv.lock = [], set(), threading.Condition()
    srv.inflight = srv.max_inflight = srv.hold = srv.scrapes = 0
    srv.delay, srv.metrics = 0.0, [BEFORE, AFTER]
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


def test_refuses_non_loopback_hosts_and_schemes(monkeypatch):
    for url in ["http://10.1.2.3:8000", "http://8.8.8.8", "https://127.0.0.1:8000", "ftp://localhost/x",
                "127.0.0.1:8000", "http://:8000", "http://127.0.0.1:99999"]:
        with pytest.raises(EdgekitError):
            check_loopback(url)
    for url in ["http://localhost:8000", "http://127.0.0.1:8000/", "http://[::1]:8000", "http://127.0.0.2"]:
        check_loopback(url)

    def resolves_outside(host, port, *a, **k):  # a name that resolves to loopback and a public address
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolves_outside)
    with pytest.raises(EdgekitError, match="93.184.216.34"):
        check_loopback("http://example.com:8000")

    def fails(*a, **k):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fails)
    with pytest.raises(EdgekitError, match="cannot resolve"):
        check_loopback("http://no-such-host.invalid:8000")
    with pytest.raises(EdgekitError):  # run checks before anything else, the server is never reached
        run("http://no-such-host.invalid:8000", ["a"], duration_s=0.1, progress=False)


def test_refuses_bad_arguments_and_a_dead_server(server):
    with pytest.raises(EdgekitError, match="utterance"):
        run(server.url, [], duration_s=0.1, progress=False)
    with pytest.raises(EdgekitError, match="profile"):
        run(server.url, ["a"], profile="huge", duration_s=0.1, progress=False)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EdgekitError, match="not answering"):
        run(f"http://127.0.0.1:{port}", ["a"], duration_s=0.1, progress=False)
    assert server.texts == []


def test_texts_cycle_in_order_over_keep_alive_connections(server):
    texts = ["play queen", "weather tomorrow", "book a table", "set an alarm"]
    result = run(server.url + "/", texts, profile=Profile("one", 1), duration_s=0.3, progress=False)
    assert result["requests"] == len(server.texts) > len(texts)
    assert server.texts == [texts[i % len(texts)] for i in range(len(server.texts))]
    assert len(server.ports) == 1  # one persistent connection, not one per request

    server.texts.clear(), server.ports.clear()
    server.delay, server.metrics = 0.005, None
    result = run(server.url, texts, profile=Profile("three", 3), duration_s=0.3, progress=False)
    counts = Counter(server.texts)
    assert set(counts) == set(texts) and max(counts.values()) - min(counts.values()) <= 3
    assert server.max_inflight == 3 and len(server.ports) == 3
    assert result["ok"] == result["requests"] == len(server.texts) and result["errors"] == result["timeouts"] == 0
    lat = result["latency_ms"]
    assert 5 <= lat["p50"] <= lat["p90"] <= lat["p99"] and lat["mean"] >= 5
    assert result["server"] == {"mean_batch_size": None, "batched_utterances": None, "batch_histogram": None,
                                "mean_queue_ms": None, "provider": None, "replicas_seen": None,
                                "replicas": 1}  # no /metrics: no figures
    Console(file=io.StringIO()).print(render(result))  # and the table shows them as "-"


def test_errors_and_timeouts_are_counted_apart(server):
    result = run(server.url, ["fine", "boom", "slow"], profile=Profile("one", 1), duration_s=0.8,
                 timeout_s=0.2, progress=False)
    sent = Counter(server.texts)
    assert sent["slow"] >= 1 and sent["boom"] >= 1
    assert (result["ok"], result["errors"], result["timeouts"]) == (sent["fine"], sent["boom"], sent["slow"])
    assert result["requests"] == len(server.texts)
    assert result["error_rate"] == pytest.approx(sent["boom"] / len(server.texts), abs=1e-3)
    assert result["timeout_rate"] == pytest.approx(sent["slow"] / len(server.texts), abs=1e-3)
    assert result["first_error"] == "HTTP 500: boom went the model"
    assert result["throughput_rps"] == pytest.approx(result["ok"] / result["duration_s"], rel=0.01)
    assert len(server.ports) > 1  # a fresh connection after each timeout
    tl = result["timeline"]  # step by step (0.1 s on this short run), each request in the step it ended
    assert sum(tl["ok"]) == result["ok"] and sum(tl["failed"]) == result["errors"] + result["timeouts"]


def test_the_command_writes_the_figures_and_their_plot(server, tmp_path):
    import subprocess
    import sys

    from tests.conftest import DEMO

    out = tmp_path / "lt" / "loadtest.json"
    r = subprocess.run([sys.executable, "-m", "edgekit.cli", "loadtest", server.url, "--data", str(DEMO), "--profile",
                        "low", "--duration", "0.5", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(out.read_text())["ok"] > 0 and out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert f"written: {out}, {out.with_suffix('.png')}" in r.stderr


def test_timeline_buckets_requests_by_when_they_ended_and_plots_them(tmp_path):
    from edgekit.reporting.plots import loadtest_timeline

    records = [("ok", 10.0, None, 100.2), ("ok", 30.0, None, 100.9), ("error", 5.0, "x", 100.95),
               ("timeout", 200.0, None, 102.5), ("ok", 20.0, None, 102.7)]
    tl = loadtest.timeline(records, start=100.0)
    assert tl == {"step_s": 1.0, "ok": [2, 0, 1], "failed": [1, 0, 1], "p50_ms": [20.0, None, 20.0],
                  "p99_ms": [29.8, None, 20.0]}
    assert loadtest.timeline([], start=0.0)["ok"] == []
    res = {"timeline": tl, "profile": "high", "concurrency": 64, "throughput_rps": 3.0, "latency_ms": {"p99": 29.8}}
    path = loadtest_timeline(res, tmp_path / "loadtest.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in tmp_path.iterdir()] == ["loadtest.png"]
    assert loadtest_timeline(res | {"timeline": loadtest.timeline([], 0.0)}, tmp_path / "none.png") is None


def test_metrics_difference(server):
    result = run(server.url, ["a", "b"], profile="low", duration_s=0.2, progress=False)
    assert server.scrapes == 2
    assert result["server"] == {"mean_batch_size": 2.75, "batched_utterances": 11,
                                "batch_histogram": {"1": 1, "2": 1, "4": 2, "+Inf": 0}, "mean_queue_ms": 50.0,
                                "provider": "CPUExecutionProvider", "replicas_seen": None, "replicas": 1}
    restarted = loadtest.server_summary(parse_metrics(AFTER), parse_metrics(BEFORE))  # counters went back
    assert restarted["mean_batch_size"] == 1.4 and restarted["batch_histogram"] == {"1": 3, "2": 2, "4": 0, "+Inf": 0}


def test_parse_metrics():
    text = ('# TYPE x counter\n\nedgekit_batch_size_bucket{le="4"} 5\nplain 2.5\n'
            'with_ts{a="b c",d="e"} 3 1700000000000\nedgekit_batch_size_bucket{le="+Inf"} +Inf\nbroken\nbad 1x\n')
    assert parse_metrics(text) == {'edgekit_batch_size_bucket{le="4"}': 5.0, "plain": 2.5,
                                   'with_ts{a="b c",d="e"}': 3.0, 'edgekit_batch_size_bucket{le="+Inf"}': float("inf")}


def test_burst_releases_200_requests_at_once(server):
    server.hold = 200  # each request waits until 200 are open together; fewer would time out the test's 5 s
    t0 = time.monotonic()
    result = run(server.url, [f"utterance {i}" for i in range(7)], profile="burst", duration_s=0.05, progress=False)
    assert server.max_inflight >= 200
    assert result["requests"] == result["ok"] == 200  # one burst even though the duration is shorter
    assert time.monotonic() - t0 < 4
    assert len(set(server.texts)) == 7


def test_burst_repeats_until_the_deadline(server):
    result = run(server.url, ["a", "b"], profile=Profile("b", 5, burst=True, idle_s=0.05), duration_s=0.4,
                 progress=False)
    assert server.max_inflight <= 5
    assert result["requests"] % 5 == 0 and 10 <= result["requests"] <= 45
    assert result["duration_s"] < 1.0


def test_stops_near_its_duration(server):
    server.delay = 0.05
    t0 = time.monotonic()
    result = run(server.url, ["a", "b", "c"], profile=Profile("t", 8), duration_s=0.5, progress=False)
    wall = time.monotonic() - t0
    assert 0.5 <= result["duration_s"] < 1.0 and wall < 2.0  # loose: the 50 ms requests in flight, a busy CI
    n = len(server.texts)  # nothing starts after the deadline, and nothing is left running
    time.sleep(0.1)
    assert len(server.texts) == n == result["requests"] and server.inflight == 0


def test_progress_bar_render_and_save(server, tmp_path):
    result = run(server.url, ["a", "b"], profile="low", duration_s=0.2, progress=True)
    out = io.StringIO()
    Console(file=out, width=200).print(render(result))
    shown = out.getvalue()
    assert "latency p50 (ms)" in shown and "throughput (ok req/s)" in shown and "CPUExecutionProvider" in shown
    assert "1:1 2:1 4:2" in shown
    # the client's own CPU, which on the server's machine it takes from the server: some, and no more than it has
    assert "this client's CPU (cores)" in shown and 0 < result["client_cpu_cores"] <= os.cpu_count()
    path = tmp_path / "out" / "loadtest.json"
    save(result, path)
    assert json.loads(path.read_text()) == result
    assert [p.name for p in path.parent.iterdir()] == ["loadtest.json"]  # no temp file left behind


class TwoReplicas(Handler):
    """Two replicas behind a proxy that routes to the second only from `srv.b_after` on (a just-started server)."""

    def do_GET(self):
        srv = self.server
        with srv.lock:
            srv.calls += 1
            name = "b" if time.monotonic() >= srv.b_after and srv.calls % 2 else "a"
        if self.path == "/healthz":
            self.reply(200, json.dumps({"status": "ok", "replica": name, "replicas": 2}).encode())
        elif self.path == "/metrics":
            self.reply(200, srv.replicas[name].text(name).encode(), "text/plain; version=0.0.4")
        else:
            self.reply(404, b'{"error": "not found"}')


def test_waits_for_every_replica_of_a_just_started_server_before_its_first_scrape():
    from edgekit.serve.metrics import Metrics

    srv = ThreadingHTTPServer(("127.0.0.1", 0), TwoReplicas)
    srv.handle_error = lambda *a: None
    srv.texts, srv.ports, srv.lock = [], set(), threading.Condition()
    srv.inflight = srv.max_inflight = srv.hold = srv.calls = 0
    srv.delay = 0.0
    srv.replicas = {"a": Metrics("CPUExecutionProvider"), "b": Metrics("CPUExecutionProvider")}  # both started now
    srv.b_after = time.monotonic() + 0.8
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    try:
        t0 = time.monotonic()
        result = run(f"http://127.0.0.1:{srv.server_address[1]}", ["a"], profile="low", duration_s=0.2, progress=False)
        # without the wait the first scrape reaches only a, and b (older than that scrape) is left out: "1 of 2"
        assert result["server"]["replicas_seen"] == 2 and time.monotonic() - t0 >= 0.8
    finally:
        srv.shutdown()
        srv.server_close()
