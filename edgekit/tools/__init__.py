"""Tools over built packages: bench, compare (device against server), the op profiler, doctor, and package
evaluation (`edgekit eval`)."""
