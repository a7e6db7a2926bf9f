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
