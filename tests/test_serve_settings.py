"""edgekit.serve's parts that need no running Ray: its settings and where Ray's session folder goes."""

import shutil
import tempfile
from pathlib import Path

import pytest

from edgekit.serve import RAY_SOCKET_TAIL, ServeSettings, ray_temp_dir, settings_of


def test_ray_session_folder_is_under_the_users_cache_unless_its_sockets_would_be_too_long(tmp_path):
    home = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))  # as short as a usual /home/NAME
    try:
        short = ray_temp_dir(home)
        assert short == home / ".cache" / "edgekit" / "ray" and short.is_dir()
    finally:
        shutil.rmtree(home)
    long_home = tmp_path / ("h" * 60)  # Ray's socket paths would pass 107 bytes under it
    got = ray_temp_dir(long_home)
    assert got.parent == Path(tempfile.gettempdir()) and got.is_dir() and not long_home.exists()
    assert len(str(got)) + RAY_SOCKET_TAIL <= 107
    assert got.stat().st_mode & 0o077 == 0  # the user's own


def test_settings_refuse_what_would_cap_batches_and_max_batch_lifts_the_request_limit():
    with pytest.raises(ValueError, match="max_ongoing_requests must be >= max_batch"):
        ServeSettings(max_batch=64, max_ongoing_requests=5)
    with pytest.raises(ValueError, match="providers must be some of"):
        ServeSettings(providers=["tpu"])
    manifest = {"serve": {"max_batch": 32, "max_ongoing_requests": 64, "threads": 2, "unknown_key": 1}}
    s = settings_of(manifest, max_batch=128)
    assert s.max_batch == 128 and s.max_ongoing_requests == 8 * 128 and s.threads == 2
    assert settings_of(manifest, max_batch=None).max_batch == 32
