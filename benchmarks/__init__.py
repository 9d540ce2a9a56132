"""The benchmark suite of every family: ``python -m benchmarks run|analyze|gpu|site`` (benchmarks/README.md)."""
