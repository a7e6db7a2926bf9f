"""`edgekit web PKG`: the in-browser demo page (examples/web) and one package, served on loopback.

The page runs the package's ONNX model in the tab (onnxruntime-web, WASM) with the JavaScript client that was
written from docs/package-format.md; nothing is predicted on the server. What is served: the page's own files
(`index.html`, `sw.js`, the bundle in `dist/`) and, under `/pkg/`, `manifest.json` and the files the page
reads (labels, tokenizer, the ONNX model), read into memory once their sha256 is checked, so a package rebuilt
while the server runs is never served half-written. Everything else is 404, and so is a request whose Host is
not this loopback address (a page elsewhere cannot reach the package through DNS rebinding). Each answer carries
its body's sha256 as ETag: the browser revalidates (304, no body) rather than downloading the model again, when
the service worker caches what the page has just fetched and on every reload.
"""

from __future__ import annotations

import hashlib
import mimetypes
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from edgekit.errors import EdgekitError
from edgekit.runtime.package import MANIFEST

SITE = Path(__file__).resolve().parent.parent / "examples" / "web"
PAGE_FILES = ("index.html", "sw.js")
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


class Handler(BaseHTTPRequestHandler):
    def __init__(self, *args, table: dict[str, tuple[str, bytes, str]], **kwargs):
        self.table = table
        super().__init__(*args, **kwargs)

    def do_GET(self):  # noqa: N802 (http.server's name)
        found = self.table.get(self.path.split("?", 1)[0])
        addr, port = self.server.server_address[:2]
        # a browser leaves the default port out of Host
        hosts = (f"{addr}:{port}", f"localhost:{port}") + ((addr, "localhost") if port == 80 else ())
        if found is None or self.headers.get("Host") not in hosts:
            self.send_error(404)
            return
        kind, body, sha = found
        etag = f'"{sha}"'
        fresh = etag in (t.strip() for t in self.headers.get("If-None-Match", "").split(","))
        self.send_response(304 if fresh else 200)
        self.send_header("ETag", etag)
        self.send_header("Cache-Control", "no-cache")  # revalidated each time: a rebuilt package is fetched again
        if fresh:
            self.end_headers()
            return
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature); one line per request is noise
        pass


def start(package_dir: str | Path, host: str = "127.0.0.1", port: int = 8080, site: Path = SITE):
    """Check the page and the package, bind, and serve in a daemon thread. Returns (server, url, warning)."""
    from edgekit.runtime import Package

    if not 0 <= port <= 65535:
        raise EdgekitError(f"--port {port}: must be in 0..65535")
    check_site(site)
    # The schema, paths, listed files and sizes; the sha256 of each file served is checked by routes(), on the
    # bytes it serves (the page never reads model.pte, so it is not hashed here).
    pkg = Package.load(package_dir, verify=False)
    if "onnx" not in pkg.manifest["models"]:
        raise EdgekitError(f"{package_dir}: the page runs ONNX models; this package has "
                           f"{', '.join(pkg.manifest['models'])} (build with --target web)")
    warning = None
    if pkg.manifest.get("profile") != "web":
        warning = (f"{package_dir} was built for the {pkg.manifest.get('profile')!r} profile: onnxruntime-web's "
                   "INT8 kernels can answer differently from `edgekit predict --runtime onnx` (SNIPS android: "
                   "1 intent and 13 slot lists of 700 test answers); build with --target web for the same answers")
    table = routes(site, pkg)
    try:
        server = ThreadingHTTPServer((host, port), partial(Handler, table=table))
    except OSError as e:
        raise EdgekitError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    bound = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{bound}/", warning
