"""edgekit.serve.watchdog without Ray: a stand-in server marks what it starts, one child rewrites its environment as
Ray's agents' titles do, and the server is SIGKILLed; the watchdog must stop all of it. And the in-process reap
leaves the caller's other children alone. The real server under every way of stopping: tests/serve/test_faults.py."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from edgekit.serve import watchdog

# The watchdog reads /proc, which only Linux has; elsewhere edgekit serve runs without it (docs/serving.md, Faults).
pytestmark = pytest.mark.skipif(not watchdog.PROC.is_dir(), reason="the watchdog reads /proc, which only Linux has")

CHILD = textwrap.dedent("""
    import os, subprocess, sys, time
    from edgekit.serve import watchdog
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    subprocess.Popen(sleeper)
    subprocess.Popen(sleeper, env={k: v for k, v in os.environ.items() if k != watchdog.MARKER})
    time.sleep(600)
""")
SERVER = textwrap.dedent("""
    import os, subprocess, sys, time
    from edgekit.serve import watchdog
    CHILD = sys.argv[2]
    os.environ[watchdog.MARKER] = sys.argv[1]
    dog = watchdog.watch(sys.argv[1])
    # a child that keeps the marker (the raylet) and starts two of its own: a worker, which keeps it too, and an
    # agent, whose environment no longer shows it (Ray rewrites an agent's title over it)
    subprocess.Popen([sys.executable, "-c", CHILD])
    print(dog.pid, flush=True)
    time.sleep(600)
""")


def _walk(pid: int) -> set[int]:
    live = watchdog._live()
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for p, (ppid, _) in live.items():
            if ppid == parent and p not in found:
                found.add(p)
                frontier.append(p)
    return found


def test_a_sigkilled_server_leaves_nothing_its_watchdog_saw():
    server = subprocess.Popen([sys.executable, "-c", SERVER, uuid.uuid4().hex, CHILD], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    dog = int(server.stdout.readline())
    deadline = time.time() + 30
    while len(_walk(server.pid)) < 4 and time.time() < deadline:  # the watchdog, the child, its 2 children
        time.sleep(0.1)
    time.sleep(1.2)  # two of the watchdog's looks at the tree
    procs = _walk(server.pid) - {dog}
    assert len(procs) == 3, procs
    server.send_signal(signal.SIGKILL)
    server.wait(10)
    deadline = time.time() + 10
    while time.time() < deadline and ({p for p in procs if p in watchdog._live()} or dog in watchdog._live()):
        time.sleep(0.1)
    left = {p for p in procs | {dog} if p in watchdog._live()}
    assert not left, left


def test_reap_stops_the_runs_processes_and_leaves_other_children_alone():
    run = uuid.uuid4().hex  # two runs of the suite on one machine must not reap each other's
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # not the run's
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            env={**os.environ, watchdog.MARKER: run})
    try:
        deadline = time.time() + 10
        while not watchdog.tree(run, os.getpid()) and time.time() < deadline:
            time.sleep(0.05)
        known = watchdog.tree(run, os.getpid())
        assert {p for p, _ in known} == {ours.pid}
        watchdog.reap(run, known, grace_s=2)
        assert ours.wait(5) == -signal.SIGTERM and other.poll() is None
    finally:
        for p in (other, ours):
            p.kill()
            p.wait()
