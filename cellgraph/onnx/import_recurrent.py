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

What is refused, naming it: activations other than the defaults (sigmoid and
tanh), ``clip``, LSTM's ``input_forget``, and a ``sequence_lens`` that is not
the full length for every row.

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
    gates = GATES[kind]

    def build(b: Builder, n: NodeInfo) -> list[Tensor]:
        x, w, r, bias = _input(b, n, 0), _input(b, n, 1), _input(b, n, 2), _input(b, n, 3)
        assert x is not None and w is not None and r is not None
        h_start, c_start = _input(b, n, 5), _input(b, n, 6) if kind == "LSTM" else None
        peepholes = _input(b, n, 7) if kind == "LSTM" else None
        hidden, batchwise = int(n.attrs["hidden_size"]), bool(n.attrs["layout"])
        if batchwise:  # (batch, seq, input) and states (batch, num_directions, hidden): ONNX's layout 1
            x = cg.transpose(x, (1, 0, 2))
            h_start = cg.transpose(h_start, (1, 0, 2)) if h_start is not None else None
            c_start = cg.transpose(c_start, (1, 0, 2)) if c_start is not None else None
        steps = cg.unstack(x, num=x.shape[0], axis=0)
        ys, last_h, last_c = [], [], []
        for d, direction in enumerate(_directions(n)):
            w_t, r_t = cg.transpose(_row_of(w, d), (1, 0)), cg.transpose(_row_of(r, d), (1, 0))
            biases = cg.split(_row_of(bias, d), 2, axis=0) if bias is not None else None
            first = cg.matmul(steps[0], w_t)
            zeros = cg.zeros_like(cg.slice(first, [0, 0], [-1, hidden]))  # (batch, hidden), the batch as it runs
            h = _row_of(h_start, d) if h_start is not None else zeros
            c = _row_of(c_start, d) if c_start is not None else zeros
            p = cg.split(_row_of(peepholes, d), 3, axis=0) if peepholes is not None else None
            order = range(len(steps)) if direction == "forward" else range(len(steps) - 1, -1, -1)
            # GRU's recurrence weights and biases by gate, split once for every step.
            r_gates = cg.split(r_t, 3, axis=1) if kind == "GRU" else []
            rb_gates = cg.split(biases[1], 3, axis=0) if kind == "GRU" and biases is not None else [None] * 3
            outputs = []
            for t in order:
                from_x = first if t == 0 else cg.matmul(steps[t], w_t)
                if biases is not None:
                    from_x = from_x + biases[0]
                if kind == "GRU":
                    h = _gru_step(from_x, h, r_gates, rb_gates, n)
                else:
                    from_h = cg.matmul(h, r_t)
                    pre = from_x + from_h if biases is None else from_x + from_h + biases[1]
                    if kind == "RNN":
                        h = cg.tanh(pre)
                    else:
                        h, c = _lstm_step(cg.split(pre, gates, axis=1), c, p)
                outputs.append(h)
            ys.append(cg.stack(outputs if direction == "forward" else outputs[::-1], axis=0))  # in time order
            last_h.append(h)
            last_c.append(c)
        y, y_h, y_c = cg.stack(ys, axis=1), cg.stack(last_h, axis=0), cg.stack(last_c, axis=0)
        if batchwise:
            y, y_h, y_c = cg.transpose(y, (2, 0, 1, 3)), cg.transpose(y_h, (1, 0, 2)), cg.transpose(y_c, (1, 0, 2))
        return [y, y_h, y_c] if kind == "LSTM" else [y, y_h]

    return build


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
        lengths = n.static_value(4)
        if lengths is not None and any(int(v) != seq for v in lengths):
            return f"{kind} with sequence_lens {lengths.tolist()} shorter than the sequence ({seq})"
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
    "RNN":  ImportRow(in_float32(_recurrent("RNN")), dict(_COMMON), (4,), _check("RNN"), since=7),
    "GRU":  ImportRow(in_float32(_recurrent("GRU")), {**_COMMON, "linear_before_reset": 0}, (4,), _check("GRU"),
                      since=7),
    "LSTM": ImportRow(in_float32(_recurrent("LSTM")), {**_COMMON, "input_forget": 0}, (4,), _check("LSTM"),
                      since=7),
}  # fmt: skip
