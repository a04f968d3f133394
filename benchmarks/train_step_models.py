"""The deep models of ``train_step.py`` in PyTorch, the weight copy from cellgraph, the 32x32 ResNet, a step profile.

``train_step.py --model resnet|transformer`` trains ``deep_models.resnet`` and
``deep_models.transformer`` against the PyTorch modules here: the same layers
and shapes, and every trainable weight (and batch norm's moving statistics)
copied from cellgraph's initial values, so the two losses agree at step 0.
cellgraph kernels are (kh, kw, in, out) and dense kernels (in, out), PyTorch's
are (out, in, kh, kw) and (out, in): the copy transposes them.

``--large`` builds the same ResNet blocks (``deep_models.residual_block``) on a
(None, 32, 32, 1) input: the digits upsampled 4x (nearest), batch 256.

``profile_plan`` times a cellgraph plan's steps one by one (each fused
segment is one step) and sums the seconds by op, to say where a step's time
goes; the executor has no profiling hook, and the plan's ``steps`` are what
its generated function calls in order.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

# (torch parameter or buffer, cellgraph variable name, layout): what ``copy_weights`` copies.
Copy = tuple[Any, str, str]

BN_EPSILON = 1e-3  # deep_models.conv_bn uses batch_norm's default epsilon
BN_MOMENTUM = 0.1  # PyTorch's momentum is 1 - TensorFlow's (deep_models.conv_bn: 0.9)
LN_EPSILON = 1e-5  # cg.layers.layer_norm's default


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's SAME padding (before, after) of one axis: the odd pixel goes after, unlike PyTorch's."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def torch_resnet(torch: Any, size: int, widths: tuple[int, int, int], copies: list[Copy]) -> Any:
    """``deep_models.resnet`` in NCHW for ``size`` x ``size`` inputs; appends its weights' sources to ``copies``."""
    nn = torch.nn
    functional = torch.nn.functional

    class ConvBN(nn.Module):  # type: ignore[name-defined]  # torch is imported at run time
        def __init__(self, c_in: int, c_out: int, k: int, stride: int, size: int, relu: bool, name: str) -> None:
            super().__init__()
            self.pad = (*same_padding(size, k, stride), *same_padding(size, k, stride))  # (left, right, top, bottom)
            self.conv = nn.Conv2d(c_in, c_out, k, stride, bias=False)
            self.bn = nn.BatchNorm2d(c_out, eps=BN_EPSILON, momentum=BN_MOMENTUM)
            self.relu = relu
            copies.append((self.conv.weight, f"{name}/conv/kernel", "conv"))
            for attr, var in (("weight", "gamma"), ("bias", "beta"), ("running_mean", "moving_mean")):
                copies.append((getattr(self.bn, attr), f"{name}/bn/{var}", "plain"))
            copies.append((self.bn.running_var, f"{name}/bn/moving_variance", "plain"))

        def forward(self, x: Any) -> Any:
            y = self.bn(self.conv(functional.pad(x, self.pad) if any(self.pad) else x))
            return functional.relu(y) if self.relu else y

    class Block(nn.Module):  # type: ignore[name-defined]
        def __init__(self, c_in: int, c_out: int, stride: int, size: int, name: str) -> None:
            super().__init__()
            self.a = ConvBN(c_in, c_out, 3, stride, size, True, f"{name}/a")
            out = -(-size // stride)
            self.b = ConvBN(c_out, c_out, 3, 1, out, False, f"{name}/b")
            self.projection = None
            if stride != 1 or c_in != c_out:
                self.projection = ConvBN(c_in, c_out, 1, stride, size, False, f"{name}/projection")

        def forward(self, x: Any) -> Any:
            shortcut = x if self.projection is None else self.projection(x)
            return functional.relu(self.b(self.a(x)) + shortcut)

    class ResNet(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.stem = ConvBN(1, widths[0], 3, 1, size, True, "stem")
            blocks, c_in, s = [], widths[0], size
            for stage, width in enumerate(widths):
                stride = 1 if stage == 0 else 2
                blocks.append(Block(c_in, width, stride, s, f"stage{stage + 1}"))
                c_in, s = width, -(-s // stride)
            self.blocks = nn.Sequential(*blocks)
            self.logits = nn.Linear(widths[-1], 10)
            copies.append((self.logits.weight, "logits/kernel", "dense"))
            copies.append((self.logits.bias, "logits/bias", "plain"))

        def forward(self, x: Any) -> Any:
            return self.logits(self.blocks(self.stem(x)).mean(dim=(2, 3)))

    return ResNet()


def torch_transformer(torch: Any, d_model: int, heads: int, copies: list[Copy]) -> Any:
    """``deep_models.transformer``: 8 rows as tokens, one pre-norm encoder block, layer norm, mean, dense 10."""
    nn = torch.nn
    functional = torch.nn.functional

    def linear(n_in: int, n_out: int, name: str) -> Any:
        layer = nn.Linear(n_in, n_out)
        copies.append((layer.weight, f"{name}/kernel", "dense"))
        copies.append((layer.bias, f"{name}/bias", "plain"))
        return layer

    def norm(name: str) -> Any:
        layer = nn.LayerNorm(d_model, eps=LN_EPSILON)
        copies.append((layer.weight, f"{name}/gamma", "plain"))
        copies.append((layer.bias, f"{name}/beta", "plain"))
        return layer

    class Transformer(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.project = linear(8, d_model, "project")
            # The embedding of the constant positions 0..7 is its whole table.
            self.position = nn.Parameter(torch.zeros(8, d_model))
            copies.append((self.position, "position/embeddings", "plain"))
            self.norm1 = norm("encoder/norm1")
            self.query = linear(d_model, d_model, "encoder/attention/query")
            self.key = linear(d_model, d_model, "encoder/attention/key")
            self.value = linear(d_model, d_model, "encoder/attention/value")
            self.output = linear(d_model, d_model, "encoder/attention/output")
            self.norm2 = norm("encoder/norm2")
            self.ff1 = linear(d_model, 2 * d_model, "encoder/ff1")
            self.ff2 = linear(2 * d_model, d_model, "encoder/ff2")
            self.final_norm = norm("final_norm")
            self.logits = linear(d_model, 10, "logits")

        def heads(self, x: Any) -> Any:
            return x.view(x.shape[0], 8, heads, d_model // heads).transpose(1, 2)

        def forward(self, x: Any) -> Any:
            h = self.project(x.reshape(-1, 8, 8)) + self.position  # NCHW (B, 1, 8, 8): the rows are the tokens
            n = self.norm1(h)
            attended = functional.scaled_dot_product_attention(
                self.heads(self.query(n)), self.heads(self.key(n)), self.heads(self.value(n))
            )
            h = h + self.output(attended.transpose(1, 2).reshape(-1, 8, d_model))
            h = h + self.ff2(functional.gelu(self.ff1(self.norm2(h))))
            return self.logits(self.final_norm(h).mean(dim=1))

    return Transformer()


def copy_weights(torch: Any, copies: list[Copy], values: dict[str, Any]) -> None:
    """Set each PyTorch tensor in ``copies`` to cellgraph's value, in PyTorch's layout."""
    with torch.no_grad():
        for target, name, layout in copies:
            raw = value = values[name]
            if layout == "conv":
                value = value.transpose(3, 2, 0, 1)  # (kh, kw, in, out) -> (out, in, kh, kw)
            elif layout == "dense":
                value = value.T  # (in, out) -> (out, in)
            if tuple(value.shape) != tuple(target.shape):
                raise SystemExit(
                    f"weight copy: {name} is {raw.shape} in cellgraph, which does not fit torch's "
                    f"{tuple(target.shape)} ({layout} layout)"
                )
            target.copy_(torch.from_numpy(value.copy()))


def resnet_large(cg: Any, optimizer: Any, size: int, widths: tuple[int, int, int]) -> Any:
    """``deep_models.resnet``'s stem and blocks on (None, ``size``, ``size``, 1) inputs, as a ``Model``."""
    from cellgraph.examples.deep_models import conv_bn, residual_block
    from cellgraph.examples.model_base import finish

    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, size, size, 1), "float32", name="x")
        y = cg.placeholder((None,), "int32", name="y")
        training = cg.layers.training_switch()
        h = conv_bn(x, widths[0], 3, training, name="stem")
        for stage, width in enumerate(widths):
            h = residual_block(h, width, 1 if stage == 0 else 2, training, name=f"stage{stage + 1}")
        logits = cg.layers.dense(cg.reduce_mean(h, axis=(1, 2)), 10, name="logits")
        return finish("resnet-large", g, x, y, logits, optimizer, True, training)


@contextlib.contextmanager
def training_constant(cg: Any, on: bool) -> Iterator[None]:
    """With ``on``, models built inside get ``True`` from ``cg.layers.training_switch``: batch norm in training
    mode only, no placeholder, no ``where`` between the two modes (the diagnosis of ``--training-constant``)."""
    if not on:
        yield
        return
    switch = cg.layers.training_switch
    cg.layers.training_switch = lambda *args, **kwargs: True
    try:
        yield
    finally:
        cg.layers.training_switch = switch


def profile_plan(plan: Any, feed_values: tuple[Any, ...], repeats: int) -> list[tuple[str, float, int]]:
    """(op, seconds per step, calls per step) of ``plan``'s steps run one by one ``repeats`` times, slowest first.

    A fused segment counts as ``fused elementwise``. Running the steps from
    Python adds a dictionary look-up per step, which the generated function
    does not have; at milliseconds per kernel that is noise.
    """
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for _ in range(repeats):
        env = {(id(t.node), t.index): v for t, v in zip(plan.feeds, feed_values, strict=True)}
        for step in plan.steps:
            args = [env[(id(t.node), t.index)] for t in step.inputs]
            start = time.perf_counter()
            result = step.kernel(*args)
            elapsed = time.perf_counter() - start
            outs = result if len(step.outputs) > 1 else (result,) if step.outputs else ()
            for t, value in zip(step.outputs, outs, strict=True):
                env[(id(t.node), t.index)] = value
            if step.constant:
                continue
            op = "fused elementwise" if len(step.nodes) > 1 else step.nodes[0].op
            seconds[op] += elapsed
            calls[op] += 1
    return sorted(((op, s / repeats, calls[op] // repeats) for op, s in seconds.items()), key=lambda r: -r[1])


def torch_profile(torch: Any, step: Any, batch: tuple[Any, Any], repeats: int) -> list[tuple[str, float, int]]:
    """(aten op, self seconds per step, calls per step) of ``step`` under torch.profiler, slowest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            step(*batch)
    rows = [
        (e.key, e.self_cpu_time_total / 1e6 / repeats, e.count // repeats)
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    ]
    return sorted(rows, key=lambda r: -r[1])
