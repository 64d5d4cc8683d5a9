"""Benchmarks and studies of hvd_gradq: tools, not library (see bench/README.md). Run from the repository
root; the scripts import each other as ``bench.<group>.<module>``."""
