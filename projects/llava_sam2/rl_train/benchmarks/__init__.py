"""Benchmarks (``sa2va-rl bench --help``): speed and memory are measured here and recorded in docs/benchmarks.md."""
