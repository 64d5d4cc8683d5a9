"""Benchmark tools: an emulated multi-host network (:mod:`hvd_gradq.bench.netemu`)."""
