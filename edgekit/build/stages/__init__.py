"""One module per stage; each has `run(ctx) -> StageResult`. Importing this package registers them in order."""

from edgekit.build.stages import (  # noqa: F401  (registration)
    distill,
    export,
    fuse,
    package,
    prune,
    quantize,
    teacher,
    trim_vocab,
)
