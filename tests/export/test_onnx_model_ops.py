"""The ops of real exported models that came with the tenth session: PyTorch's own export of a model using all of
them imports and computes PyTorch's values and gradients; every refusal says why.

(ONNX Runtime checks each op alone, every version and dtype: ``onnx_sweep_model_cases.py``.)
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cellgraph as cg
from cellgraph.onnx import OnnxError, import_model


def test_a_pytorch_model_of_these_ops_imports_with_pytorchs_values_and_gradients() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.prelu = torch.nn.PReLU(8)
            self.instance = torch.nn.InstanceNorm2d(8, affine=True)
            self.group = torch.nn.GroupNorm(4, 8)
            self.mish = torch.nn.Mish()
            self.mix = torch.nn.Parameter(torch.randn(8, 5))

        def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            h = self.mish(self.group(self.instance(self.prelu(self.conv(x)))))
            pooled = torch.einsum("bchw,ck->bkhw", h, self.mix).mean(dim=(2, 3))  # (batch, 5)
            picked = torch.gather(pooled, 1, index)  # (batch, 2)
            return torch.nn.functional.normalize(picked, dim=1)  # an L2 normalization: ReduceL2, Clip, Expand, Div

    model = Model().eval()
    with torch.no_grad():
        model.prelu.weight.uniform_(0.05, 0.5)
        model.instance.weight.uniform_(0.5, 1.5)
        model.group.bias.uniform_(-0.5, 0.5)
    example = (torch.randn(2, 3, 6, 6), torch.tensor([[0, 3], [4, 1]]))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, example, buffer, dynamo=False, opset_version=18, input_names=["x", "index"], output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "index": {0: "batch"}, "y": {0: "batch"}},
        )  # fmt: skip
    exported = onnx.load_from_string(buffer.getvalue())
    ops = {node.op_type for node in exported.graph.node}
    assert {"PRelu", "InstanceNormalization", "Einsum", "GatherElements"} <= ops, ops
    imported = import_model(exported)
    rng = np.random.default_rng(1)
    for batch in (1, 3):
        x = torch.randn(batch, 3, 6, 6, requires_grad=True)
        index = torch.tensor(rng.integers(0, 5, (batch, 2)))
        weights = torch.randn(batch, 2)
        (model(x, index) * weights).sum().backward()
        cx, ci = imported.inputs
        with imported.graph.as_default():
            [grad] = cg.gradients(cg.reduce_sum(imported.outputs[0] * cg.constant(weights.numpy())), [cx])
        y, dx = imported.session.run([imported.outputs[0], grad], {cx: x.detach().numpy(), ci: index.numpy()})
        np.testing.assert_allclose(y, model(x, index).detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-4, atol=1e-6)


def one_node(
    op: str, inputs: list[tuple[str, int, list[int | str] | None]], opset: int = 21, **attrs: object
) -> onnx.ModelProto:
    node = helper.make_node(op, [name for name, _, _ in inputs], ["y"], **attrs)
    values = [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in inputs]
    graph = helper.make_graph([node], "g", values, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


F = TensorProto.FLOAT


@pytest.mark.parametrize(
    ("model", "words"),
    [
        (
            one_node("MeanVarianceNormalization", [("x", F, None)], opset=17),
            r"MeanVarianceNormalization of an input of unknown rank",
        ),
        (
            one_node("Einsum", [("a", F, [2, 3, 4])], opset=17, equation="ij->ji"),
            r"Einsum 'ij->ji': operand 0 has rank 3",
        ),
        (
            one_node(
                "SoftmaxCrossEntropyLoss", [("x", F, [3, 5]), ("t", TensorProto.INT64, [3])], opset=17, reduction="avg"
            ),
            r"SoftmaxCrossEntropyLoss with reduction 'avg' \(ONNX's are none, sum, mean\)",
        ),
        (
            one_node("NegativeLogLikelihoodLoss", [("x", F, None), ("t", TensorProto.INT64, [3])], opset=17),
            r"NegativeLogLikelihoodLoss of scores of unknown rank or without a class axis",
        ),
        (one_node("PRelu", [("x", F, [3]), ("s", F, [2, 3])]), r"PRelu with a slope of rank 2 over an input of rank 1"),
        (
            one_node("GroupNormalization", [("x", F, [2, 6, 4]), ("s", F, [6]), ("b", F, [6])], num_groups=4),
            r"attribute 'num_groups' is 4: ONNX's GroupNormalization needs it to divide the 6 channels",
        ),
        (
            one_node("GroupNormalization", [("x", F, [2, "c", 4]), ("s", F, [6]), ("b", F, [6])], num_groups=2),
            r"GroupNormalization of an input whose channels or spatial sizes are unknown until the graph runs",
        ),
        (
            one_node(
                "GroupNormalization", [("x", F, [2, 6, 4]), ("s", F, [6]), ("b", F, [6])], num_groups=2, stash_type=0
            ),
            r"GroupNormalization with stash_type 0",
        ),
        (
            one_node("LpNormalization", [("x", F, [2, 3])], opset=17, p=3),
            r"LpNormalization with p=3 \(ONNX defines 1 and 2\)",
        ),
        (
            one_node("InstanceNormalization", [("x", F, None), ("s", F, [3]), ("b", F, [3])], opset=17),
            r"InstanceNormalization of an input of unknown rank",
        ),
        (
            one_node("GatherElements", [("x", F, [3, 4]), ("i", TensorProto.INT64, None)], opset=17),
            r"GatherElements of an input or indices whose rank is unknown until the graph runs",
        ),
        (
            one_node("Einsum", [("a", F, [3, 3])], opset=17, equation="ii->i"),
            r"Einsum 'ii->i': a label repeats in operand 0 \(a diagonal or trace\)",
        ),
        (
            one_node("Einsum", [("a", F, [2, 3]), ("b", F, [4, 3])], opset=17, equation="...j,...j->..."),
            r"Einsum '...j,...j->...': sizes 2 and 4 of one axis \(broadcast dims\)",
        ),
        (
            one_node("Einsum", [("a", F, None)], opset=17, equation="...i->i"),
            r"Einsum '...i->i': operand 0's rank is unknown until the graph runs",
        ),
        (
            one_node("Shrink", [("x", TensorProto.INT32, [3])], opset=17),
            r"Shrink of INT32 \(cellgraph imports it for floats\)",
        ),
        (
            one_node("CastLike", [("x", F, [3]), ("like", TensorProto.UNDEFINED, None)], opset=17),
            r"CastLike to the type of an input whose type is unknown",
        ),
    ],
    ids=[
        "mvn-rank",
        "einsum-operand-rank",
        "loss-reduction",
        "loss-rank",
        "prelu-rank",
        "groups",
        "group-dynamic",
        "stash",
        "lp-p",
        "instance-rank",
        "gather-rank",
        "diagonal",
        "broadcast",
        "einsum-rank",
        "shrink-int",
        "castlike-unknown",
    ],  # fmt: skip
)
def test_an_op_cellgraph_cannot_build_is_refused_with_its_reason(model: onnx.ModelProto, words: str) -> None:
    with pytest.raises(OnnxError, match=words):
        import_model(model)
