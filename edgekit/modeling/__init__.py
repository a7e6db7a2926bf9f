"""Modeling: the encoder and its heads (model), training (training), CPU performance switches (perf). Where torch
enters edgekit/ (outside converters/)."""
