"""Benchmarks: ``python -m benchmarks.train_step`` (training throughput), ``python -m benchmarks.eval_throughput``."""
