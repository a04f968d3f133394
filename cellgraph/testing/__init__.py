"""Support for cellgraph's own tests and benchmarks: real JupyterLab and Chromium, started and stopped by them."""
