"""``cg.nn``: the neural-network ops under TensorFlow's ``tf.nn`` names.

The same functions as at the top level (``cg.conv2d`` is ``cg.nn.conv2d``), for
code written against ``tf.nn``; ``depthwise_conv2d`` and ``max_pool_with_argmax``
live here as they do there.

>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None, 4, 4, 3), name="x")
...     values, argmax = cg.nn.max_pool_with_argmax(x, 2, 2)
>>> values.shape, argmax.dtype
((None, 2, 2, 3), 'int64')
"""

from __future__ import annotations

from cellgraph.dataflow.ops.array_more import depth_to_space, space_to_depth
from cellgraph.dataflow.ops.conv import avg_pool, conv2d, max_pool
from cellgraph.dataflow.ops.conv_more import conv1d, conv2d_transpose, depthwise_conv2d, max_pool_with_argmax

__all__ = [
    "avg_pool",
    "conv1d",
    "conv2d",
    "conv2d_transpose",
    "depth_to_space",
    "depthwise_conv2d",
    "max_pool",
    "max_pool_with_argmax",
    "space_to_depth",
]


def __dir__() -> list[str]:
    """What ``cg.nn.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
