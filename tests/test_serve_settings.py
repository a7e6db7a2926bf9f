"""edgekit.serve's parts that need no running Ray: its settings and where Ray's session folder goes."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from edgekit import serve
from edgekit.errors import EdgekitError
from edgekit.serve import RAY_SOCKET_TAIL, ServeSettings, ray_temp_dir, settings_of


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))  # as short as a usual /home/NAME
    yield path
    shutil.rmtree(path)


def test_ray_session_folder_is_under_the_users_cache_unless_its_sockets_would_be_too_long(short_dir, tmp_path,
                                                                                         monkeypatch):
    got = ray_temp_dir(short_dir)
    assert got == short_dir / ".cache" / "edgekit" / "ray" and got.is_dir()
    monkeypatch.setattr(serve, "RAY_TMP", short_dir / "tmp")
    long_home = tmp_path / ("h" * 60)  # Ray's socket paths would pass 107 bytes under it
    got = ray_temp_dir(long_home)
    assert got == short_dir / "tmp" / f"edgekit-ray-{os.getuid()}" and got.is_dir() and not long_home.exists()
    assert len(str(got)) + RAY_SOCKET_TAIL <= 107 and got.stat().st_mode & 0o077 == 0  # the user's own
    got.chmod(0o777)  # a folder others may write in: Ray's sockets do not go there
    with pytest.raises(EdgekitError, match="not a folder of your own"):
        ray_temp_dir(long_home)
    monkeypatch.setattr(serve, "RAY_TMP", tmp_path)  # too long itself: one clear error, not Ray's
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
