"""The dtypes a tensor can have, and their canonical names."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DTypeError

# Canonical name -> NumPy dtype. The names are what GraphDefs and messages use.
DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
FLOATS = frozenset({"float32", "float64"})
INTS = frozenset({"int32", "int64"})

DTypeLike = str | type | np.dtype[Any]


def as_dtype(value: DTypeLike) -> str:
    """Return the canonical dtype name for ``value`` ("float32", np.float32, ...)."""
    if value is None:
        raise DTypeError(f"a dtype is required; cellgraph knows {', '.join(DTYPES)}")
    try:
        name = np.dtype(value).name
    except TypeError:
        name = str(value)
    if name not in DTYPES:
        raise DTypeError(f"unsupported dtype {name!r}; cellgraph knows {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOATS
