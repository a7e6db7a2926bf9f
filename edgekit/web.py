"""`edgekit web PKG`: the in-browser demo page (examples/web) and one package, served on loopback.

The page runs the package's ONNX model in the tab (onnxruntime-web, WASM) with the JavaScript client that was
written from docs/package-format.md; nothing is predicted on the server. What is served: the page's own files
(`index.html`, `sw.js`, the bundle in `dist/`) and, under `/pkg/`, `manifest.json` and the files it lists,
each checked against its sha256 before the server starts. Everything else is 404.
"""

from __future__ import annotations

import mimetypes
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from edgekit.errors import EdgekitError

SITE = Path(__file__).resolve().parent.parent / "examples" / "web"
PAGE_FILES = ("index.html", "sw.js")
TYPES = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
         ".json": "application/json", ".html": "text/html; charset=utf-8"}


def check_site(site: Path) -> None:
    """The page must have been bundled (`npm ci && npm run build` in examples/web)."""
    missing = [p for p in (*PAGE_FILES, "dist/app.js", "dist/ort-wasm-simd-threaded.wasm") if not (site / p).is_file()]
    if missing:
        raise EdgekitError(f"{site}: {missing[0]} is missing; build the page first: cd {site} && npm ci && "
                           "npm run build")


def routes(site: Path, package) -> dict[str, Path]:
    """URL path -> file, for everything the server answers."""
    out = {"/": site / "index.html", **{f"/{p}": site / p for p in PAGE_FILES}}
    out |= {f"/dist/{p.name}": p for p in sorted((site / "dist").iterdir()) if p.is_file()}
    out |= {f"/pkg/{name}": package.root / name for name in ["manifest.json", *package.manifest["files"]]}
    return out


class Handler(BaseHTTPRequestHandler):
    def __init__(self, *args, table: dict[str, Path], **kwargs):
        self.table = table
        super().__init__(*args, **kwargs)

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.table.get(self.path.split("?", 1)[0])
        if path is None:
            self.send_error(404)
            return
        body = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0]
                         or "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache")  # a rebuilt package at the same URL is fetched again
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature); one line per request is noise
        pass


def start(package_dir: str | Path, host: str = "127.0.0.1", port: int = 8080, site: Path = SITE):
    """Check the page and the package, bind, and serve in a daemon thread. Returns (server, url, warning)."""
    from edgekit.runtime import Package

    check_site(site)
    pkg = Package.load(package_dir)  # schema, sha256 of every listed file, no strays
    if "onnx" not in pkg.manifest["models"]:
        raise EdgekitError(f"{package_dir}: the page runs ONNX models; this package has "
                           f"{', '.join(pkg.manifest['models'])} (build with --target web)")
    warning = None
    if pkg.manifest.get("profile") != "web":
        warning = (f"{package_dir} was built for the {pkg.manifest.get('profile')!r} profile: onnxruntime-web's "
                   "INT8 kernels can answer differently from `edgekit predict --runtime onnx` (SNIPS android: 14 "
                   "of 700 test answers); build with --target web for the same answers")
    try:
        server = ThreadingHTTPServer((host, port), partial(Handler, table=routes(site, pkg)))
    except OSError as e:
        raise EdgekitError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}/", warning
