"""Device profiles, kept as data: one TOML file per target (read by edgekit.engine.targets)."""
