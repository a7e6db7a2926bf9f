"""One module per stage, found through edgekit.engine.registry (each has `run(ctx) -> StageResult`); helpers
several stages share are in common.py."""
