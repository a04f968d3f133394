"""The recurrent layers of ``cg.layers``: ``lstm`` and ``gru``, unrolled over a sequence's known length.

A sequence is (batch, time, features), batch first. Each layer makes a name
scope holding one set of variables that serves every step. The weights follow
Keras's layout (kernels are (inputs, outputs), gates in Keras's order), which
is PyTorch's with each matrix transposed and the gates reordered where Keras
orders them otherwise (GRU); the tests copy PyTorch's weights in that way and
compare outputs.

**Variable lengths.** ``lengths=`` (int, (batch,): PyTorch's
``pack_padded_sequence``) or ``mask=`` (bool, (batch, time): Keras's mask,
true at the steps that count) or both (a step counts where both say so). At a
step that does not count, the state is carried unchanged and the output is
zeros, as PyTorch's ``pad_packed_sequence`` pads and Keras's
``zero_output_for_mask=True`` (its cuDNN path and ``Bidirectional``) gives;
Keras's default RNN repeats the previous output there instead, which is
``h`` as returned at the last step that counted. The returned state is
therefore each sequence's state after its last valid step (after
``lengths[b]`` steps), the initial state where none counts. The input at a
step that does not count is replaced by zeros before it is multiplied, so
padding of any value (NaN too) reaches neither the outputs nor any
gradient, and its own gradient is exactly zero. All of it is built from the
existing ops (``Less``, ``Where``, ``Gather``), so it exports to ONNX as it
runs.

**Directions.** ``direction="reverse"`` runs the steps from the last to the
first; ``"bidirectional"`` runs both, each with its own variables (the
reverse direction's in the ``backward`` scope inside the layer's), and
concatenates them on the last axis, forward first: the outputs are (batch,
time, 2 units), the states (batch, 2 units), and an ``initial_state`` is laid
out the same way. With lengths, the reverse direction starts at each
sequence's last valid step (its padding is skipped, not run through), as
PyTorch's packed sequences and ONNX's ``sequence_lens`` do; its state is the
one after step 0. A mask's masked steps are skipped by both directions, as
if taken out of the sequence. One ``step`` function per cell serves both
directions.

Under a mixed dtype policy (``cellgraph/precision.py``) the variables are
float32 and the gates and states are computed in the policy's half dtype, as
in ``torch.autocast``. Without a policy a half input is cast to float32.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import numpy as np

from cellgraph import init as initializers
from cellgraph.dataflow.errors import DTypeError, ShapeError
from cellgraph.dataflow.graph import Tensor, name_scope
from cellgraph.dataflow.ops import array, array_gather, array_more, array_slice, logic, math, math_unary, nn
from cellgraph.dataflow.ops.state import constant, variable
from cellgraph.dataflow.shapes import fmt
from cellgraph.precision import layer_dtypes, read, to_compute
from cellgraph.sequence_layers import _sequence_check

Initializer = Callable[..., object]
LENGTH_DTYPES = ("int32", "int64")
DIRECTIONS = ("forward", "reverse", "bidirectional")
State = tuple[Tensor, ...]
# One step of a cell: (the input's projection at step t, the state or None for zeros) -> the new state, h first.
Step = Callable[[Tensor, "State | None"], State]
# A cell for one direction: makes its variables in the current name scope; the input's projection and its step.
Cell = Callable[[Tensor], tuple[Tensor, Step]]


def lstm(
    x: Tensor,
    units: int,
    initial_state: tuple[Tensor, Tensor] | None = None,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    name: str = "lstm",
    direction: str = "forward",
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """A long short-term memory layer over (batch, time, features) ``x``, unrolled over its known ``time``.

    Returns ``(outputs, (h, c))``: the hidden state at every step (batch,
    time, ``units``) and the final hidden and cell states (batch, ``units``).
    One set of variables serves every step: ``kernel`` (features, 4 units),
    ``recurrent_kernel`` (units, 4 units) and ``bias`` (4 units; the forget
    gate's starts at 1, as Keras's ``unit_forget_bias``), gates in the order
    input, forget, cell, output (PyTorch's order; its ``weight_ih_l0`` is
    ``kernel.T`` and ``bias_ih_l0 + bias_hh_l0`` is ``bias``). Both kernels
    start ``glorot_uniform`` (Keras starts ``recurrent_kernel`` orthogonal,
    PyTorch draws every weight and bias from U(+-1/sqrt(units)): copy the
    weights in to start where either does)::

        i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of (x_t @ kernel + h @ recurrent_kernel + bias)
        c = f * c + i * g;  h = o * tanh(c)

    The state starts at zeros unless ``initial_state`` gives ``(h0, c0)``.
    ``lengths`` (int32 or int64, (batch,), each in [0, time]) or ``mask``
    (bool, (batch, time)) make the sequences of the batch variable-length:
    a step that does not count keeps the state and outputs zeros, and
    ``(h, c)`` is each sequence's state after its last valid step, as
    PyTorch's ``pack_padded_sequence`` gives (module docstring). A length
    outside [0, time] fails when the graph runs, naming the layer's
    ``lengths_in_0_to_<time>`` node. ``direction`` is ``"forward"``,
    ``"reverse"`` or ``"bidirectional"`` (outputs, states and initial state
    2 ``units`` wide, forward then reverse; the reverse direction's variables
    are ``<name>/backward/...``, PyTorch's ``..._l0_reverse``).

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 8, 8), name="rows")
    ...     outputs, (h, c) = cg.layers.lstm(x, 16)
    >>> outputs.shape, h.shape
    ((None, 8, 16), (None, 16))

    Two sequences of 3 and 1 valid steps, padded to 4:

    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 4, 2), name="padded")
    ...     n = cg.placeholder((None,), "int32", name="lengths")
    ...     outputs, (h, c) = cg.layers.lstm(x, 3, lengths=n)
    ...     both, (hb, cb) = cg.layers.lstm(x, 3, lengths=n, direction="bidirectional", name="bi")
    >>> out, last = cg.Session(g).run([outputs, h], {x: np.ones((2, 4, 2), np.float32), n: [3, 1]})
    >>> bool(np.all(out[0, 3:] == 0) and np.all(out[1, 1:] == 0)), np.array_equal(last, out[[0, 1], [2, 0]])
    (True, True)
    >>> both.shape, hb.shape, g.node("bi/backward/kernel").output(0).shape
    ((None, 4, 6), (None, 6), (2, 12))
    """
    features, kept, compute = _checked_input(x, units, "lstm", name)
    width = units * _check_direction(direction, "lstm", name)
    if initial_state is not None:
        for what, state in zip(("h0", "c0"), initial_state):
            _check_state(state, what, x, width, compute, "lstm", name)
    _check_lengths_and_mask(x, lengths, mask, "lstm", name)
    u = units

    def cell(x: Tensor) -> tuple[Tensor, Step]:
        kernel = variable(initializers.glorot_uniform, shape=(features, 4 * u), dtype=kept, name="kernel")
        recurrent = variable(initializers.glorot_uniform, shape=(u, 4 * u), dtype=kept, name="recurrent_kernel")
        bias = variable(_forget_bias(u), shape=(4 * u,), dtype=kept, name="bias")
        kernel, recurrent, bias = (read(v, compute) for v in (kernel, recurrent, bias))
        # The input's share of every step in one product over the whole sequence, not one per step.
        projected = nn.bias_add(math.matmul(x, kernel), bias)  # (batch, time, 4 units)

        def step(z: Tensor, state: State | None) -> State:
            if state is not None:
                z = z + math.matmul(state[0], recurrent)
            i, f = nn.sigmoid(_gate(z, 0, u)), nn.sigmoid(_gate(z, 1, u))
            g, o = nn.tanh(_gate(z, 2, u)), nn.sigmoid(_gate(z, 3, u))
            # A zero starting state has no forget term: c = i * g at the first step.
            c = i * g if state is None else f * state[1] + i * g
            return o * nn.tanh(c), c

        return projected, step

    with x.graph.atomic(), name_scope(name):
        x = to_compute(x, compute, name=f"input_{compute}")
        valid = valid_steps(x, lengths, mask)
        x = zero_padding(x, valid)
        start = None
        if initial_state is not None:
            start = tuple(to_compute(s, compute, name=f"{w}_{compute}") for w, s in zip(("h0", "c0"), initial_state))
        sequence, (h, c) = unroll_directions(x, cell, direction, start, valid, units)
        return sequence, (h, c)


def gru(
    x: Tensor,
    units: int,
    initial_state: Tensor | None = None,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    name: str = "gru",
    direction: str = "forward",
) -> tuple[Tensor, Tensor]:
    """A gated recurrent unit layer over (batch, time, features) ``x``, unrolled over its known ``time``.

    Returns ``(outputs, h)``: the hidden state at every step (batch, time,
    ``units``) and the final one (batch, ``units``). PyTorch's equations
    (and cuDNN's, and Keras's ``reset_after=True``): the reset gate scales
    the recurrent product *after* the matmul, its bias included::

        xz, xr, xn = x_t @ kernel + bias[0]          (update, reset, candidate: Keras's order)
        hz, hr, hn = h @ recurrent_kernel + bias[1]
        z = sigmoid(xz + hz);  r = sigmoid(xr + hr);  n = tanh(xn + r * hn)
        h = (1 - z) * n + z * h

    Variables, laid out as Keras's ``GRU(reset_after=True)``: ``kernel``
    (features, 3 units), ``recurrent_kernel`` (units, 3 units) and ``bias``
    (2, 3 units: the input's bias, then the recurrent one), zeros at first;
    both kernels start ``glorot_uniform`` (Keras starts ``recurrent_kernel``
    orthogonal, PyTorch draws every weight and bias from U(+-1/sqrt(units)):
    copy the weights in to start where either does).
    PyTorch orders the gates reset, update, candidate: its ``weight_ih_l0``
    is ``kernel.T`` with the first two blocks of rows swapped, and so on for
    ``weight_hh_l0``, ``bias_ih_l0`` and ``bias_hh_l0``. The state starts at
    zeros unless ``initial_state`` gives ``h0`` (batch, ``units``).
    ``lengths``, ``mask`` and ``direction`` work as ``lstm``'s: a step that
    does not count keeps the state and outputs zeros; ``h`` is each
    sequence's state after its last valid step.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 5, 4), name="x")
    ...     steps = cg.placeholder((None, 5), "bool", name="steps")
    ...     outputs, h = cg.layers.gru(x, 6, mask=steps)
    >>> outputs.shape, h.shape, g.node("gru/bias").output(0).shape
    ((None, 5, 6), (None, 6), (2, 18))
    >>> keep = np.array([[True, True, False, False, False]])
    >>> out, last = cg.Session(g).run([outputs, h], {x: np.ones((1, 5, 4), np.float32), steps: keep})
    >>> bool(np.all(out[0, 2:] == 0)), np.array_equal(last[0], out[0, 1])
    (True, True)
    """
    features, kept, compute = _checked_input(x, units, "gru", name)
    width = units * _check_direction(direction, "gru", name)
    if initial_state is not None:
        _check_state(initial_state, "h0", x, width, compute, "gru", name)
    _check_lengths_and_mask(x, lengths, mask, "gru", name)
    u = units

    def cell(x: Tensor) -> tuple[Tensor, Step]:
        kernel = variable(initializers.glorot_uniform, shape=(features, 3 * u), dtype=kept, name="kernel")
        recurrent = variable(initializers.glorot_uniform, shape=(u, 3 * u), dtype=kept, name="recurrent_kernel")
        bias = variable(initializers.zeros, shape=(2, 3 * u), dtype=kept, name="bias")
        kernel, recurrent, bias = (read(v, compute) for v in (kernel, recurrent, bias))
        input_bias = array_slice.getitem(bias, 0, name="input_bias")
        recurrent_bias = array_slice.getitem(bias, 1, name="recurrent_bias")
        projected = nn.bias_add(math.matmul(x, kernel), input_bias)  # (batch, time, 3 units)

        def step(xp: Tensor, state: State | None) -> State:
            # A zero state's recurrent product is the recurrent bias alone (broadcast over the batch).
            hp = recurrent_bias if state is None else nn.bias_add(math.matmul(state[0], recurrent), recurrent_bias)
            z = nn.sigmoid(_gate(xp, 0, u) + _gate(hp, 0, u))
            r = nn.sigmoid(_gate(xp, 1, u) + _gate(hp, 1, u))
            n = nn.tanh(_gate(xp, 2, u) + r * _gate(hp, 2, u))
            return ((1.0 - z) * n if state is None else (1.0 - z) * n + z * state[0],)

        return projected, step

    with x.graph.atomic(), name_scope(name):
        x = to_compute(x, compute, name=f"input_{compute}")
        valid = valid_steps(x, lengths, mask)
        x = zero_padding(x, valid)
        start = None if initial_state is None else (to_compute(initial_state, compute, name=f"h0_{compute}"),)
        sequence, (h,) = unroll_directions(x, cell, direction, start, valid, units)
        return sequence, h


# ------------------------------------------------------------------ checks
def _checked_input(x: Tensor, units: int, layer: str, name: str) -> tuple[int, str, str]:
    """A recurrent layer's input and units checked; its features, and its variables' and compute dtypes."""
    time, features = _sequence_check(x, "input", layer, name)
    _check_units(units, layer, name)
    if time < 1:
        raise ShapeError(f"{layer} layer {name!r} needs at least one time step, got {fmt(x.shape)}")
    kept, compute = layer_dtypes(x, layer, name)
    return features, kept, compute


def _check_units(units: int, layer: str, name: str) -> None:
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        raise ShapeError(f"{layer} layer {name!r}: units must be a positive int, got {units!r}")


def _check_direction(direction: object, layer: str, name: str) -> int:
    """The number of directions ``direction`` runs (1 or 2)."""
    if direction not in DIRECTIONS:
        raise ValueError(
            f"{layer} layer {name!r}: direction must be one of {', '.join(map(repr, DIRECTIONS))}, got {direction!r}"
        )
    return 2 if direction == "bidirectional" else 1


def _check_state(state: Tensor, what: str, x: Tensor, units: int, compute: str, layer: str, name: str) -> None:
    # The input's dtype, or the compute dtype where the policy casts the input to it.
    if len(state.shape) != 2 or state.shape[1] != units or state.dtype not in (x.dtype, compute):
        raise ShapeError(
            f"{layer} layer {name!r}: initial state {what} must be {x.dtype} (batch, {units}), "
            f"got {state.dtype} {fmt(state.shape)}"
        )


def _shown(value: object) -> str:
    return f"{value.dtype} {fmt(value.shape)}" if isinstance(value, Tensor) else repr(value)


def _fits(dims: tuple[int | None, ...], want: tuple[int | None, ...]) -> bool:
    return len(dims) == len(want) and all(d is None or w is None or d == w for d, w in zip(dims, want))


def _check_lengths_and_mask(x: Tensor, lengths: object, mask: object, layer: str, name: str) -> None:
    batch, time = x.shape[0], x.shape[1]
    assert time is not None  # _sequence_check knows it
    if lengths is not None:
        if not isinstance(lengths, Tensor) or lengths.dtype not in LENGTH_DTYPES:
            raise DTypeError(
                f"{layer} layer {name!r}: lengths must be an int32 or int64 tensor of shape (batch,), "
                f"got {_shown(lengths)}"
            )
        if not _fits(lengths.shape, (batch,)):
            raise ShapeError(
                f"{layer} layer {name!r}: lengths must have shape (batch,) = {fmt((batch,))} for input "
                f"{fmt(x.shape)}, got {fmt(lengths.shape)}"
            )
        if lengths.node.op == "Const":  # known now: refused now (a fed one is checked when the graph runs)
            value = np.asarray(lengths.node.attrs["value"])
            if value.size and (value.min() < 0 or value.max() > time):
                raise ShapeError(
                    f"{layer} layer {name!r}: lengths {value.tolist()} must each be in [0, {time}] "
                    f"for input {fmt(x.shape)}"
                )
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != "bool":
            raise DTypeError(
                f"{layer} layer {name!r}: mask must be a bool tensor of shape (batch, time), got {_shown(mask)}"
            )
        if not _fits(mask.shape, (batch, time)):
            raise ShapeError(
                f"{layer} layer {name!r}: mask must have shape (batch, time) = {fmt((batch, time))} for input "
                f"{fmt(x.shape)}, got {fmt(mask.shape)}"
            )


# ------------------------------------------------------------------ the unrolled steps
def valid_steps(x: Tensor, lengths: Tensor | None, mask: Tensor | None) -> Tensor | None:
    """Bool (batch, time): the steps that count, from ``lengths`` and ``mask`` (None when neither is given)."""
    time = x.shape[1]
    assert time is not None
    if mask is not None:
        mask = one_per_sequence(mask, math.reduce_sum(x, axis=2), "mask_needs_one_row_per_sequence")
    valid = mask
    if lengths is not None:
        lengths = one_per_sequence(lengths, sequence_rows(x), "lengths_need_one_per_sequence")
        # The identity on [0, time], as two lookups whose Gather fails, naming its node, on a fed length outside
        # it. Two, because ONNX's Gather takes an index in [-n, -1] from the end: in ONNX Runtime the first
        # refuses only a length above time, and the second (from the table's end) only a negative one.
        table = np.arange(time + 1, dtype=lengths.dtype)
        from_start = array_gather.gather(constant(table), lengths, name=f"lengths_in_0_to_{time}")
        from_end = array_gather.gather(constant(table[::-1].copy()), time - lengths, name=f"lengths_in_0_to_{time}_")
        lengths = math.maximum(from_start, from_end, name="lengths")
        steps = constant(np.arange(time, dtype=lengths.dtype), name="steps")
        below = math.less(steps, array.expand_dims(lengths, 1), name="within_lengths")  # (batch, time)
        valid = below if valid is None else logic.logical_and(valid, below, name="valid_steps")
    return valid


def sequence_rows(x: Tensor) -> Tensor:
    """(batch,): one value per sequence of ``x`` (batch, time, ...), whose run-time shape is x's batch."""
    return math.reduce_sum(array_slice.getitem(x, (slice(None), 0)), axis=list(range(1, len(x.shape) - 1)))


def one_per_sequence(t: Tensor, like: Tensor, name: str) -> Tensor:
    """``t`` (batch, ...) checked, when the graph runs, to have ``like``'s shape: one row per sequence.

    Lengths, a mask or an initial state fed for a batch of 1 were broadcast over every sequence of the batch
    without a word (PyTorch refuses them); now the run fails, naming the node ``name``. A ``t`` of a known batch
    other than 1 is returned as it is: it fixes the batch of an input whose batch is unknown (a constant initial
    state of 4 rows makes the outputs (4, ...)).
    """
    if t.shape[0] is not None and t.shape[0] != 1 and None not in t.shape[1:]:
        return t
    return array.reshape_like(t, like, name=name, same_shape=True)


def zero_padding(x: Tensor, valid: Tensor | None) -> Tensor:
    """``x`` with zeros at the steps that do not count: padding (NaN too) never reaches a product or gradient."""
    if valid is None:
        return x
    return math_unary.where(array.expand_dims(valid, 2), x, 0.0, name="input_without_padding")


def _gate(z: Tensor, k: int, units: int) -> Tensor:
    """Gate ``k``'s block of ``units`` columns of a (..., gates * units) ``z`` (a bias alone is (gates * units,))."""
    return array_slice.getitem(z, (Ellipsis, slice(k * units, (k + 1) * units)))


def unroll(
    projected: Tensor, step: Step, state: State | None, valid: Tensor | None, reverse: bool = False
) -> tuple[Tensor, State]:
    """Run ``step`` at every step of ``projected`` (batch, time, ...); the outputs (h at every step) and the state.

    Where ``valid`` says a step does not count, the state is carried (zeros before the first real one) and the
    output is zeros; both go through ``Where``, so no gradient reaches what that step computed. ``reverse`` runs
    from the last step to the first (the outputs stay in time order): the padding after a sequence's length is
    then carried over before its first real step, so each sequence starts at its last valid step.
    """
    time = projected.shape[1]
    assert time is not None
    if state is not None:
        rows = array.expand_dims(sequence_rows(projected), 1)  # (batch, 1)
        state = tuple(
            one_per_sequence(s, array_more.tile(rows, (1, s.shape[1])), f"initial_state{i}_needs_one_row_per_sequence")
            for i, s in enumerate(state)
        )
    outputs: dict[int, Tensor] = {}
    for t in range(time - 1, -1, -1) if reverse else range(time):
        new = step(array_slice.getitem(projected, (slice(None), t), name=f"step_{t}"), state)
        out = new[0]
        if valid is not None:
            keep = array_slice.getitem(valid, (slice(None), slice(t, t + 1)), name=f"valid_{t}")  # (batch, 1)
            out = math_unary.where(keep, out, 0.0, name=f"output_{t}")
            old: tuple[Tensor | float, ...] = state if state is not None else (0.0,) * len(new)
            new = tuple(math_unary.where(keep, n, o, name=f"state{i}_{t}") for i, (n, o) in enumerate(zip(new, old)))
        state = new
        outputs[t] = array.expand_dims(out, 1)
    assert state is not None  # time >= 1: the layers check it
    ordered = [outputs[t] for t in range(time)]
    sequence = array.concat(ordered, axis=1, name="outputs") if len(ordered) > 1 else ordered[0]
    return sequence, state


def unroll_directions(
    x: Tensor, cell: Cell, direction: str, state: State | None, valid: Tensor | None, units: int
) -> tuple[Tensor, State]:
    """``cell`` over ``x`` in ``direction``: one pass, or a forward and a reverse one (its variables in a
    ``backward`` scope) joined on the last axis, forward first. A bidirectional ``state`` is 2 ``units`` wide."""
    reverses = [False, True] if direction == "bidirectional" else [direction == "reverse"]
    if len(reverses) == 1:
        projected, step = cell(x)
        return unroll(projected, step, state, valid, reverses[0])
    halves: list[State | None] = [None, None]
    if state is not None:
        halves = [tuple(_gate(s, k, units) for s in state) for k in (0, 1)]
    passes = []
    for reverse, half in zip(reverses, halves):
        with name_scope("backward") if reverse else nullcontext():
            projected, step = cell(x)
            passes.append(unroll(projected, step, half, valid, reverse))
    (forward, forward_state), (backward, backward_state) = passes
    sequence = array.concat([forward, backward], axis=2, name="bidirectional_outputs")
    states = tuple(
        array.concat([f, b], axis=1, name=f"bidirectional_state{i}")
        for i, (f, b) in enumerate(zip(forward_state, backward_state))
    )
    return sequence, states


def _forget_bias(units: int) -> Initializer:
    def init(shape: tuple[int, ...], dtype: np.dtype, seed: int) -> np.ndarray:
        bias = np.zeros(shape, dtype=dtype)
        bias[units : 2 * units] = 1.0
        return bias

    return init


__all__ = ["DIRECTIONS", "gru", "lstm", "unroll", "unroll_directions", "valid_steps", "zero_padding"]
