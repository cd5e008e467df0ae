"""Throughput benchmarks for dopool on disk; run them with ``python -m benchmarks``."""
