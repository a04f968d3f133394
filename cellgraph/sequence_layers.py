"""The sequence layers of ``cg.layers``: ``embedding`` and ``multi_head_attention`` (``lstm`` and ``gru`` are in
``cellgraph/recurrent.py``).

Each makes a name scope holding its variables, as the layers of
``cellgraph/layers.py`` do. A sequence is (batch, time, features), batch first.
The weights follow Keras's layout (kernels are (inputs, outputs)), which is
PyTorch's with each matrix transposed: the tests copy PyTorch's weights in that
way and compare outputs.

Under a mixed dtype policy (``cellgraph/precision.py``) the variables are
float32 and each layer computes in the policy's half dtype, as Keras's do;
attention's softmax is taken in float32 (its scores widened, masked there,
and the weights rounded back), as in ``torch.autocast``. Without a policy a
half input is cast to float32.
"""

from __future__ import annotations

import math as pymath
from collections.abc import Callable

from cellgraph import init as initializers
from cellgraph.dataflow.dtypes import is_half
from cellgraph.dataflow.errors import DTypeError, ShapeError
from cellgraph.dataflow.graph import Tensor, name_scope
from cellgraph.dataflow.ops import array, array_gather, math, math_unary, nn
from cellgraph.dataflow.ops.math import cast
from cellgraph.dataflow.ops.state import variable
from cellgraph.dataflow.shapes import fmt
from cellgraph.layers import dense  # layers.py imports this module last, once dense is defined
from cellgraph.precision import current_policy, layer_input, to_compute

Initializer = Callable[..., object]
INT_DTYPES = ("int32", "int64", "int16", "int8", "uint8")
# A masked-out attention score: exp(score - max) underflows to exactly 0 in float32 and float64.
MASKED_SCORE = -1e9


def embedding(
    ids: Tensor,
    vocab_size: int,
    dim: int,
    embeddings_init: Initializer = initializers.glorot_uniform,
    name: str = "embedding",
) -> Tensor:
    """The rows of a trained (``vocab_size``, ``dim``) table at integer ``ids``: shape ``ids.shape + (dim,)``.

    An id outside [0, ``vocab_size``) fails when the graph runs, naming the gather node.
    The table starts ``embeddings_init``, by default ``glorot_uniform`` over
    (vocab_size, dim): Keras's ``Embedding`` starts uniform in +-0.05 and
    PyTorch's N(0, 1), so give ``embeddings_init`` (``cg.init.Normal(0, 1)``
    for PyTorch's) to start where either does. No ``padding_idx`` or
    ``max_norm``: every row trains, none is renormalised.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     ids = cg.placeholder((None, 5), "int32", name="ids")
    ...     vectors = cg.layers.embedding(ids, vocab_size=100, dim=16)
    >>> vectors.shape
    (None, 5, 16)
    >>> cg.Session(g).run(vectors, {ids: np.zeros((2, 5), np.int32)}).shape
    (2, 5, 16)
    """
    ids = layer_input(ids, "embedding", name, "ids")
    if ids.dtype not in INT_DTYPES:
        raise DTypeError(f"embedding layer {name!r} needs integer ids, got {ids.dtype} {fmt(ids.shape)}")
    for what, value in (("vocab_size", vocab_size), ("dim", dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ShapeError(f"embedding layer {name!r}: {what} must be a positive int, got {value!r}")
    current = current_policy()
    with ids.graph.atomic(), name_scope(name):
        table = variable(embeddings_init, shape=(vocab_size, dim), dtype=current.variable_dtype, name="embeddings")
        # Under a mixed policy the rows gathered are cast, not the whole table (Keras's Embedding does so).
        rows = array_gather.gather(table, ids, name="lookup")
        return to_compute(rows, current.compute_dtype, name=f"lookup_{current.compute_dtype}")


def _sequence_check(x: Tensor, what: str, layer: str, name: str) -> tuple[int, int]:
    """(time, features) of a (batch, time, features) float ``x`` with both known."""
    layer_input(x, layer, name, what)
    if len(x.shape) != 3 or x.shape[1] is None or x.shape[2] is None:
        raise ShapeError(
            f"{layer} layer {name!r} needs {'an' if what[0] in 'aeiou' else 'a'} {what} of shape (batch, time, features) with time and features known, "
            f"got {fmt(x.shape)}"
        )
    if x.dtype not in ("float32", "float64", "float16", "bfloat16"):
        raise DTypeError(f"{layer} layer {name!r} needs a float {what}, got {x.dtype}")
    return x.shape[1], x.shape[2]


def multi_head_attention(
    query: Tensor,
    value: Tensor | None = None,
    key: Tensor | None = None,
    num_heads: int = 1,
    key_dim: int | None = None,
    mask: Tensor | None = None,
    name: str = "multi_head_attention",
) -> Tensor:
    """Scaled dot-product attention of ``query`` over ``key``/``value`` in ``num_heads`` heads.

    ``query`` is (batch, t_q, d), ``value`` and ``key`` (batch, t_k, d_k)
    (both default to ``query``: self-attention; ``key`` defaults to
    ``value``). Each head projects them to ``key_dim`` features (default
    ``d / num_heads``), takes ``softmax(q k^T / sqrt(key_dim))`` over the keys
    and averages the values by it; the heads are concatenated and projected
    back to ``d``. Makes ``query``, ``key``, ``value`` and ``output``
    projections (``kernel`` and ``bias`` each). ``mask``, a bool tensor, says
    which keys each query may attend to (true: may): (batch, t_q, t_k) as
    Keras's ``attention_mask`` is, the same for every head; (t_q, t_k) for
    every sequence of the batch (its t_q known: a (None, t_k) mask is refused, as it is most likely a
    padding mask of each sequence's keys, which is given as (batch, 1, t_k)); (t_k,) for every query; or,
    of rank 4, any shape that broadcasts to (batch, num_heads, t_q, t_k). PyTorch's ``attn_mask`` and
    ``key_padding_mask`` are its negation. A query whose every key is masked attends to all of them equally
    (uniform weights, as Keras gives); PyTorch gives NaN there.
    Returns (batch, t_q, d).

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 8, 16), name="x")
    ...     y = cg.layers.multi_head_attention(x, num_heads=4)
    >>> y.shape
    (None, 8, 16)
    """
    value = query if value is None else value
    key = value if key is None else key
    t_q, d = _sequence_check(query, "query", "multi_head_attention", name)
    t_k, _ = _sequence_check(value, "value", "multi_head_attention", name)
    t_key, _ = _sequence_check(key, "key", "multi_head_attention", name)
    if t_key != t_k:
        raise ShapeError(
            f"multi_head_attention layer {name!r}: key and value need the same time steps, "
            f"got key {fmt(key.shape)} and value {fmt(value.shape)}"
        )
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ShapeError(f"multi_head_attention layer {name!r}: num_heads must be a positive int, got {num_heads!r}")
    if key_dim is None:
        if d % num_heads:
            raise ShapeError(
                f"multi_head_attention layer {name!r}: the query's {d} features do not split into {num_heads} heads; "
                "give key_dim"
            )
        key_dim = d // num_heads
    if mask is not None:
        _check_mask(mask, (num_heads, t_q, t_k), name)
    with query.graph.atomic(), name_scope(name):
        if mask is not None and len(mask.shape) == 3:
            # Keras's (batch, t_q, t_k): one mask per sequence, for every head. Broadcast from the right as it
            # stands, its first axis would meet the heads' (mask[b] applied to head b).
            mask = array.expand_dims(mask, 1, name="mask_per_head")
        width = num_heads * key_dim
        # The projections are dense layers: x @ kernel + bias over the last axis.
        q = _heads(dense(query, width, name="query"), t_q, num_heads, key_dim)
        k = _heads(dense(key, width, name="key"), t_k, num_heads, key_dim)
        v = _heads(dense(value, width, name="value"), t_k, num_heads, key_dim)
        scores = math.matmul(q, k, transpose_b=True) * (1.0 / pymath.sqrt(key_dim))  # (batch, heads, t_q, t_k)
        compute = scores.dtype
        # Half scores are masked and normalized in float32, as Keras's softmax under a mixed policy: -1e9 is
        # -inf in float16, and a row with every key masked would be NaN instead of uniform.
        if is_half(compute):
            scores = cast(scores, "float32", name="scores_float32")
        if mask is not None:
            scores = math_unary.where(mask, scores, MASKED_SCORE, name="masked")
        weights = to_compute(nn.softmax(scores, axis=-1, name="weights"), compute, name=f"weights_{compute}")
        attended = math.matmul(weights, v)  # (batch, heads, t_q, key_dim)
        merged = array.reshape(array.transpose(attended, (0, 2, 1, 3)), (-1, t_q, width))
        return dense(merged, d, name="output")


def _heads(x: Tensor, time: int, heads: int, key_dim: int) -> Tensor:
    """(batch, time, heads * key_dim) -> (batch, heads, time, key_dim)."""
    return array.transpose(array.reshape(x, (-1, time, heads, key_dim)), (0, 2, 1, 3))


def _check_mask(mask: Tensor, scores: tuple[int, int, int], name: str) -> None:
    if not isinstance(mask, Tensor) or mask.dtype != "bool":
        shown = f"{mask.dtype} {fmt(mask.shape)}" if isinstance(mask, Tensor) else repr(mask)
        raise DTypeError(f"multi_head_attention layer {name!r}: mask must be a bool tensor, got {shown}")
    heads, t_q, t_k = scores
    dims = mask.shape
    # Rank 3 is Keras's (batch, t_q, t_k); rank 2 (t_q, t_k); rank 4 broadcasts to the scores' own shape.
    full = {1: (t_k,), 2: (t_q, t_k), 3: (None, t_q, t_k), 4: (None, heads, t_q, t_k)}.get(len(dims))
    if full is None:
        raise ShapeError(
            f"multi_head_attention layer {name!r}: mask of shape {fmt(dims)} has rank {len(dims)}; give "
            f"(batch, t_q, t_k) = {fmt((None, t_q, t_k))}, (t_q, t_k), (t_k,), or a rank-4 mask that broadcasts to "
            f"(batch, num_heads, t_q, t_k) = {fmt((None, heads, t_q, t_k))}"
        )
    if len(dims) == 2 and dims[0] is None:
        # A (None, t_k) mask is most likely each sequence's padding, (batch, t_k): read as (t_q, t_k), row b
        # masked query b of every sequence, without a word when the batch had t_q sequences.
        raise ShapeError(
            f"multi_head_attention layer {name!r}: mask of shape {fmt(dims)} would be read as (t_q, t_k) = "
            f"{fmt(full)}, one mask for every sequence, but its first axis is unknown; give t_q = {t_q} there, "
            f"or give a mask of each sequence's keys (batch, t_k) as (batch, 1, t_k) = {fmt((None, 1, t_k))} "
            "(true where a key may be attended: PyTorch's key_padding_mask negated)"
        )
    if not all(m is None or m == 1 or s is None or m == s for m, s in zip(dims, full)):
        names = {1: "(t_k,)", 2: "(t_q, t_k)", 3: "(batch, t_q, t_k)", 4: "(batch, num_heads, t_q, t_k)"}[len(dims)]
        raise ShapeError(
            f"multi_head_attention layer {name!r}: mask of shape {fmt(dims)} does not fit the scores' "
            f"{names} = {fmt(full)}"
        )
