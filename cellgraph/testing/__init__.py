"""Support for cellgraph's own tests and benchmarks: real JupyterLab and Chromium, started and stopped by them;
network namespaces; a recorded job; generated graphs of any size."""
