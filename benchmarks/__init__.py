"""Benchmarks and the device runs (docs/benchmarks.md); a package so the rig run's parts import as one."""
