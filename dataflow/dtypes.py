"""The dtypes a tensor can have, and their canonical names.

float16 and bfloat16 are *storage* dtypes: a tensor holds them, but no kernel
computes in them. Numba knows neither (bfloat16 is an ``ml_dtypes`` extension
type), so every kernel reads half inputs as float32 and rounds its outputs back
to the half dtype (round to nearest even, as NumPy and ml_dtypes cast), which
is also what makes reductions and matmul/conv accumulate in float32
(``dataflow/kernels/storage.py`` does it, once, for every op).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .errors import DTypeError

# Canonical name -> NumPy dtype. The names are what GraphDefs and messages use.
DTYPES: dict[str, np.dtype[Any]] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
    # Text: an object array of Python str (TensorFlow's tf.string, ONNX's STRING). Numba computes on no
    # strings, so the few ops that take them (moves, comparisons: ``OpDef.strings``) run their NumPy reference.
    "string": np.dtype(object),
}
# Stored in half precision, computed in float32.
HALF_FLOATS = frozenset({"float16", "bfloat16"})
FLOATS = frozenset({"float32", "float64"}) | HALF_FLOATS
INTS = frozenset({"int8", "uint8", "int16", "int32", "int64"})
STRING = "string"
# The dtype a kernel computes in for each storage-only dtype.
COMPUTE_DTYPE = {"float16": "float32", "bfloat16": "float32"}

DTypeLike = str | type | np.dtype[Any]


def as_dtype(value: DTypeLike) -> str:
    """Return the canonical dtype name for ``value`` ("float32", np.float32, ml_dtypes.bfloat16, ...)."""
    if value is None:
        raise DTypeError(f"a dtype is required; cellgraph knows {', '.join(DTYPES)}")
    if (isinstance(value, str) and value == STRING) or value is str or value is np.str_:
        return STRING
    try:
        numpy_dtype = np.dtype(value)
    except TypeError:
        name = str(value)
    else:
        # NumPy's fixed-width text ('<U7') and object arrays are text here; bytes ('S5') are not: decode them.
        name = STRING if numpy_dtype.kind in "OU" else numpy_dtype.name
    if name not in DTYPES:
        raise DTypeError(f"unsupported dtype {name!r}; cellgraph knows {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    """Whether ``dtype`` is a floating dtype (half floats included): differentiable, and what float ops take."""
    return dtype in FLOATS


def is_string(dtype: str) -> bool:
    """Whether ``dtype`` is cellgraph's text dtype ("string")."""
    return dtype == STRING


def as_strings(value: Any, what: str) -> np.ndarray:
    """``value`` (str, a list of them, a '<U' or object array) as a string tensor's value: an object array
    of Python str. Anything else in it is a DTypeError naming ``what`` and the element: a bytes or a number
    would compare unequal to every str without a word.

    >>> as_strings(["cat", "dog"], "feed for 'x'")
    array(['cat', 'dog'], dtype=object)
    """
    array = np.asarray(value)
    if array.dtype.kind == "U":
        return array.astype(object)
    if array.dtype.kind == "S":
        raise DTypeError(f"{what}: a string tensor holds str, got bytes ({array.dtype}); decode them first")
    if array.dtype.kind != "O":
        raise DTypeError(f"{what}: a string tensor holds str, got a {array.dtype} array")
    for index, element in np.ndenumerate(array):
        if not isinstance(element, str):
            raise DTypeError(
                f"{what}: a string tensor holds str, but element {list(index)} is {type(element).__name__} "
                f"{element!r}"
                + (
                    " (decode bytes first)"
                    if isinstance(element, bytes)
                    else " (an object array is read as text: convert numbers first, e.g. np.asarray(value, float))"
                )
            )
    return array


def is_half(dtype: str) -> bool:
    """Whether ``dtype`` is a storage-only half float (float16, bfloat16)."""
    return dtype in HALF_FLOATS


def kind(dtype: str) -> str:
    """NumPy's kind letter of ``dtype``, with bfloat16 (an extension type, kind 'V') counted as 'f'."""
    return "f" if dtype in FLOATS else DTYPES[dtype].kind


def past_float_range(array: np.ndarray, dtype: str) -> str | None:
    """Why the numbers of ``array`` do not fit float dtype ``dtype`` ("it holds 100000, past float16's largest
    finite value 65504"), or None when they fit or ``dtype`` is not a float: a cast would make a finite number
    inf, with only NumPy's RuntimeWarning to say so. Rounding (and underflow to 0) is a float's ordinary loss
    and passes, as do the infinities and NaNs ``array`` already holds.

    >>> past_float_range(np.array([1.0, -1e5]), "float16")
    "it holds -100000, past float16's largest finite value 65504"
    >>> past_float_range(np.array([np.inf, 65519.0]), "float16") is None
    True
    """
    if dtype not in FLOATS or not array.size:
        return None
    source = array.dtype.name
    if not (source in FLOATS or (source in DTYPES and DTYPES[source].kind in "iu")):
        return None
    if np.can_cast(array.dtype, DTYPES[dtype]):  # a widening cast never overflows
        return None
    values = np.asarray(array, np.float64)
    with np.errstate(over="ignore"):
        became_inf = np.isinf(values.astype(DTYPES[dtype])) & np.isfinite(values)
    if not became_inf.any():
        return None
    largest = float(ml_dtypes.finfo(DTYPES[dtype]).max)
    return f"it holds {values[became_inf][0]:g}, past {dtype}'s largest finite value {largest:g}"


def outside_int_range(array: np.ndarray, dtype: str) -> str | None:
    """Why the numbers of ``array`` do not fit integer dtype ``dtype`` ("it holds 2147483653, outside int32's
    range [-2147483648, 2147483647]"), or None when they fit or ``dtype`` is not an integer: a cast would wrap
    them round without a word.

    >>> outside_int_range(np.array([1, 2**31 + 5]), "int32")
    "it holds 2147483653, outside int32's range [-2147483648, 2147483647]"
    >>> outside_int_range(np.array([255]), "uint8") is None
    True
    """
    target = np.dtype(DTYPES[dtype])
    if target.kind not in "iu" or not array.size or array.dtype.kind not in "iuf":
        return None
    info = np.iinfo(target)
    low, high = array.min(), array.max()
    if low >= info.min and high <= info.max:
        return None
    return f"it holds {low if low < info.min else high}, outside {dtype}'s range [{info.min}, {info.max}]"
