"""Every process `edgekit serve` started, found and stopped however `edgekit serve` itself ended.

For the length of `ray.init`, `edgekit serve` (edgekit.serve.app.start) puts a marker in its environment
(`EDGEKIT_SERVE_RUN=<run id>`). Ray's GCS, raylet and monitors start then and inherit it, the actors inherit it
from the raylet, and HAProxy from its actor: every process of the run carries it, whoever its parent is by then (a
process whose parent died is adopted by init), and nothing else the caller starts does. So:

- `reap(run)`: SIGTERM to every process that carries the marker, SIGKILL to those left after a grace period. The
  last step of a normal stop (`edgekit.serve.app.stop`): after a SIGTERM to the whole process group, Ray's GCS and
  raylet die first and the actors linger for tens of seconds (issue 40).
- `watch(run)`: a small process of its own session (a signal to the server's group does not reach it) that notes
  the server's process tree twice a second and waits on a pipe only `edgekit serve` holds open. When that ends
  (exit, crash, SIGKILL), it reaps the run and what the tree held, with the grace period a stop wrote on the pipe
  (none when Serve did not stop in time or Ray's GCS or raylet was gone) or 3 s. Ray rewrites its agents' titles
  over their environment, so the marker alone does not find them.

Linux only (/proc); elsewhere both do nothing. Stdlib only: the watchdog runs as `python -I -S watchdog.py RUN`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MARKER = "EDGEKIT_SERVE_RUN"
PROC = Path("/proc")
Proc = tuple[int, int]  # (pid, start time in clock ticks): a pid the kernel gave to a new process is another one


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, None if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


def _live() -> dict[int, tuple[int, int]]:
    """Every live process (zombies left out): pid -> (parent pid, start time)."""
    out = {}
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) and st[0] not in ("Z", "X"):
            out[int(entry.name)] = st[1], st[2]
    return out


def tree(run: str, root: int) -> set[Proc]:
    """The run's processes under `root` (the process that started Ray): its children that carry the run's marker
    (Ray's GCS, raylet, monitors), and everything under those. Other children of `root` are not the run's."""
    live = _live()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in live.items():
        children.setdefault(ppid, []).append(pid)
    frontier = [pid for pid in children.get(root, ()) if _carries(pid, run)]
    found = {(pid, live[pid][1]) for pid in frontier}
    while frontier:
        for pid in children.get(frontier.pop(), ()):
            found.add((pid, live[pid][1]))
            frontier.append(pid)
    return found


def _carries(pid: int, run: str) -> bool:
    try:
        return f"{MARKER}={run}".encode() in (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile, or another user's
        return False


def marked(run: str) -> set[Proc]:
    """The live processes whose environment carries MARKER=run (one whose title Ray rewrote over its environment,
    as its agents' is, no longer shows it: `tree` finds those), this one left out."""
    me = os.getpid()
    return {(pid, start) for pid, (_, start) in _live().items() if pid != me and _carries(pid, run)}


def alive(procs: set[Proc]) -> set[Proc]:
    """Those of `procs` that still run (the same processes: the pid and its start time)."""
    live = _live()
    return {(pid, start) for pid, start in procs if pid in live and live[pid][1] == start}


def names(procs: set[Proc]) -> set[str]:
    """The command names (/proc/PID/comm) of those of `procs` that still run."""
    out = set()
    for pid, _ in procs:
        try:
            out.add((PROC / str(pid) / "comm").read_text().strip())
        except OSError:  # gone meanwhile
            pass
    return out


def reap(run: str, known: set[Proc] = frozenset(), grace_s: float = 3.0) -> set[Proc]:
    """Stop every process of the run (carrying its marker, or in `known`): SIGTERM, then SIGKILL to what is left
    after grace_s. Returns those that needed the SIGKILL."""
    procs = marked(run) | alive(set(known))
    for pid, _ in procs:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and alive(procs):
        time.sleep(0.1)
    left = alive(procs)
    for pid, _ in left:
        _signal(pid, signal.SIGKILL)
    return left


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # gone already
        pass


def watch(run: str) -> subprocess.Popen | None:
    """Start the watchdog of `run`; None where there is no /proc to find its processes in. The caller keeps the
    returned process (its stdin pipe is the watchdog's lifeline) for as long as it serves."""
    if not PROC.is_dir():
        return None
    # the pipe's write end stays in this process alone (Python's fds are not inherited), so its end means ours
    return subprocess.Popen([sys.executable, "-I", "-S", __file__, run], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if k != MARKER})


def _main(run: str) -> None:
    """Until `edgekit serve` (our parent) is gone, however it ended, note its process tree twice a second: Ray's
    agents are found by it alone, and once their parent dies they belong to init. Then reap the run."""
    import select

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is the server's to handle
    parent, known, grace_s = os.getppid(), set(), 3.0
    while True:
        known = alive(known) | tree(run, parent)
        if select.select([sys.stdin], [], [], 0.5)[0]:
            data = os.read(sys.stdin.fileno(), 1024)
            if not data:
                break  # end of the pipe: `edgekit serve` closed it (a clean stop) or died
            try:  # the stop's own grace period (edgekit.serve.app._end_run)
                grace_s = float(data.split()[-1])
            except (ValueError, IndexError):
                pass
    reap(run, known, grace_s)


if __name__ == "__main__":
    _main(sys.argv[1])
