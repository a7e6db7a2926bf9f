"""`edgekit web PKG`: the in-browser demo page (examples/web) and one package, served on loopback.

The page runs the package's ONNX model in the tab (onnxruntime-web, WASM) with the JavaScript client that was
written from docs/package-format.md; nothing is predicted on the server. What is served: the page's own files
(`index.html`, `sw.js`, the bundle in `dist/`) and, under `/pkg/`, `manifest.json` and the files the page
reads (labels, tokenizer, the ONNX model), read into memory once their sha256 is checked, so a package rebuilt
while the server runs is never served half-written. Everything else is 404, and so is a request whose Host is
not this loopback address (a page elsewhere cannot reach the package through DNS rebinding). Each answer carries
its body's sha256 as ETag: the browser revalidates (304, no body) rather than downloading the model again, when
the service worker caches what the page has just fetched and on every reload. HEAD answers as GET, without the body.

Connections are bounded, so that clients which open connections and never finish a request cannot take the
server: a request's line and headers must all arrive within REQUEST_TIMEOUT (10 s) of its first byte being
awaited, however slowly they trickle in, and an answer be taken within as long; then the connection is closed.
At most MAX_CONNECTIONS (256) are handled at once (a thread each; a browser opens 6); one more is answered
`503 Service Unavailable` (Retry-After: 1) and closed at once, without a thread and without reading its request.
"""

from __future__ import annotations

import hashlib
import io
import mimetypes
import sys
import threading
import time
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.runtime.package import MANIFEST

SITE = Path(__file__).resolve().parents[2] / "examples" / "web"  # edgekit/serve/web.py -> the checkout
PAGE_FILES = ("index.html", "sw.js")
REQUEST_TIMEOUT = 10.0  # seconds for a request's line and headers, and for taking its answer
MAX_CONNECTIONS = 256  # handled at once; beyond: 503 and closed
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TYPES = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
         ".json": "application/json", ".html": "text/html; charset=utf-8"}


def check_site(site: Path) -> None:
    """The page must have been bundled (`npm ci && npm run build` in examples/web)."""
    bundle = ("dist/app.js", "dist/ort-wasm-simd-threaded.mjs", "dist/ort-wasm-simd-threaded.wasm")
    missing = [p for p in (*PAGE_FILES, *bundle) if not (site / p).is_file()]
    if missing:
        raise EdgekitError(f"{site}: {missing[0]} is missing; build the page first: cd {site} && npm ci && "
                           "npm run build")


def routes(site: Path, package) -> dict[str, tuple[str, bytes, str]]:
    """URL path -> (content type, body, sha256 of the body), for everything the server answers. The package files
    are the ones the page reads; each is checked here against the manifest's sha256, on the bytes served."""
    m = package.manifest
    files = {"/": site / "index.html", **{f"/{p}": site / p for p in PAGE_FILES}}
    files |= {f"/dist/{p.name}": p for p in sorted((site / "dist").iterdir()) if p.is_file()}
    files |= {f"/pkg/{name}": package.root / name
              for name in [MANIFEST, m["labels"], m["tokenizer"]["file"], m["models"]["onnx"]]}
    out = {}
    for url, p in files.items():
        body = p.read_bytes()
        out[url] = (TYPES.get(p.suffix) or mimetypes.guess_type(p.name)[0] or "application/octet-stream", body,
                    hashlib.sha256(body).hexdigest())
    want = {MANIFEST: package.digest} | {n: f["sha256"] for n, f in m["files"].items()}
    for url, (_, _, sha) in out.items():
        name = url.removeprefix("/pkg/")
        if url.startswith("/pkg/") and sha != want[name]:  # a rebuild started after Package.load read the manifest
            raise EdgekitError(f"{package.root / name}: changed while edgekit web read it; run it again")
    return out


class _Deadline(io.RawIOBase):
    """The socket, read against the handler's deadline for the whole request: a client that sends a byte now
    and then cannot hold its connection, as it could against a timeout for each read."""

    def __init__(self, sock, handler):
        self.sock, self.handler = sock, handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not complete in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class Handler(BaseHTTPRequestHandler):
    def __init__(self, *args, table: dict[str, tuple[str, bytes, str]], timeout: float = REQUEST_TIMEOUT, **kwargs):
        self.table, self.timeout, self.deadline = table, timeout, time.monotonic() + timeout
        super().__init__(*args, **kwargs)

    def setup(self):
        super().setup()
        self.rfile = io.BufferedReader(_Deadline(self.connection, self))

    def handle_one_request(self):
        self.deadline = time.monotonic() + self.timeout  # from the wait for its first byte
        super().handle_one_request()

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.answer(body=True)

    def do_HEAD(self):  # noqa: N802
        self.answer(body=False)

    def answer(self, body: bool):
        self.connection.settimeout(self.timeout)  # to take the answer (the deadline was for the request)
        found = self.table.get(self.path.split("?", 1)[0])
        addr, port = self.server.server_address[:2]
        # a browser leaves the default port out of Host
        hosts = (f"{addr}:{port}", f"localhost:{port}") + ((addr, "localhost") if port == 80 else ())
        if found is None or self.headers.get("Host") not in hosts:
            self.send_error(404)  # no body for HEAD (http.server)
            return
        kind, data, sha = found
        etag = f'"{sha}"'
        fresh = etag in (t.strip() for t in self.headers.get("If-None-Match", "").split(","))
        self.send_response(304 if fresh else 200)
        self.send_header("ETag", etag)
        self.send_header("Cache-Control", "no-cache")  # revalidated each time: a rebuilt package is fetched again
        if fresh:
            self.end_headers()
            return
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature); one line per request is noise
        pass


class Server(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once; one more is answered 503 and closed."""

    request_queue_size = 128  # the listen backlog: a burst of connections waits to be accepted

    def __init__(self, address, handler, max_connections: int = MAX_CONNECTIONS):
        self.slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            try:
                request.setblocking(False)  # never wait on a client here: this is the thread that accepts
                request.send(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):  # a client that went away is no error of the server's
            super().handle_error(request, client_address)


def serve(table: dict[str, tuple[str, bytes, str]], host: str = "127.0.0.1", port: int = 0,
          timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> Server:
    """Bind and answer from `table` (routes()) in a daemon thread."""
    try:
        server = Server((host, port), partial(Handler, table=table, timeout=timeout), max_connections)
    except OSError as e:
        raise EdgekitError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start(package_dir: str | Path, host: str = "127.0.0.1", port: int = 8080, site: Path = SITE):
    """Check the page and the package, bind, and serve in a daemon thread. Returns (server, url, warning)."""
    from edgekit.runtime import Package
    from edgekit.runtime.package import SCHEMA_VERSION

    if not 0 <= port <= 65535:
        raise EdgekitError(f"--port {port}: must be in 0..65535")
    check_site(site)
    # The schema, paths, listed files and sizes; the sha256 of each file served is checked by routes(), on the
    # bytes it serves (the page never reads model.pte, so it is not hashed here).
    pkg = Package.load(package_dir, verify=False)
    if pkg.manifest["schema_version"] != SCHEMA_VERSION:  # the page's client reads the current schema only (R2)
        raise EdgekitError(f"manifest.json: schema_version {pkg.manifest['schema_version']} is not "
                           f"supported by this client (it reads {SCHEMA_VERSION}); rebuild the package with an "
                           f"edgekit that writes schema_version {SCHEMA_VERSION}")
    if "onnx" not in pkg.manifest["models"]:
        raise EdgekitError(f"{package_dir}: the page runs ONNX models; this package has "
                           f"{', '.join(pkg.manifest['models'])} (build with --target web)")
    warning = None
    if pkg.manifest.get("profile") != "web":
        warning = (f"{package_dir} was built for the {pkg.manifest.get('profile')!r} profile: onnxruntime-web's "
                   "INT8 kernels can answer differently from `edgekit predict --runtime onnx` (SNIPS android: "
                   "1 intent and 13 slot lists of 700 test answers); build with --target web for the same answers")
    server = serve(routes(site, pkg), host, port)
    return server, f"http://{host}:{server.server_address[1]}/", warning
