"""`edgekit serve OUT`: a package behind HTTP on Ray Serve, with dynamic batching.

One deployment: each replica takes HTTP straight from Serve's proxy (HAProxy by default: edgekit.ray_env),
validates the request (a bad one gets a 4xx and never reaches the model), and answers through `edgekit.runtime` in
batches that `@serve.batch` gathers from concurrent requests (size and wait window from the package's `serve` table,
which the profile wrote);
`/predict_batch` is fanned out as single items, so they batch with everyone else's. A second deployment in front
(an ingress) cost half the throughput on a 2-core machine: every hop is a Ray call. The package travels to the
replicas as bytes through Ray, so the same command serves on a multi-node cluster (`--address`); each replica
checks every file's sha256 before loading.

Ray is imported lazily: `pip install -e '.[serve]'`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from edgekit.serve_metrics import Metrics

log = logging.getLogger("edgekit")


@dataclass
class ServeSettings:
    """How `edgekit serve` runs a package: the profile's [serve] table, copied into the manifest."""

    providers: list[str] = field(default_factory=lambda: ["cpu"])  # tried in order (edgekit.runtime.providers)
    max_batch: int = 32  # @serve.batch max_batch_size, and the most texts one /predict_batch call may send
    batch_wait_ms: float = 5.0  # how long a batch waits to fill
    max_ongoing_requests: int = 256  # per replica: well above max_batch, or batches stay small (Ray's default 5)
    replicas: int = 1  # fixed replica count when autoscale is false; 0: one per `threads` CPUs of the Ray cluster
    autoscale: bool = False
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: int = 64  # autoscaling: requests in flight per replica it aims for
    num_gpus: float = 0.0  # per replica (a fraction shares a card); ORT's gpu_mem_limit follows it
    gpu_memory_gb: float = 24.0  # the card's memory: gpu_mem_limit = num_gpus * gpu_memory_gb
    threads: int = 1  # ONNX Runtime intra-op threads per replica (and the CPUs Ray reserves for it)
    spin: bool = False  # those threads spin-wait between calls: on cores shared with the proxy that costs throughput
    max_text_chars: int = 2000  # longer texts are refused (413)
    timeout_s: float = 10.0  # a request that waits longer is answered 503
    proxy: str = "haproxy"  # Serve's HAProxy ingress or its Python proxy ("python"); a local Ray only (ray_env)
    # 0: one model call a batch. N: the batch sorted by length, in calls of at most N: on a dynamic sequence axis each
    # call is padded to its longest utterance only (SNIPS, 2 CPU cores: 32 in two calls of 16 gave the model +20%
    # utterances/s, the served `high` load +16%)
    sub_batch: int = 0
    # Ray Serve's access log: a line per request in each replica's log file (Ray's session folder, which edgekit serve
    # never shows). Off, 2 cores under `high`: +7% with no model, +3% one at a time, +2% batched (within noise)
    # (docs/experiments.md, 2026-12-05); edgekit's own /metrics counts every request either way
    access_log: bool = False

    def __post_init__(self):
        from edgekit.ray_env import PROXIES
        from edgekit.runtime.providers import PROVIDERS

        if self.proxy not in PROXIES:
            raise ValueError(f"proxy must be one of {', '.join(PROXIES)}, got {self.proxy!r}")

        bad = [p for p in self.providers if p not in PROVIDERS]
        if bad or not self.providers:
            raise ValueError(f"providers must be some of {', '.join(PROVIDERS)}, got {self.providers}")
        for name in ("max_batch", "max_ongoing_requests", "min_replicas", "max_replicas",
                     "target_ongoing_requests", "threads", "max_text_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_ongoing_requests < self.max_batch:
            raise ValueError(f"max_ongoing_requests must be >= max_batch ({self.max_batch}), got "
                             f"{self.max_ongoing_requests}: fewer would cap every batch")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas must be >= min_replicas ({self.min_replicas}), got {self.max_replicas}")
        for name in ("replicas", "batch_wait_ms", "num_gpus", "gpu_memory_gb", "timeout_s", "sub_batch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def replica_count(settings: ServeSettings, cpus: float, gpus: float = 0.0) -> ServeSettings:
    """`replicas = 0` made a count: one replica per `threads` of the cluster's free `cpus` (and no more than its
    `gpus` hold at `num_gpus` each), at least one. On a CPU, replicas of one thread each answered more than one
    replica of every thread (docs/experiments.md, 2026-12-04: each has its own event loop, and one ONNX Runtime
    thread needs no waking); a fixed count or autoscaling stays as it is."""
    if settings.replicas or settings.autoscale:
        return settings
    n = int(cpus) // settings.threads
    if settings.num_gpus:
        n = min(n, int(gpus / settings.num_gpus + 1e-6))  # 0.3 / 0.1 is 2.9999999999999996
    return replace(settings, replicas=max(1, n))


# what Serve's proxies (HAProxy, the Python one) say when the address was taken between check_port and their bind
BIND_FAILURES = ("Address already in use", "Failed to bind to address")


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_item(body: object, intents: list[str], limit: int, field_name: str = "text", decoding: bool = True) -> dict:
    """A /predict body (or one /predict_batch text, its `text` set) -> the item a replica answers; BadRequest
    names the field (`field_name`). decoding: the package's graph takes an intent mask."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    text = body.get("text")
    if not isinstance(text, str):
        raise BadRequest(422, f"{field_name}: required, a string")
    if len(text) > limit:
        raise BadRequest(413, f"{field_name}: {len(text)} characters, the limit is {limit}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # JSON may carry a lone surrogate ("\ud800"), which is no text
        raise BadRequest(422, f"{field_name}: not valid Unicode (a lone surrogate)") from None
    allow = body.get("allow_intents")
    if allow is not None and not decoding:
        raise BadRequest(422, "allow_intents: this package's graph has no intent mask (built without decoding)")
    if allow is not None:
        if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
            raise BadRequest(422, "allow_intents: a list of intent names")
        if not allow:
            raise BadRequest(422, "allow_intents: empty (no intent could answer)")
        unknown = [a for a in allow if a not in intents]
        if unknown:
            raise BadRequest(422, f"allow_intents: unknown intent {unknown[0]!r}; known: {', '.join(intents)}")
    reject = body.get("reject", True)
    if not isinstance(reject, bool):
        raise BadRequest(422, "reject: true or false")
    return {"text": text, "allow_intents": allow, "reject": reject}


class Pool:
    """The items of the batches Serve formed, answered by one model call at a time; each call takes up to max_batch
    of the oldest. Serve forms a batch per wait window even while the model is busy, and those batches wait their
    turn, so under load they would stay a few items each (mean 2.4 under `high`, docs/experiments.md). Joined in
    one pool, the model's batches grow with the backlog. run: async, items -> their answers, in order."""

    def __init__(self, max_batch: int, run):
        self.max_batch, self.run = max_batch, run
        self.items: list[tuple[dict, asyncio.Future]] = []  # oldest first
        self.lock = asyncio.Lock()  # one model call at a time

    async def answer(self, items: list[dict]) -> list:
        loop = asyncio.get_running_loop()
        mine = [loop.create_future() for _ in items]
        self.items += zip(items, mine)
        while not all(f.done() for f in mine):
            async with self.lock:
                if all(f.done() for f in mine):  # a call made while we waited took them
                    break
                take, self.items = self.items[:self.max_batch], self.items[self.max_batch:]
                try:
                    outs = await self.run([i for i, _ in take])
                except BaseException:  # cancelled mid-call: the next call answers them
                    self.items[:0] = take
                    raise
                for (_, f), out in zip(take, outs):
                    f.set_result(out)
        return [f.result() for f in mine]


def in_calls(items: list[dict], sub_batch: int, predict_batch) -> list[dict]:
    """The answers to `items`, in order: one predict_batch call, or with sub_batch N < len(items) the items sorted by
    length (characters: no tokenizing twice) in calls of at most N, so each call pads to a nearer longest one."""
    n = sub_batch or len(items)
    order = sorted(range(len(items)), key=lambda k: len(items[k]["text"])) if n < len(items) else range(len(items))
    answers = [None] * len(items)
    for i in range(0, len(items), n):
        part = [items[k] for k in order[i:i + n]]
        outs = predict_batch([it["text"] for it in part], [it["allow_intents"] for it in part],
                             [it["reject"] for it in part])
        for k, out in zip(order[i:i + n], outs):
            answers[k] = out
    return answers


def package_files(package: Path) -> dict[str, bytes]:
    """The package's files (the manifest and every file it lists), to ship to replicas on any node."""
    from edgekit.runtime.package import MANIFEST, Package

    pkg = Package.load(package)
    return {name: (package / name).read_bytes() for name in [MANIFEST, *pkg.manifest["files"]]}


def settings_of(manifest: dict, **over) -> ServeSettings:
    """The package's serve table (defaults for a phone package), with the command line's overrides."""
    values = {k: v for k, v in (manifest.get("serve") or {}).items() if k in ServeSettings.__dataclass_fields__}
    values.update({k: v for k, v in over.items() if v is not None})
    if over.get("max_batch") and values.get("max_ongoing_requests", 0) < over["max_batch"]:
        values["max_ongoing_requests"] = 8 * over["max_batch"]
    return ServeSettings(**values)


def application(package: Path, settings: ServeSettings):
    """The Ray Serve application for `package`: one deployment whose replicas take HTTP from Serve's proxy."""
    from ray import serve
    from starlette.responses import JSONResponse, PlainTextResponse

    if not settings.replicas and not settings.autoscale:
        raise ValueError("replicas = 0 must be counted first (replica_count)")
    files = package_files(package)
    manifest = json.loads(files["manifest.json"])
    labels = json.loads(files[manifest["labels"]])
    runtime = "onnx" if "onnx" in manifest["models"] else manifest["primary_runtime"]
    decoding = bool(manifest.get("decoding"))
    s = settings
    # On shutdown, in-flight requests get a few seconds to finish (Ray's default is 20 s, then it kills them).
    grace = {"graceful_shutdown_timeout_s": 5.0, "graceful_shutdown_wait_loop_s": 0.5}

    @serve.deployment(name="edgekit", max_ongoing_requests=s.max_ongoing_requests, **grace,
                      logging_config={"enable_access_log": s.access_log})
    class Replica:
        def __init__(self, files: dict[str, bytes]):
            import tempfile
            import uuid

            from edgekit.runtime import Predictor

            root = Path(tempfile.mkdtemp(prefix="edgekit-pkg-"))
            for name, data in files.items():
                (root / name).write_bytes(data)
            # Predictor.open checks every file's sha256
            self.pred = Predictor.open(root, runtime, threads=s.threads, providers=s.providers, spin=s.spin)
            self.id, self.metrics = uuid.uuid4().hex[:8], Metrics(self.pred.provider)
            self.pool = Pool(s.max_batch, self._run)

        @serve.batch(max_batch_size=s.max_batch, batch_wait_timeout_s=s.batch_wait_ms / 1000,
                     max_concurrent_batches=max(1, s.max_ongoing_requests // s.max_batch))  # all join the pool
        async def predict_many(self, items: list[dict]) -> list[dict]:
            return await self.pool.answer(items)

        async def _run(self, items: list[dict]) -> list[dict]:
            start = time.perf_counter()
            self.metrics.batch(len(items), [start - i["t"] for i in items])
            try:
                return await asyncio.to_thread(in_calls, items, s.sub_batch, self.pred.predict_batch)
            except Exception:  # one bad item must not fail its batch-mates: answer them one by one
                return [await asyncio.to_thread(self._alone, i) for i in items]

        def _alone(self, item: dict) -> dict:
            try:
                return self.pred.predict(item["text"], False, item["allow_intents"], item["reject"])
            except Exception as e:
                return {"__error__": f"{type(e).__name__}: {e}"}

        async def _one(self, item: dict) -> dict:
            try:
                out = await asyncio.wait_for(self.predict_many(item | {"t": time.perf_counter()}), s.timeout_s)
            except asyncio.TimeoutError:
                raise BadRequest(503, f"no answer within {s.timeout_s} s (server overloaded)") from None
            if "__error__" in out:
                raise BadRequest(500, f"internal error: {out['__error__']}")
            return out

        async def _route(self, request, path: str):
            if path == "/healthz":  # replicas: how many answer once it is up; max_replicas (autoscaling): at most
                scale = {"replicas": s.min_replicas, "max_replicas": s.max_replicas} if s.autoscale else {
                    "replicas": s.replicas}
                return JSONResponse({"status": "ok", "provider": self.pred.provider, "batched": self.pred.batched,
                                     "replica": self.id, **scale})
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
                return JSONResponse(await self._one(check_item(body, labels["intents"], s.max_text_chars,
                                                                   decoding=decoding)))
            if not isinstance(body, dict):
                raise BadRequest(400, "the body must be a JSON object")
            texts = body.get("texts")
            if not isinstance(texts, list) or not texts:
                raise BadRequest(422, "texts: required, a non-empty list of strings")
            if len(texts) > s.max_batch:
                raise BadRequest(413, f"texts: {len(texts)} texts, at most {s.max_batch} per call")
            items = [check_item({**body, "text": t}, labels["intents"], s.max_text_chars, "texts[]", decoding)
                     for t in texts]
            return JSONResponse({"results": await asyncio.gather(*(self._one(i) for i in items))})

        async def __call__(self, request):
            t0, path = time.perf_counter(), request.url.path.rstrip("/") or "/"
            known = path in ("/predict", "/predict_batch", "/healthz", "/metrics")
            key = path if known else "other"
            self.metrics.requests[key] = self.metrics.requests.get(key, 0) + 1
            try:
                if not known:
                    raise BadRequest(404, f"no endpoint {path}; endpoints: /predict, /predict_batch, /healthz, "
                                          "/metrics")
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

    scaling = ({"autoscaling_config": {"min_replicas": s.min_replicas, "max_replicas": s.max_replicas,
                                       "target_ongoing_requests": s.target_ongoing_requests}}
               if s.autoscale else {"num_replicas": s.replicas})
    return Replica.options(**scaling, ray_actor_options={"num_cpus": s.threads, "num_gpus": s.num_gpus}).bind(files)


def start(package: Path, settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000,
          address: str | None = None, after_init=None, app=None) -> ServeSettings:
    """Start Ray (or join the cluster at `address`) and Serve, and deploy the package. Returns, once it answers,
    the settings it runs with (`replicas = 0` counted, the proxy that started).
    after_init: called once Ray is up (ray.init replaces the process's SIGTERM handler; the caller's goes back).
    app: settings -> a bound Serve application, deployed instead of the package's (examples/serve_ceiling.py's
    model-free server), with the settings counted here.
    A cluster we join keeps the proxy it was started with (RAY_SERVE_ENABLE_HA_PROXY on every node)."""
    import os

    from edgekit.errors import EdgekitError
    from edgekit.ray_env import check_port, proxy_environment, ray_temp_dir

    if not address:  # a cluster's proxies listen on its own nodes
        check_port(host, port)

    # The HTTP proxy drains for 30 s by default before it stops; the processes a local Ray starts inherit this.
    os.environ.setdefault("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", "1")
    if not address:  # before Ray starts: its controller reads the proxy choice from the environment it inherits
        os.environ.update(proxy_environment(settings.proxy))
    import ray
    from ray import serve

    # Serve's driver logger says INFO lines our own two lines already say, one of them alarming ("New
    # http_options/controller_options will not be applied": serve.run's own start after ours, which changes nothing).
    # For the whole process: a caller in the same process (examples/serve_ceiling.py) gets its warnings only.
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    kwargs = {} if address else {"_temp_dir": str(ray_temp_dir()), "include_dashboard": False}
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, **kwargs)
    if after_init:
        after_init()
    if settings.num_gpus and not ray.cluster_resources().get("GPU"):
        # Ray would wait forever for a GPU to place the replicas on
        log.warning("this Ray cluster has no GPU: replicas run without one (num_gpus 0)")
        settings = replace(settings, num_gpus=0.0)
    # a cluster we join may run other work: count what is free there
    free = ray.available_resources() if address else ray.cluster_resources()
    if settings.num_gpus > free.get("GPU", 0) + 1e-6:
        log.warning("no GPU of this Ray cluster is free for a replica (num_gpus %s): the replicas start when one "
                    "is", settings.num_gpus)
    settings = replica_count(settings, free.get("CPU", 1), free.get("GPU", 0))
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
    except Exception as e:  # HAProxy is Serve's newer ingress: if it cannot start, the Python proxy serves
        bind = next((line.strip() for line in str(e).splitlines() if any(f in line for f in BIND_FAILURES)), None)
        if not address and bind:
            stop()
            raise EdgekitError(f"cannot listen on {host}:{port}: {bind[:200]}") from None
        if address or os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
            raise
        lines = str(e).splitlines() or [repr(e)]
        reason = next((line for line in lines if "ALERT" in line), lines[-1])
        log.warning("Serve's HAProxy did not start (%s); Serve's Python proxy answers instead", reason.strip()[:300])
        stop()
        return start(package, replace(settings, proxy="python"), host, port, address, after_init, app)
    serve.run(app(settings) if app else application(package, settings), name="edgekit", route_prefix="/",
              blocking=False)
    return settings


def stop(address: str | None = None) -> None:
    """Tear down what `start` made: on a cluster we joined, our application only (others may serve there too);
    a local Ray with Serve and every process it started, and HAProxy's files of this run."""
    import os
    import shutil

    import ray
    from ray import serve

    if not ray.is_initialized():  # start failed before Ray was up: serve.shutdown would start a Ray of its own
        return
    node = ray.get_runtime_context().get_node_id()
    try:
        # the notice may reach the driver's listener thread after serve.shutdown returns: filter until Ray is down
        with _without_controller_exit_notice():
            try:
                if address:
                    serve.delete("edgekit")
                else:
                    serve.shutdown()
            finally:
                ray.shutdown()
    finally:
        state = os.environ.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE")
        if not address and state:  # Serve leaves its per-node folder (config, state) behind
            shutil.rmtree(Path(state) / node, ignore_errors=True)


@contextmanager
def _without_controller_exit_notice():
    """Leave out the one line Ray prints on every clean `serve.shutdown`: "(raylet) Task
    ServeController.graceful_shutdown failed ... killed by `ray.kill`". Serve's controller ends itself before that
    call returns, and the driver's error listener (ray._private.worker.listen_error_messages) prints the retry
    notice; the shutdown itself went as planned. Other error lines pass. Not re-entrant: one stop() at a time
    (edgekit serve's signal handlers only set an event)."""
    import ray._private.worker as worker

    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None:  # another Ray: nothing to filter
        yield
        return

    def filtered(data, *args, **kwargs):
        if not any("ServeController.graceful_shutdown" in line and "ray.kill" in line for line in data.get("lines", [])):
            printer(data, *args, **kwargs)

    worker.print_to_stdstream = filtered
    try:
        yield
    finally:
        worker.print_to_stdstream = printer


def describe(settings: ServeSettings, address: str | None = None) -> str:
    """One line for the terminal: replicas, batching, providers, threads and proxy."""
    d = asdict(settings)
    scale = (f"{d['min_replicas']}-{d['max_replicas']} replicas (autoscaling)" if d["autoscale"]
             else f"{d['replicas']} replica{'s' * (d['replicas'] > 1)}" if d["replicas"]
             else f"a replica per {d['threads']} CPU{'s' * (d['threads'] > 1)} of the cluster")
    proxy = "the cluster's" if address else d["proxy"]
    return (f"{scale}, max batch {d['max_batch']}, wait {d['batch_wait_ms']} ms, providers "
            f"{'/'.join(d['providers'])}, {d['threads']} thread(s) per replica, {proxy} proxy")
