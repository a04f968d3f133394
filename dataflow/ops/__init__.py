"""The op families. Importing this package registers every op."""

from __future__ import annotations

from . import array, conv, math, nn, state, training

FAMILIES = (state, math, nn, conv, array, training)
