"""`edgekit serve OUT`: a package behind HTTP on Ray Serve, with dynamic batching.

One deployment: each replica (edgekit.serve.replica) takes HTTP straight from Serve's proxy (HAProxy by default:
edgekit.serve.ray_env), validates the request (a bad one gets a 4xx and never reaches the model), and answers through
`edgekit.runtime` in batches that `@serve.batch` gathers from concurrent requests (size and wait window from the
package's `serve` table, which the profile wrote: edgekit.serve.settings);
`/predict_batch` is fanned out as single items, so they batch with everyone else's. A second deployment in front
(an ingress) cost half the throughput on a 2-core machine: every hop is a Ray call. The package travels to the
replicas as bytes through Ray, so the same command serves on a multi-node cluster (`--address`); each replica
checks every file's sha256 before loading.

Here: the package's files and settings, and Ray started and stopped; what a replica does with a request is in
edgekit.serve.calls. Ray is imported lazily (edgekit.serve.replica only when serving): `pip install -e '.[serve]'`.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from edgekit.serve.settings import ServeSettings, replica_count

log = logging.getLogger("edgekit")


# what Serve's proxies (HAProxy, the Python one) say when the address was taken between check_port and their bind
BIND_FAILURES = ("Address already in use", "Failed to bind to address")


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
    """The Ray Serve application for `package`: one deployment whose replicas (edgekit.serve.replica) take HTTP from
    Serve's proxy."""
    from ray import serve

    from edgekit.serve.replica import Replica

    s = settings
    if not s.replicas and not s.autoscale:
        raise ValueError("replicas = 0 must be counted first (replica_count)")
    files = package_files(package)
    # On shutdown, in-flight requests get a few seconds to finish (Ray's default is 20 s, then it kills them).
    deployment = serve.deployment(Replica, name="edgekit", max_ongoing_requests=s.max_ongoing_requests,
                                  graceful_shutdown_timeout_s=5.0, graceful_shutdown_wait_loop_s=0.5,
                                  logging_config={"enable_access_log": s.access_log})
    scaling = ({"autoscaling_config": {"min_replicas": s.min_replicas, "max_replicas": s.max_replicas,
                                       "target_ongoing_requests": s.target_ongoing_requests}}
               if s.autoscale else {"num_replicas": s.replicas})
    return deployment.options(**scaling, ray_actor_options={"num_cpus": s.threads, "num_gpus": s.num_gpus}).bind(
        files, settings)


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
    from edgekit.serve.ray_env import check_port, proxy_environment, ray_temp_dir

    if not address:  # a cluster's proxies listen on its own nodes
        check_port(host, port)

    # The HTTP proxy drains for 30 s by default before it stops; the processes a local Ray starts inherit this.
    os.environ.setdefault("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", "1")
    # Serve gives a new proxy actor 5 s to say it is ready, three times over, then kills it. On 2 cores already busy
    # (a build, a test beside) its worker took longer to start: HAProxy's manager was killed before it ran, and the
    # Python proxy served at about half the throughput (docs/experiments.md, 2026-12-06). A proxy that fails fast
    # (an HAProxy that exits) still fails at once.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "20")
    if not address:  # before Ray starts: its controller reads the proxy choice from the environment it inherits
        os.environ.update(proxy_environment(settings.proxy))
        _begin_run()
    import ray
    from ray import serve

    # Serve's driver logger says INFO lines our own two lines already say, one of them alarming ("New
    # http_options/controller_options will not be applied": serve.run's own start after ours, which changes nothing).
    # For the whole process: a caller in the same process (examples/serve_ceiling.py) gets its warnings only.
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    kwargs = {} if address else {"_temp_dir": str(ray_temp_dir()), "include_dashboard": False}
    from edgekit.serve.watchdog import MARKER

    if not address:  # Ray's GCS, raylet and monitors start in ray.init: they take the run's marker, and pass it on
        os.environ[MARKER] = _RUN[0]  # to the actors and their HAProxy; nothing this process starts later gets it
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, **kwargs)
    finally:
        os.environ.pop(MARKER, None)
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

    from edgekit.serve import watchdog

    if not ray.is_initialized():  # start failed before Ray was up: serve.shutdown would start a Ray of its own
        _end_run()
        return
    node = ray.get_runtime_context().get_node_id()
    run = None if address or not _RUN else _RUN[0]
    known = watchdog.tree(run, os.getpid()) if run else set()  # before any of it ends and init adopts the rest
    try:
        # the notice may reach the driver's listener thread after serve.shutdown returns: filter until Ray is down
        with _without_controller_exit_notice():
            try:
                if address:
                    serve.delete("edgekit")
                elif not run or not watchdog.PROC.is_dir():  # nothing to stop it with if it hangs: wait for it
                    serve.shutdown()
                elif not _serve_stopped(GRACEFUL_S) or not _core_up(known):
                    # a signal to the whole process group reached Ray's raylet and GCS too (not its actors, each in a
                    # group of its own): Serve's controller waits 30 s for a raylet that is draining, and Ray's own
                    # shutdown below waits seconds on a GCS that is gone while its monitors and actors live on
                    _end_run(known, grace_s=0)  # now, before Ray's shutdown
            finally:
                ray.shutdown()
    finally:
        _end_run(known)
        state = os.environ.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE")
        if not address and state:  # Serve leaves its per-node folder (config, state) behind
            shutil.rmtree(Path(state) / node, ignore_errors=True)


RAY_CORE = ("gcs_server", "raylet")  # the run's processes without which Ray's shutdown only waits
# Serve's own shutdown, at most: in-flight requests get 5 s (graceful_shutdown_timeout_s), the proxies drain 1 s
GRACEFUL_S = 7.0


def _serve_stopped(timeout_s: float) -> bool:
    """Whether Serve's shutdown returned within timeout_s (one that failed, as it may with Ray's GCS gone, did not)."""
    from ray import serve

    try:
        if _within(serve.shutdown, timeout_s):
            return True
        log.info("Serve did not stop within %s s: stopping what is left of Ray", timeout_s)
    except Exception as e:  # noqa: BLE001 (logged; what is left is stopped next)
        log.info("Serve's shutdown failed (%s): stopping what is left of Ray", e)
    return False


def _core_up(known: set) -> bool:
    """Whether Ray's GCS and raylet of this run still run (`known`: the run's processes when the stop began; one
    already ended then is missing from it, and so is counted as gone)."""
    from edgekit.serve import watchdog

    up = set(RAY_CORE) <= watchdog.names(watchdog.alive(known))
    if not up:
        log.info("Ray's GCS or raylet is gone (a signal to the process group): stopping what is left of Ray")
    return up


def _within(fn, timeout_s: float) -> bool:
    """fn() in a thread of its own; whether it returned within timeout_s (its errors propagate)."""
    import threading

    done, failed = threading.Event(), []

    def call():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 (given to the caller's thread)
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=call, daemon=True, name="serve-shutdown").start()
    if done.wait(timeout_s) and failed:
        raise failed[0]
    return done.is_set()


_WATCHDOG: list = []  # the running watchdog of this process's local Ray (edgekit.serve.watchdog), if any
_RUN: list = []  # the run id of this process's local Ray, while it runs


def _begin_run() -> None:
    """A run id for the local Ray about to start (ray.init passes it to every process of the run) and the watchdog
    that stops them if this process ends without stop()."""
    import uuid

    from edgekit.serve import watchdog

    _RUN[:] = [uuid.uuid4().hex]
    proc = watchdog.watch(_RUN[0])
    if proc is not None:
        _WATCHDOG.append(proc)


def _end_run(known: set = frozenset(), grace_s: float = 3.0) -> None:
    """After Ray's shutdown, or before it when Ray's core is gone: stop whatever of the run is left (a replica in its
    graceful shutdown, an HAProxy being reloaded; `known`: the processes under this one when the stop began), each
    with `grace_s` between SIGTERM and SIGKILL, then let the watchdog go with the same grace period."""
    import os

    from edgekit.serve import watchdog

    run = _RUN.pop() if _RUN else None
    if run:
        left = watchdog.reap(run, known, grace_s)
        if left:
            log.info("stopped %d process(es) Ray left behind", len(left))
    while _WATCHDOG:
        proc = _WATCHDOG.pop()
        try:  # unbuffered: a watchdog already gone leaves nothing for close() to flush and fail on
            os.write(proc.stdin.fileno(), f"{grace_s}\n".encode())
        except OSError:
            pass
        proc.stdin.close()  # its lifeline: it reaps what it found (nothing, or Ray's agents) and exits
        proc.wait(30)


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
        lines = data.get("lines", [])
        if not any("ServeController.graceful_shutdown" in line and "ray.kill" in line for line in lines):
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
