"""Kernels by device: ``cpu`` (Numba njit) now, ``cuda`` with the devices issue."""
