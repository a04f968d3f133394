"""Import rows of ONNX's recurrent ops (RNN, GRU, LSTM): each unrolled over its time steps.

cellgraph has no recurrent op: its own LSTM layer is a loop of matmuls and
gates unrolled when the graph is built. An ONNX recurrent node is built the
same way, so its sequence length must be known then (its batch may stay
dynamic). Each direction (forward, reverse, or both) is a chain of steps
with ONNX's gate order and equations: LSTM's gates in i, o, f, c order with
optional peepholes, GRU's in z, r, h order with either place of the reset
gate (``linear_before_reset``), RNN's one gate. The outputs are ONNX's: Y
with every step's hidden state, Y_h (and LSTM's Y_c) with the last, in
either ``layout``.

``sequence_lens`` (known or fed) works as the layers' ``lengths=``
(``cellgraph/recurrent.py``'s ``unroll``, the one loop of both): past a row's
length Y is zeros and the state is kept, the reverse direction starts at the
row's last valid step, and Y_h/Y_c are each row's state there (zeros for a
zero length, as ONNX Runtime gives). What is refused, naming it: activations
other than the defaults (sigmoid and tanh), ``clip``, LSTM's
``input_forget``, a ``sequence_lens`` not integers of shape (batch_size,), and a known
one outside [0, seq_length]; a fed one of another size than the batch fails the run naming it.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper, numpy_helper
>>> import cellgraph as cg
>>> w = numpy_helper.from_array(np.full((1, 2, 3), 0.5, np.float32), "w")
>>> r = numpy_helper.from_array(np.zeros((1, 2, 2), np.float32), "r")
>>> node = helper.make_node("RNN", ["x", "w", "r"], ["", "h"], hidden_size=2)
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, "batch", 3])],
...     [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)], [w, r])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.ones((4, 1, 3), np.float32)).round(4)
array([[[0.9051, 0.9051]]], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor
from cellgraph.recurrent import State, Step, unroll, valid_steps, zero_padding

from .common import Build, Check, ImportRow, as_text
from .import_wrappers import in_float32

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _direction(n: NodeInfo) -> str:
    return n.text("direction")


def _directions(n: NodeInfo) -> list[str]:
    direction = _direction(n)
    return ["forward", "reverse"] if direction == "bidirectional" else [direction]


def _input(b: Builder, n: NodeInfo, i: int) -> Tensor | None:
    return b.tensor(n.inputs[i]) if i < len(n.inputs) and n.inputs[i] else None


def _row_of(t: Tensor, d: int) -> Tensor:
    """Direction ``d``'s slice of a per-direction tensor (W, R, B, initial states, peepholes)."""
    return cg.squeeze(cg.slice(t, [d] + [0] * (len(t.shape) - 1), [1] + [-1] * (len(t.shape) - 1)), [0])


def _recurrent(kind: str) -> Build:
    def build(b: Builder, n: NodeInfo) -> list[Tensor]:
        x, w, r, bias = _input(b, n, 0), _input(b, n, 1), _input(b, n, 2), _input(b, n, 3)
        assert x is not None and w is not None and r is not None
        lengths = _input(b, n, 4)
        h_start, c_start = _input(b, n, 5), _input(b, n, 6) if kind == "LSTM" else None
        peepholes = _input(b, n, 7) if kind == "LSTM" else None
        hidden, batchwise = int(n.attrs["hidden_size"]), bool(n.attrs["layout"])
        if not batchwise:  # (seq, batch, input) and states (num_directions, batch, hidden): ONNX's layout 0
            x = cg.transpose(x, (1, 0, 2))  # batch first, as the layers' steps take it
        if batchwise:  # states (batch, num_directions, hidden): ONNX's layout 1
            h_start = cg.transpose(h_start, (1, 0, 2)) if h_start is not None else None
            c_start = cg.transpose(c_start, (1, 0, 2)) if c_start is not None else None
        # sequence_lens as the layers' lengths=: past its length a row outputs zeros and keeps its state, and the
        # reverse direction starts at its last valid step (ONNX's semantics, and ONNX Runtime's).
        # A fed sequence_lens of another size than the batch fails the run in valid_steps, naming it.
        valid = valid_steps(x, lengths, None) if lengths is not None else None
        x = zero_padding(x, valid)
        ys, last_h, last_c = [], [], []
        for d, direction in enumerate(_directions(n)):
            w_t, r_t = cg.transpose(_row_of(w, d), (1, 0)), cg.transpose(_row_of(r, d), (1, 0))
            biases = cg.split(_row_of(bias, d), 2, axis=0) if bias is not None else None
            projected = cg.matmul(x, w_t)  # (batch, seq, gates x hidden): every step's input share at once
            if biases is not None:
                projected = projected + biases[0]
            zeros = cg.zeros_like(cg.slice(projected, [0, 0, 0], [-1, 1, hidden]))[:, 0]  # the batch as it runs
            h = _row_of(h_start, d) if h_start is not None else zeros
            c = _row_of(c_start, d) if c_start is not None else zeros
            p = cg.split(_row_of(peepholes, d), 3, axis=0) if peepholes is not None else None
            step = _step(kind, n, r_t, biases[1] if biases is not None else None, p)
            start = (h, c) if kind == "LSTM" else (h,)
            y, state = unroll(projected, step, start, valid, reverse=direction == "reverse")
            if lengths is not None:
                # ONNX Runtime's Y_h and Y_c of a zero-length row are zeros, its initial state given or not (the
                # spec is silent; the layers keep the initial state there, as a state carried over no step).
                counted = cg.expand_dims(cg.greater(lengths, cg.zeros_like(lengths)), 1)
                state = tuple(cg.where(counted, s, cg.zeros_like(s)) for s in state)
            ys.append(y)  # (batch, seq, hidden), in time order
            last_h.append(state[0])
            last_c.append(state[-1])
        y, y_h, y_c = cg.stack(ys, axis=0), cg.stack(last_h, axis=0), cg.stack(last_c, axis=0)
        if batchwise:  # Y (batch, seq, num_directions, hidden), the states (batch, num_directions, hidden)
            y, y_h, y_c = cg.transpose(y, (1, 2, 0, 3)), cg.transpose(y_h, (1, 0, 2)), cg.transpose(y_c, (1, 0, 2))
        else:  # Y (seq, num_directions, batch, hidden)
            y = cg.transpose(y, (2, 0, 1, 3))
        return [y, y_h, y_c] if kind == "LSTM" else [y, y_h]

    return build


def _step(kind: str, n: NodeInfo, r_t: Tensor, r_bias: Tensor | None, p: list[Tensor] | None) -> Step:
    """One direction's step of a ``kind`` node, from its recurrence weights (hidden, gates x hidden), recurrence
    bias and (LSTM) peepholes: the input's share of the step comes in, the new state (h, and LSTM's c) goes out."""
    # GRU's recurrence weights and biases by gate, split once for every step.
    r_gates = cg.split(r_t, 3, axis=1) if kind == "GRU" else []
    rb_gates = cg.split(r_bias, 3, axis=0) if kind == "GRU" and r_bias is not None else [None] * 3

    def step(from_x: Tensor, state: State | None) -> State:
        assert state is not None  # every direction starts from a tensor: zeros or the node's own
        if kind == "GRU":
            return (_gru_step(from_x, state[0], r_gates, rb_gates, n),)
        pre = from_x + cg.matmul(state[0], r_t)
        pre = pre if r_bias is None else pre + r_bias
        if kind == "RNN":
            return (cg.tanh(pre),)
        return _lstm_step(cg.split(pre, GATES[kind], axis=1), state[1], p)

    return step


def _lstm_step(pre: list[Tensor], c: Tensor, p: list[Tensor] | None) -> tuple[Tensor, Tensor]:
    """One LSTM step from the gates' pre-activations (ONNX's order: input, output, forget, cell)."""
    i_pre, o_pre, f_pre, c_pre = pre
    if p is not None:  # peepholes, in ONNX's order: input, output, forget
        i_pre, f_pre = i_pre + p[0] * c, f_pre + p[2] * c
    c = cg.sigmoid(f_pre) * c + cg.sigmoid(i_pre) * cg.tanh(c_pre)
    if p is not None:
        o_pre = o_pre + p[1] * c
    return cg.sigmoid(o_pre) * cg.tanh(c), c


def _gru_step(from_x: Tensor, h: Tensor, r_gates: list[Tensor], rb_gates: list[Tensor | None], n: NodeInfo) -> Tensor:
    """One GRU step (ONNX's gate order: update z, reset r, hidden h): the recurrence weights and biases
    come split by gate."""
    x_z, x_r, x_h = cg.split(from_x, 3, axis=1)
    r_z, r_r, r_h = r_gates
    b_z, b_r, b_h = rb_gates

    def plus(t: Tensor, bias: Tensor | None) -> Tensor:
        return t if bias is None else t + bias

    z = cg.sigmoid(x_z + plus(cg.matmul(h, r_z), b_z))
    reset = cg.sigmoid(x_r + plus(cg.matmul(h, r_r), b_r))
    if n.attrs["linear_before_reset"]:
        candidate = cg.tanh(x_h + reset * plus(cg.matmul(h, r_h), b_h))
    else:
        candidate = cg.tanh(x_h + plus(cg.matmul(reset * h, r_h), b_h))
    return (1.0 - z) * candidate + z * h


def _check(kind: str) -> Check:
    def check(n: NodeInfo) -> str | None:
        shape = n.shape(0)
        if shape is None or len(shape) != 3:
            return f"{kind} of an input whose rank is not known to be 3"
        seq = shape[1] if n.attrs["layout"] else shape[0]
        if seq is None:
            return f"{kind} over a sequence whose length is unknown until the graph runs (it is unrolled when built)"
        if n.attrs["hidden_size"] is None:
            return f"{kind} without hidden_size"
        if _direction(n) not in ("forward", "reverse", "bidirectional"):
            return f"{kind} with direction {_direction(n)!r}"
        activations = n.attrs["activations"]
        if activations is not None:
            names = [as_text(a) for a in activations]
            if names != DEFAULT_ACTIVATIONS[kind] * len(_directions(n)):
                return f"{kind} with activations {names} (cellgraph imports the defaults, {DEFAULT_ACTIVATIONS[kind]})"
        for attr in ("activation_alpha", "activation_beta", "clip"):
            if n.attrs[attr] is not None:
                return f"{kind} with attribute {attr!r}"
        if kind == "LSTM" and n.attrs["input_forget"]:
            return "LSTM with input_forget=1 (coupled input and forget gates)"
        return None

    return check


_COMMON = {
    "hidden_size": None, "direction": "forward", "layout": 0, "activations": None,
    "activation_alpha": None, "activation_beta": None, "clip": None,
}  # fmt: skip

# Version 7 on: version 14 added ``layout`` (default 0, the older meaning).
# A half-float node computes in float32 and rounds its outputs once, as ONNX Runtime does: rounded after each
# of its steps' ops, float16 drifted a few units in the last place from it over three steps.
RECURRENT: dict[str, ImportRow] = {
    "RNN":  ImportRow(in_float32(_recurrent("RNN")), dict(_COMMON), (), _check("RNN"), since=7),
    "GRU":  ImportRow(in_float32(_recurrent("GRU")), {**_COMMON, "linear_before_reset": 0}, (), _check("GRU"),
                      since=7),
    "LSTM": ImportRow(in_float32(_recurrent("LSTM")), {**_COMMON, "input_forget": 0}, (), _check("LSTM"),
                      since=7),
}  # fmt: skip
