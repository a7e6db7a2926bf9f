"""What runs in HAProxy's place when Serve starts it for `edgekit serve`: three things the pinned Ray Serve cannot be
told, then the real HAProxy (exec, same pid, same arguments otherwise).

1. HAProxy dies with the Serve proxy actor that started it (prctl PR_SET_PDEATHSIG): a Ray stopped by a signal to
   its process group, or by SIGKILL of `edgekit serve`, takes its actors down, and without this their HAProxy lived
   on as an orphan holding the serving port (issue 40). Serve starts HAProxy in the foreground (`-db`) from its
   actor's event-loop thread, which lives as long as the actor.
2. Its stats and Prometheus listeners bind loopback: Serve's config template binds them on every interface
   (`bind *:PORT`, `bind :PORT`) with no setting to narrow it. The HTTP frontend keeps the address `--host` gave.
3. A request that no replica answered (502/503/504 after the retries ray_env asks for) gets a JSON body, as every
   other error of the server does, instead of Serve's text/plain "Internal Server Error".

Run as `python -I -S haproxy_shim.py REAL_HAPROXY ARGS...` (stdlib only: it starts on every HAProxy reload).
The config it is given is not changed; a copy beside it (`<config>.edgekit`) is what HAProxy reads.
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
ERROR_BODY = b'{"error": "no replica answered the request (it was retried on another replica)"}'


def error_response(status: int) -> bytes:
    reason = {502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}[status]
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(ERROR_BODY)}\r\n"
            "Cache-Control: no-cache\r\nConnection: close\r\n\r\n").encode() + ERROR_BODY


def rewrite(config: str, folder: str) -> str:
    """Serve's HAProxy config -> ours: listeners on every interface moved to loopback, errorfiles to JSON ones
    written in `folder`."""
    config = ALL_INTERFACES.sub(lambda m: f"{m.group(1)}127.0.0.1:{m.group(3)}", config)

    def errorfile(m: re.Match) -> str:
        path = os.path.join(folder, f"edgekit-{m.group(2)}.http")
        write(path, error_response(int(m.group(2))))
        return f"{m.group(1)}{m.group(2)} {path}"

    return ERRORFILE.sub(errorfile, config)


def write(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # reloads can overlap: each writes its own temp file, then renames
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    real, args = argv[0], list(argv[1:])
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was set: nobody would stop us
            sys.exit(1)
    if "-f" in args:
        i = args.index("-f") + 1
        with open(args[i], encoding="utf-8") as f:
            config = rewrite(f.read(), os.path.dirname(os.path.abspath(args[i])))
        write(args[i] + ".edgekit", config.encode())
        args[i] += ".edgekit"
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
