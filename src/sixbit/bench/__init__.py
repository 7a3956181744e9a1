"""Benchmark harness helpers: measured tables written into BENCHMARKS.md (never typed by hand)."""
