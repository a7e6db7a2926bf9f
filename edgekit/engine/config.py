"""Build settings, resolved once and validated before any work.

Order, later wins: each pass's dataclass defaults -> the target profile (`devices/<name>.toml`, which may say
`extends = "android"`) -> `--config build.toml` (the same tables) -> `--set table.key=value` -> the common
flags. Every table is a dataclass whose `__post_init__` checks its values; a bad value fails in seconds with
one line naming `table.key`.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.converters.distill import DistillConfig
from edgekit.converters.fuse import FuseConfig
from edgekit.converters.optimize_onnx import ServerConfig
from edgekit.converters.quantize_executorch import QuantizeConfig
from edgekit.converters.transitions import TransitionConfig
from edgekit.engine.limits import LimitsSettings
from edgekit.engine.registry import ORDER, STAGES, AllBut
from edgekit.engine.search import SearchSettings
from edgekit.engine.targets import Target, load_target, merge_tables
from edgekit.errors import EdgekitError
from edgekit.modeling.training import TrainConfig
from edgekit.runtime.cascade import DEFAULT_TIMEOUT_S
from edgekit.serve.settings import ServeSettings


@dataclass
class CompressConfig:
    """Vocabulary and parameter budgets of the phone targets, and how far a gate may back off."""

    vocab_budget: int | None = None  # most pieces kept (specials and byte pieces included); 0 or None: all
    vocab_corpus: str | None = None  # extra text, one utterance per line, whose pieces the vocabulary keeps
    base_words: int = 0  # the base vocabulary's most frequent words kept beside the task's pieces (after them)
    param_share: float = 0.25  # non-embedding parameters pruning keeps, share of the teacher's
    total_share: float = 1.0  # all parameters (vocabulary included), share of the teacher's
    # Back-off caps: a gate miss may grow the student up to these shares, never past them (None: no growth).
    max_param_share: float | None = None
    max_total_share: float | None = None
    prune_layers: int = 0  # whole layers removed by pruning
    prune_samples: int = 512  # task utterances the pruning importance is measured on
    embedding_rank: int | None = None  # factorise the word embedding to this rank (SVD); None: keep (V, H)
    max_retries: int = 2  # gate misses backed off before the build settles for its best try

    def __post_init__(self):
        if self.vocab_budget == 0:
            self.vocab_budget = None
        for name in ("param_share", "total_share", "max_param_share", "max_total_share"):
            v = getattr(self, name)
            if v is not None and not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {v}")
        if self.max_param_share is not None and self.max_param_share < self.param_share:
            raise ValueError(f"max_param_share must be >= param_share ({self.param_share}), got {self.max_param_share}")
        if self.max_total_share is not None and self.max_total_share < self.total_share:
            raise ValueError(f"max_total_share must be >= total_share ({self.total_share}), got {self.max_total_share}")
        from edgekit.text.vocab import N_FIXED

        if self.vocab_budget is not None and self.vocab_budget <= N_FIXED:
            raise ValueError(f"vocab_budget must exceed the {N_FIXED} special and byte pieces, got {self.vocab_budget}")
        for name, low in (("prune_layers", 0), ("max_retries", 0), ("prune_samples", 1), ("base_words", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.embedding_rank is not None and self.embedding_rank < 1:
            raise ValueError(f"embedding_rank must be >= 1, got {self.embedding_rank}")
        if self.vocab_corpus is not None and not Path(self.vocab_corpus).is_file():
            raise ValueError(f"vocab_corpus: file not found: {self.vocab_corpus}")


@dataclass
class BudgetConfig:
    """Dev accuracy an optimisation stage may lose against the teacher (points on a 0-100 scale); the fuse stage's
    graph, against the unfused graph it was made from."""

    intent_drop_pts: float = 0.5
    slot_f1_drop_pts: float = 1.0

    def __post_init__(self):
        for name in ("intent_drop_pts", "slot_f1_drop_pts"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number of points, got {getattr(self, name)}")


@dataclass
class DecodingSettings:
    """Out-of-scope policy. Without out-of-scope data, `oos_far` is the share of held-out in-scope (dev)
    utterances the rejection threshold (on the energy score) may refuse; 0 (the default) turns rejection off:
    dev is small, so its tail is noisy (on SNIPS 0.5% of dev refused 1.3% of test). With out-of-scope data, the
    threshold catches the most out-of-scope dev utterances while in-scope dev accuracy loses at most
    `oos_max_drop_pts` points (1.5: on CLINC150 test 93.3 in-scope / 84.1 recall; 2.0 gave 93.0 / 86.2 and
    1.0 gave 93.9 / 80.4). compare_argmax: also export the model without the decoding graph, so the report
    compares constrained against plain argmax decoding (slot F1, invalid BIO) and gives the decoding graph's
    latency cost; false skips that second export of each runtime (about a third of the export stage's time)."""

    oos_far: float = 0.0
    oos_max_drop_pts: float = 1.5
    compare_argmax: bool = True
    # Learned tag-transition scores in the Viterbi (converters/transitions.py), fitted on train over the FP32
    # model's slot scores: SNIPS packages +0.34 slot F1 (ExecuTorch), +0.48 (ONNX Runtime) over three seeds
    # (docs/experiments.md, 2026-12-06)
    transitions: bool = True
    transition_epochs: int = 5
    transition_l2: float = 1e-4

    def __post_init__(self):
        if not 0 <= self.oos_far < 1:
            raise ValueError(f"oos_far must be in [0, 1), got {self.oos_far}")
        if not 0 <= self.oos_max_drop_pts <= 100:
            raise ValueError(f"oos_max_drop_pts must be in [0, 100] points, got {self.oos_max_drop_pts}")
        TransitionConfig(self.transition_epochs, self.transition_l2)  # one place checks them


@dataclass
class PackageSettings:
    max_len: int | None = None  # fixed sequence length; None: p99 of train+dev piece counts, rounded up to 8
    buckets: list[int] | None = None  # shorter ExecuTorch lengths; None: the profile's bucket_percentiles
    bench_utterances: int = 200  # test utterances the package's latency is measured on; 0: not measured

    def __post_init__(self):
        if self.max_len is not None and not 8 <= self.max_len <= 512:
            raise ValueError(f"max_len must be in 8..512, got {self.max_len}")
        if self.buckets and min(self.buckets) < 3:
            raise ValueError(f"buckets must hold lengths >= 3, got {min(self.buckets)}")
        if self.bench_utterances < 0:
            raise ValueError(f"bench_utterances must be >= 0 (0: latency not measured), got {self.bench_utterances}")


@dataclass
class NetworkSettings:
    """Modeled round trips from the device to a server, for `edgekit compare` (device profiles state them, with
    sources; nothing measures a phone's network here). rtt_ms: median round-trip time by network name.
    p99_rtt_factor: the p99 column assumes the round trip's p99 is this multiple of its median."""

    rtt_ms: dict[str, float] = field(default_factory=dict)
    p99_rtt_factor: float = 3.0

    def __post_init__(self):
        for k, v in self.rtt_ms.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"rtt_ms.{k} must be a number of milliseconds >= 0, got {v!r}")
        if not (math.isfinite(self.p99_rtt_factor) and self.p99_rtt_factor >= 1):
            raise ValueError(f"p99_rtt_factor must be >= 1, got {self.p99_rtt_factor}")


@dataclass
class CascadeSettings:
    """Device first, server when unsure. timeout_s: how long the runtime waits for the server before it keeps
    the device answer (copied into the manifest). max_gap_pts: `edgekit compare` picks the threshold with the
    fewest escalations whose dev accuracy is within this many points of the server alone."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    max_gap_pts: float = 0.1

    def __post_init__(self):
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")
        if not (math.isfinite(self.max_gap_pts) and self.max_gap_pts >= 0):
            raise ValueError(f"max_gap_pts must be >= 0 points, got {self.max_gap_pts}")


TABLES: dict[str, type] = {"teacher": TrainConfig, "compress": CompressConfig, "distill": DistillConfig,
                           "quantize": QuantizeConfig, "decoding": DecodingSettings, "budget": BudgetConfig,
                           "package": PackageSettings, "server": ServerConfig, "fuse": FuseConfig,
                           "serve": ServeSettings, "network": NetworkSettings, "cascade": CascadeSettings,
                           "limits": LimitsSettings, "search": SearchSettings}
MOVED = {"server.skip_layer_norm": "fuse.skip_layer_norm"}  # settings that moved table: where they went
@dataclass
class Settings:
    teacher: TrainConfig
    compress: CompressConfig
    distill: DistillConfig
    quantize: QuantizeConfig
    decoding: DecodingSettings
    budget: BudgetConfig
    package: PackageSettings
    server: ServerConfig
    fuse: FuseConfig
    serve: ServeSettings
    network: NetworkSettings
    cascade: CascadeSettings
    limits: LimitsSettings
    search: SearchSettings

    def to_dict(self) -> dict:
        return {name: dataclasses.asdict(getattr(self, name)) for name in TABLES}

    def read_by(self, stage: str) -> dict:
        """The settings `stage` reads (its spec in edgekit.engine.registry), for its cache key."""
        out = {}
        for table, keys in STAGES[stage].reads.items():
            values = dataclasses.asdict(getattr(self, table))
            if isinstance(keys, AllBut):
                keys = [k for k in values if k not in keys.names]
            out[table] = values if keys == "*" else {k: values[k] for k in keys}
        return out


@dataclass
class BuildConfig:
    """What `edgekit build` was asked: paths, the profile, overrides. `settings` holds the tables as
    dicts ({"distill": {"alpha": 0.5}}), applied after the profile and `config` (a build.toml), before `sets`."""

    data: str
    out: str
    task: str = "intent"
    target: str = "android"
    format: str | None = None
    base_model: str | None = None
    config: str | None = None
    settings: dict = field(default_factory=dict)
    sets: list[str] = field(default_factory=list)  # "table.key=value", value in TOML syntax
    seed: int = 0
    stages: list[str] | None = None  # default: the profile's
    intents: list[str] | None = None  # build-time intent whitelist baked into the graph (None: all)
    cache: str | None = None  # default: $EDGEKIT_CACHE, else ~/.cache/edgekit
    strict: bool = False  # a missed accuracy budget fails with no package instead of shipping the best try
    strict_data: bool = False  # any data check finding (edgekit.data.check) refuses the build before training
    label_issues: bool = False  # run the label-issue search after the data check: OUT/label_issues.jsonl
    train_threads: int | None = None  # None: torch's own count (the physical cores, or $OMP_NUM_THREADS)


def parse_set(item: str) -> tuple[str, str, object]:
    """'distill.alpha=0.5' -> ('distill', 'alpha', 0.5). The value is TOML; a bare word is a string."""
    key, sep, raw = item.partition("=")
    table, dot, name = key.strip().partition(".")
    if not sep or not dot or not name:
        raise EdgekitError(f"--set {item!r}: expected table.key=value, e.g. distill.alpha=0.5")
    if raw.strip().lower() == "none":  # TOML has no null: `none` resets a setting to its automatic choice
        return table, name.strip(), None
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return table, name.strip(), value


def _check_type(where: str, hint, value):
    """Refuse a value of the wrong type with one line (TOML gives int for 2, float for 2.0: both are floats)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = typing.get_args(hint) if union else (hint,)
    ok = []
    for a in args:
        origin = typing.get_origin(a) or a
        ok.append(origin)
        if value is None and a is type(None):
            return value
        if origin is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if origin is int and isinstance(value, bool):
            continue
        if origin is list and isinstance(value, list):
            (item,) = typing.get_args(a) or (object,)
            bad = [v for v in value if not isinstance(v, item) or isinstance(v, bool) and item is not bool]
            if not bad:
                return value
            continue
        if isinstance(origin, type) and isinstance(value, origin):
            return value
    names = " or ".join("none" if t is type(None) else str(t) if t is list else getattr(t, "__name__", str(t))
                        for t in (typing.get_args(hint) if union else (hint,)))
    raise EdgekitError(f"{where}: expected {names}, got {value!r}")


def _known(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(TABLES[name]) if f.init}


def _check_layer(origin: str, layer: dict) -> None:
    """Every table and key of one source exists (the message names the source)."""
    for name, values in layer.items():
        if name not in TABLES or not isinstance(values, dict):
            raise EdgekitError(f"{origin}: unknown table {name!r}; tables: {', '.join(TABLES)}")
        for key in values:
            if f"{name}.{key}" in MOVED:
                raise EdgekitError(f"{origin}: {name}.{key} is now {MOVED[f'{name}.{key}']}")
            if key not in _known(name):
                raise EdgekitError(f"{origin}: unknown setting {name}.{key}; {name} has: "
                                   f"{', '.join(sorted(_known(name)))}")


def _table(name: str, values: dict):
    cls, known = TABLES[name], _known(name)
    hints = typing.get_type_hints(cls)
    clean = {key: _check_type(f"{name}.{key}", hints[key], value) for key, value in values.items()}
    try:
        return cls(**clean)
    except (ValueError, TypeError) as e:  # messages start with the field's name: "alpha must be in [0, 1], got 2"
        first, _, rest = str(e).partition(" ")
        raise EdgekitError(f"{name}.{first}: {rest}" if first in known else f"{name}: {e}") from None


def _recipe(base_model: str | None) -> dict:
    """The [teacher] settings base_models.toml gives the named base model (a folder: none)."""
    from edgekit.modeling.base_models import BASE_MODELS, DEFAULT

    return dict(BASE_MODELS.get(base_model or DEFAULT, {}).get("teacher", {}))


def _config_file(path: Path) -> dict:
    """--config: a build.toml's tables, or one line naming the file."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EdgekitError(f"{path}: --config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EdgekitError(f"{path}: cannot read the --config file ({getattr(e, 'strerror', None) or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise EdgekitError(f"{path}: {e}") from None


def layers_of(cfg: BuildConfig, target: Target) -> list[tuple[str, dict]]:
    """Every source of settings as (origin, tables), the lowest first: the base model's teacher recipe, the
    profile, --config, `settings`, --set. A later source's keys replace an earlier one's."""
    sets: dict = {}
    for item in cfg.sets:
        table, key, value = parse_set(item)
        sets.setdefault(table, {})[key] = value
    return [("base_models.toml", {"teacher": _recipe(cfg.base_model or target.base_model)}),
            (target.source, target.tables),
            *([(cfg.config, _config_file(Path(cfg.config)))] if cfg.config else []),
            ("settings", cfg.settings), ("--set", sets)]


def _stages(cfg: BuildConfig, target: Target) -> list[str]:
    stages = list(cfg.stages or target.stages)
    unknown = [s for s in stages if s not in ORDER]
    if unknown:
        raise EdgekitError(f"unknown stage {unknown[0]!r}; stages: {', '.join(ORDER)}")
    if stages[0] != "teacher" or stages[-1] != "package" or "export" not in stages[-3:]:
        raise EdgekitError("stages must start with teacher and end with export, (fuse,) package")
    if [ORDER.index(x) for x in stages] != sorted({ORDER.index(x) for x in stages}):
        raise EdgekitError(f"stages run in this order, each once: {', '.join(ORDER)}")
    return stages


def _check_together(cfg: BuildConfig, target: Target, settings: Settings, layers: list) -> None:
    """What no single table can check: settings against the profile and each other."""
    if settings.server.batch and "executorch" in target.runtimes:
        batch_from = next((o for o, layer in reversed(layers) if "batch" in layer.get("server", {})), target.source)
        raise EdgekitError(f"{batch_from}: server.batch needs a profile with runtimes = [\"onnx\"] ({target.source} "
                           "has executorch, whose packages take one utterance per call)")
    if cfg.intents is not None and not cfg.intents:
        raise EdgekitError("--intents is empty")
    if settings.limits.max_latency is not None and not settings.package.bench_utterances:
        raise EdgekitError("limits.max_latency (--max-latency) is held against the p50 the package stage measures; "
                           "package.bench_utterances = 0 measures none")


def resolve(cfg: BuildConfig) -> tuple[Target, Settings]:
    """The profile and every setting, merged in order and validated: fails before any work. One pass: every source
    read (layers_of), each checked by name, merged lowest first; then the common flags, the tables' own checks,
    the stages, and what the settings must satisfy together."""
    if cfg.task != "intent":
        raise EdgekitError(f"unknown --task {cfg.task!r}; supported: intent")
    target = load_target(cfg.target)
    layers = layers_of(cfg, target)
    tables: dict[str, dict] = {name: {} for name in TABLES}
    for origin, layer in layers:
        _check_layer(origin, layer)
        for name, values in layer.items():
            tables[name] = merge_tables(tables[name], values)
    # The common flags come last: --seed seeds every pass, unless distill.seed is set (seeds of the student alone,
    # on one teacher: only distillation and what follows it run again). A quick teacher (steps_limit) makes a quick
    # student.
    tables["teacher"]["seed"] = cfg.seed
    if tables["distill"].get("seed") is None:  # unset, or `none`: --seed
        tables["distill"]["seed"] = cfg.seed
    tables["distill"].setdefault("steps_limit", tables["teacher"].get("steps_limit"))
    settings = Settings(**{name: _table(name, tables[name]) for name in TABLES})
    stages = _stages(cfg, target)
    _check_together(cfg, target, settings, layers)
    return dataclasses.replace(target, stages=stages), settings
