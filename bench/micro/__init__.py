"""Micro-benchmarks: the codec and the frontends measured alone, on one machine, no network."""
