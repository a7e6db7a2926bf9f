"""One replica of `edgekit serve`'s deployment (edgekit.serve.app.application): HTTP straight from Serve's proxy,
each request checked (a bad one gets a 4xx and never reaches the model), and answered through `edgekit.runtime` in
the batches `@serve.batch` gathers from concurrent requests, joined in one Pool.

Imported when serving only (application() imports it): Ray and Starlette are imported here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from ray import serve
from starlette.responses import JSONResponse, PlainTextResponse

from edgekit.runtime import Package, Predictor
from edgekit.serve.calls import BadRequest, Pool, check_item, in_calls
from edgekit.serve.metrics import Metrics
from edgekit.serve.settings import ServeSettings

log = logging.getLogger("edgekit")
ENDPOINTS = ("/predict", "/predict_batch", "/healthz", "/metrics")


class Replica:
    """A replica: the package's files (manifest and every file it lists, as bytes: they travel through Ray to any
    node) written to a folder of its own and opened (Predictor.open checks every file's sha256), run as `settings`
    say. application() makes it a Serve deployment."""

    def __init__(self, files: dict[str, bytes], settings: ServeSettings):
        s = self.settings = settings
        root = Path(tempfile.mkdtemp(prefix="edgekit-pkg-"))
        try:
            for name, data in files.items():
                (root / name).write_bytes(data)
            pkg = Package.load(root)  # every file's sha256, and the runtime's one reading of its JSON files
            runtime = "onnx" if "onnx" in pkg.manifest["models"] else pkg.manifest["primary_runtime"]
            self.pred = Predictor.open(pkg, runtime, threads=s.threads, providers=s.providers, spin=s.spin)
        finally:  # the session holds what it needs; a replica killed later must not leave a copy of the package
            shutil.rmtree(root, ignore_errors=True)
        self.intents = pkg.labels["intents"]
        self.decoding = bool(pkg.manifest.get("decoding"))  # the graph takes an intent mask (allow_intents)
        self.answerable = None if pkg.answerable is None else set(pkg.answerable)  # R14
        self.id, self.metrics = uuid.uuid4().hex[:8], Metrics(self.pred.provider)
        self.pool = Pool(s.max_batch, self._run)
        # predict_many batched, per instance (serve.batch of a bound method: a queue of this replica's own, and the
        # batch calls the method with the items only); the same name keeps Ray's serve_batch_* metrics' function_name
        batch = serve.batch(max_batch_size=s.max_batch, batch_wait_timeout_s=s.batch_wait_ms / 1000,
                            max_concurrent_batches=max(1, s.max_ongoing_requests // s.max_batch))  # all join the pool
        self.predict_many = batch(self.predict_many)

    async def predict_many(self, items: list[dict]) -> list[dict]:
        return await self.pool.answer(items)

    async def _run(self, items: list[dict]) -> list[dict]:
        start = time.perf_counter()
        self.metrics.batch(len(items), [start - i["t"] for i in items])
        try:
            return await asyncio.to_thread(in_calls, items, self.settings.sub_batch, self.pred.predict_batch)
        except Exception:  # one bad item must not fail its batch-mates: answer them one by one
            return [await asyncio.to_thread(self._alone, i) for i in items]

    def _alone(self, item: dict) -> dict:
        try:
            return self.pred.predict(item["text"], False, item["allow_intents"], item["reject"])
        except Exception as e:
            return {"__error__": f"{type(e).__name__}: {e}"}

    async def _one(self, item: dict) -> dict:
        timeout_s = self.settings.timeout_s
        try:
            out = await asyncio.wait_for(self.predict_many(item | {"t": time.perf_counter()}), timeout_s)
        except asyncio.TimeoutError:
            raise BadRequest(503, f"no answer within {timeout_s} s (server overloaded)") from None
        if "__error__" in out:
            raise BadRequest(500, f"internal error: {out['__error__']}")
        return out

    def _health(self) -> JSONResponse:
        """replicas: how many answer once it is up; max_replicas (autoscaling): at most."""
        s = self.settings
        scale = {"replicas": s.min_replicas, "max_replicas": s.max_replicas} if s.autoscale else {
            "replicas": s.replicas}
        return JSONResponse({"status": "ok", "provider": self.pred.provider, "batched": self.pred.batched,
                             "replica": self.id, **scale})

    async def _route(self, request, path: str):
        s = self.settings
        if path == "/healthz":
            return self._health()
        if path == "/metrics":
            return PlainTextResponse(self.metrics.text(self.id), media_type="text/plain; version=0.0.4")
        if request.method != "POST":
            raise BadRequest(405, f"{path} takes POST")
        raw = await request.body()
        if len(raw) > (s.max_text_chars * 4 + 1024) * s.max_batch:
            raise BadRequest(413, f"body of {len(raw)} bytes is over the limit")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise BadRequest(400, f"malformed JSON: {type(e).__name__}: {e}"[:300]) from None
        if path == "/predict":
            return JSONResponse(await self._one(check_item(body, self.intents, s.max_text_chars,
                                                           decoding=self.decoding, answerable=self.answerable)))
        return JSONResponse({"results": await self._predict_batch(body)})

    async def _predict_batch(self, body: object) -> list[dict]:
        """A /predict_batch body's answers: each text a /predict item of its own, so they batch with everyone's."""
        s = self.settings
        if not isinstance(body, dict):
            raise BadRequest(400, "the body must be a JSON object")
        texts = body.get("texts")
        if not isinstance(texts, list) or not texts:
            raise BadRequest(422, "texts: required, a non-empty list of strings")
        if len(texts) > s.max_batch:
            raise BadRequest(413, f"texts: {len(texts)} texts, at most {s.max_batch} per call")
        items = [check_item({**body, "text": t}, self.intents, s.max_text_chars, "texts[]", self.decoding,
                            self.answerable) for t in texts]
        return await asyncio.gather(*(self._one(i) for i in items))

    async def __call__(self, request):
        t0, path = time.perf_counter(), request.url.path.rstrip("/") or "/"
        known = path in ENDPOINTS
        key = path if known else "other"
        self.metrics.requests[key] = self.metrics.requests.get(key, 0) + 1
        try:
            if not known:
                raise BadRequest(404, f"no endpoint {path}; endpoints: {', '.join(ENDPOINTS)}")
            response = await self._route(request, path)
        except BadRequest as e:
            response = JSONResponse({"error": str(e)}, status_code=e.status)
        except Exception as e:  # a failure answers this request only; the replica goes on
            log.exception("request failed")
            response = JSONResponse({"error": f"internal error: {type(e).__name__}: {e}"}, status_code=500)
        if response.status_code >= 400:
            self.metrics.errors[key] = self.metrics.errors.get(key, 0) + 1
        elif path in ("/predict", "/predict_batch"):
            self.metrics.answered(time.perf_counter() - t0)
        return response
