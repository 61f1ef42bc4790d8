"""Benchmarks run by ``headrace bench``: headrace against the peers a user would pick instead,
measured in the same run and printed as ratios (one JSON line per implementation)."""
