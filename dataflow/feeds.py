"""What a fed value must be: the placeholder's dtype (a same-kind cast that changes no number) and shape.

``Session.run`` and a plan from ``Session.make_callable`` check every feed here
before any kernel runs, so a wrong feed is refused by name, never computed on:
a (3, 1) column fed for a (3,) vector would broadcast in the first elementwise
op and give numbers of the wrong shape without a word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .dtypes import DTYPES, as_strings, is_string, outside_int_range, past_float_range
from .errors import DTypeError, GraphError, ShapeError
from .graph import Tensor
from .shapes import compatible, fmt


def feed_name(t: Tensor) -> str:
    """``feed for 'x:0' (cell 3, line 2)``: the fed tensor, and where its node was made when that is known."""
    where = t.node.where()
    return f"feed for {t.name!r}" + (f" ({where})" if where != "unknown location" else "")


def convert_feed(t: Tensor, value: Any) -> np.ndarray:
    what = feed_name(t)
    if is_string(t.dtype):
        array = as_strings(value, what)
    else:
        array = np.asarray(value)
    if not is_string(t.dtype) and array.dtype != t.dtype:
        if array.dtype.kind in "US":
            raise DTypeError(f"{what} holds text ({array.dtype}), expected {t.dtype}")
        if not np.can_cast(array.dtype, t.dtype, "same_kind"):
            raise DTypeError(f"{what} has dtype {array.dtype}, expected {t.dtype}")
        outside = None if np.can_cast(array.dtype, t.dtype) else outside_int_range(array, t.dtype)
        # int64 labels into an int32 placeholder: a cast would wrap them round; float32 data past 65504 into a
        # float16 placeholder: it would be inf.
        outside = outside or past_float_range(array, t.dtype)
        if outside is not None:
            raise DTypeError(f"{what} ({array.dtype}) does not fit {t.dtype}: {outside}")
        array = array.astype(t.dtype)
    if not compatible(t.shape, array.shape):
        raise ShapeError(f"{what} has shape {fmt(array.shape)}, expected {fmt(t.shape)}")
    return array


class FeedCheck:
    """Checks the values for ``feeds`` (in order) as ``Session.run`` does; made once per plan, called every step.

    A value whose dtype and shape are right is passed as it is (metadata only:
    about 0.2 us a feed); any other goes through ``convert_feed``, which casts
    it or refuses it in ``run``'s words.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 2), name="x")
    >>> check = FeedCheck([x])
    >>> [v.dtype for v in check([np.ones((3, 2))])]  # float64 data, cast as run() casts it
    [dtype('float32')]
    >>> check([np.ones((3, 1), np.float32)])
    Traceback (most recent call last):
    ...
    cellgraph.dataflow.errors.ShapeError: feed for 'x:0' (...) has shape (3, 1), expected (None, 2)
    """

    def __init__(self, feeds: Sequence[Tensor]) -> None:
        self.feeds = list(feeds)
        # Per feed: the NumPy dtype a value may have as it is (None: always converted, as text is checked element
        # by element), and the static shape, whole (compared as one tuple) or with unknown sizes.
        self._expected = [
            (None if is_string(t.dtype) else DTYPES[t.dtype], t.shape, None in t.shape) for t in self.feeds
        ]

    def __call__(self, values: Sequence[Any]) -> Sequence[Any]:
        if len(values) != len(self.feeds):
            names = ", ".join(repr(t.name) for t in self.feeds)
            raise GraphError(f"this plan takes {len(self.feeds)} feed(s) ({names or 'none'}), got {len(values)}")
        out: list[Any] | None = None
        for i, (value, (dtype, shape, partial)) in enumerate(zip(values, self._expected)):
            given = getattr(value, "shape", None)
            if (
                dtype is not None
                and getattr(value, "dtype", None) == dtype
                and (given == shape or (partial and given is not None and compatible(shape, given)))
            ):
                continue
            out = list(values) if out is None else out
            out[i] = convert_feed(self.feeds[i], value)
        return values if out is None else out
