"""What runs in HAProxy's place when Serve starts it for `edgekit serve`: three things the pinned Ray Serve cannot be
told, then the real HAProxy (exec: the same pid, the same arguments).

1. HAProxy dies with the Serve proxy actor that started it (prctl PR_SET_PDEATHSIG): a Ray stopped by a signal to
   its process group, or by SIGKILL of `edgekit serve`, takes its actors down, and without this their HAProxy lived
   on as an orphan holding the serving port (issue 40). Serve starts HAProxy in the foreground (`-db`) from its
   actor's event-loop thread, which lives as long as the actor. Linux only.
2. Its stats and Prometheus listeners bind loopback: Serve's config template binds them on every interface
   (`bind *:STATS`, `bind :METRICS`) with no setting to narrow it. Only those two ports (from the environment
   edgekit.serve.ray_env gave Serve, which reaches its actors) move: the HTTP frontend keeps the address `--host`
   gave, `*` for 0.0.0.0.
3. A request that no replica answered (HAProxy's own 502/503/504) gets a JSON body, as every other error of the
   server does, instead of Serve's text/plain "Internal Server Error".
4. HAProxy waits for a request's whole body before it sends the request on (`option http-buffer-request`). Without
   it, a request whose replica was SIGKILLed while it held it was at times not retried (its L7 retry needs the whole
   request in HAProxy's buffer): a 502, or on a keep-alive connection a close with no answer, in about one kill in
   two under load (docs/serving.md, "Faults").

The config is rewritten in place, under the lock Serve writes it under (`<config>.lock`), so HAProxy's command line
stays the one Serve recognises its workers by (`-f <config>` in /proc/PID/cmdline) on a reload. The rewrite is
idempotent. Run as `python -I -S haproxy_shim.py PARENT_PID REAL_HAPROXY ARGS...` (stdlib only: it starts on every
reload of HAProxy; PARENT_PID: the shell's $PPID, the actor that started it).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys

PR_SET_PDEATHSIG = 1
# `bind *:8404` (stats) and `bind :9101` (Prometheus): a port alone means every interface
ALL_INTERFACES = re.compile(r"^(\s*bind\s+)(\*)?:(\d+)\b", re.MULTILINE)
ERRORFILE = re.compile(r"^(\s*errorfile\s+)(50[234])\s+\S+", re.MULTILINE)
ERROR_BODY = b'{"error": "no replica answered the request"}'
DEFAULTS = re.compile(r"^defaults\b[^\n]*\n", re.MULTILINE)  # Serve's defaults section: ours is its first line
BUFFER_REQUEST = "option http-buffer-request"
PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")  # set by edgekit.serve.ray_env


def error_response(status: int) -> bytes:
    reason = {502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}[status]
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(ERROR_BODY)}\r\n"
            "Cache-Control: no-cache\r\nConnection: close\r\n\r\n").encode() + ERROR_BODY


def rewrite(config: str, folder: str, ports: set[int]) -> str:
    """Serve's HAProxy config -> ours: the listeners on `ports` that bind every interface moved to loopback, the
    errorfiles to JSON ones written in `folder`, and `option http-buffer-request` in its defaults."""
    def bind(m: re.Match) -> str:
        return f"{m.group(1)}127.0.0.1:{m.group(3)}" if int(m.group(3)) in ports else m.group(0)

    config = ALL_INTERFACES.sub(bind, config)

    def errorfile(m: re.Match) -> str:
        path = os.path.join(folder, f"edgekit-{m.group(2)}.http")
        write(path, error_response(int(m.group(2))))
        return f"{m.group(1)}{m.group(2)} {path}"

    config = ERRORFILE.sub(errorfile, config)
    if BUFFER_REQUEST not in config:
        config = DEFAULTS.sub(lambda m: f"{m.group(0)}    {BUFFER_REQUEST}\n", config, count=1)
    return config


def write(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # reloads can overlap: each writes its own temp file, then renames
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    parent, real, args = int(argv[0]), argv[1], list(argv[2:])
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the actor died before the signal was set: nobody would stop us
            sys.exit(1)
    if "-f" in args:
        rewrite_in_place(args[args.index("-f") + 1])
    os.execv(real, [real, *args])


def rewrite_in_place(path: str) -> None:
    """Rewrite Serve's config file where it is, holding the lock Serve writes it under."""
    import fcntl

    ports = {int(os.environ[k]) for k in PORTS if os.environ.get(k, "").isdigit()}
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as f:
                config = f.read()
            new = rewrite(config, os.path.dirname(os.path.abspath(path)), ports)
            if new != config:
                write(path, new.encode())
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


if __name__ == "__main__":
    main(sys.argv[1:])
