"""The distributed side of cellgraph: the parameter service (and, next, Dask clusters and jobs)."""
