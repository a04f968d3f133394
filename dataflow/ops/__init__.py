"""The op families. Importing this package registers every op."""

from __future__ import annotations

from . import array, math, nn, state, training

FAMILIES = (state, math, nn, array, training)
