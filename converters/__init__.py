"""edgekit.converters: one file per pass or exporter. Passes change an nn.Module; exporters write artifacts."""
