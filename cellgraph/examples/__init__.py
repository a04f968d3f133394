"""Example data sets and models used by ``cellgraph demo``, the benchmarks and the tests."""
