"""Measured claims: each bench_<area>.py runs as `python -m benchmarks.bench_<area>` and prints a table."""
