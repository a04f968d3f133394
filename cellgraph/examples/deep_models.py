"""The deeper demo models, each trained on the 8x8 digits: ``resnet``, ``inception_v3``, ``transformer``, ``lstm``.

Every one takes the digits as NHWC images (batch, 8, 8, 1), as the
mini-Inception does; the sequence models read them as 8 tokens (the rows) of
8 features. The batch-normalized ones carry a ``training`` switch (see
``models.py``).

- ``resnet``: He et al. (2015)'s residual network at digit scale: a conv stem,
  three stages of basic blocks (conv-BN-ReLU-conv-BN plus the shortcut, a 1x1
  projection where the shape changes) at 16, 32 and 64 channels on 8x8, 4x4
  and 2x2 maps, global average pooling, a dense head.
- ``inception_v3``: Szegedy et al. (2015)'s Inception-v3 modules with batch
  norm after every convolution: a module A (1x1; 1x1-3x3; 1x1-3x3-3x3, the
  factorised 5x5; avg pool-1x1), the grid reduction (3x3 stride 2;
  1x1-3x3-3x3 stride 2; max pool), a module C with the asymmetric
  factorisation (1x3 and 3x1 branches, the 1xn/nx1 of the paper sized for a
  4x4 map), global average pooling, a dense head.
- ``transformer``: a pre-norm encoder block (Vaswani et al., 2017) over the 8
  rows: a per-token projection plus a learned position embedding, multi-head
  self-attention and a GELU feed-forward, each with layer norm and a
  residual, then the tokens' mean and a dense head.
- ``lstm``: an LSTM over the 8 rows; its final hidden state feeds a dense head.

>>> from cellgraph.examples.deep_models import resnet
>>> model = resnet()
>>> model.logits.shape, model.training.shape
((None, 10), ())
"""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from .model_base import Model, finish


def _inputs() -> tuple[cg.Graph, cg.Tensor, cg.Tensor]:
    x = cg.placeholder((None, 8, 8, 1), "float32", name="x")
    y = cg.placeholder((None,), "int32", name="y")
    return cg.get_default_graph(), x, y


def conv_bn(
    x: cg.Tensor,
    filters: int,
    kernel: int | tuple[int, int],
    training: cg.Tensor,
    strides: int = 1,
    relu: bool = True,
    name: str = "conv",
) -> cg.Tensor:
    """Convolution (no bias: batch norm's beta is the shift), batch norm, then ReLU unless ``relu`` is false."""
    with cg.name_scope(name):
        y = cg.layers.conv2d(x, filters, kernel, strides=strides, use_bias=False, name="conv")
        # Momentum 0.9, not 0.99: an epoch of the digits is 22 steps, and the moving statistics
        # must settle within the few epochs a demo trains.
        y = cg.layers.batch_norm(y, training, momentum=0.9, name="bn")
        return cg.relu(y) if relu else y


def _global_average(x: cg.Tensor) -> cg.Tensor:
    return cg.reduce_mean(x, axis=(1, 2))


# ------------------------------------------------------------------- ResNet
def residual_block(x: cg.Tensor, filters: int, strides: int, training: cg.Tensor, name: str) -> cg.Tensor:
    """``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))``; the shortcut is a 1x1 projection when the shape changes."""
    with cg.name_scope(name):
        y = conv_bn(x, filters, 3, training, strides, name="a")
        y = conv_bn(y, filters, 3, training, relu=False, name="b")
        shortcut = x
        if strides != 1 or x.shape[3] != filters:
            shortcut = conv_bn(x, filters, 1, training, strides, relu=False, name="projection")
        return cg.relu(y + shortcut)


def resnet(optimizer: cg.optim.Optimizer | None = None, widths: tuple[int, int, int] = (16, 32, 64)) -> Model:
    """Stem conv 3x3, three stages of one residual block each (8x8, 4x4, 2x2), global average pool, dense 10."""
    g = cg.Graph()
    with g.as_default():
        g, x, y = _inputs()
        training = cg.layers.training_switch()
        h = conv_bn(x, widths[0], 3, training, name="stem")
        for stage, width in enumerate(widths):
            h = residual_block(h, width, 1 if stage == 0 else 2, training, name=f"stage{stage + 1}")
        logits = cg.layers.dense(_global_average(h), 10, name="logits")
        return finish("resnet", g, x, y, logits, optimizer or cg.optim.Adam(3e-3), True, training)


# -------------------------------------------------------------- Inception-v3
def inception_a(x: cg.Tensor, width: int, training: cg.Tensor, name: str) -> cg.Tensor:
    """Module A: 1x1; 1x1 then 3x3; 1x1 then two 3x3 (a 5x5 factorised); 3x3 average pool then 1x1."""
    with cg.name_scope(name):
        b1 = conv_bn(x, width, 1, training, name="b1x1")
        b3 = conv_bn(conv_bn(x, width, 1, training, name="b3x3_reduce"), width, 3, training, name="b3x3")
        b5 = conv_bn(x, width, 1, training, name="b5x5_reduce")
        b5 = conv_bn(conv_bn(b5, width, 3, training, name="b5x5_a"), width, 3, training, name="b5x5_b")
        pool = cg.layers.avg_pool2d(x, 3, 1, "SAME", name="pool")
        bp = conv_bn(pool, width, 1, training, name="pool_proj")
        return cg.concat([b1, b3, b5, bp], axis=3)


def grid_reduction(x: cg.Tensor, width: int, training: cg.Tensor, name: str) -> cg.Tensor:
    """Halves the map without a bottleneck: 3x3 stride 2; 1x1, 3x3, 3x3 stride 2; 3x3 max pool stride 2."""
    with cg.name_scope(name):
        b3 = conv_bn(x, width, 3, training, strides=2, name="b3x3")
        bd = conv_bn(conv_bn(x, width, 1, training, name="bd_reduce"), width, 3, training, name="bd_a")
        bd = conv_bn(bd, width, 3, training, strides=2, name="bd_b")
        pool = cg.layers.max_pool2d(x, 3, 2, "SAME", name="pool")
        return cg.concat([b3, bd, pool], axis=3)


def inception_c(x: cg.Tensor, width: int, training: cg.Tensor, name: str) -> cg.Tensor:
    """Module C with asymmetric factorisation: 1x1; 1x1 then 1x3 and 3x1 side by side;
    1x1, 3x3, then 1x3 and 3x1 side by side; 3x3 average pool then 1x1."""
    with cg.name_scope(name):
        b1 = conv_bn(x, width, 1, training, name="b1x1")
        b3 = conv_bn(x, width, 1, training, name="b3_reduce")
        b3 = cg.concat(
            [conv_bn(b3, width, (1, 3), training, name="b3_1x3"), conv_bn(b3, width, (3, 1), training, name="b3_3x1")],
            axis=3,
        )
        bd = conv_bn(conv_bn(x, width, 1, training, name="bd_reduce"), width, 3, training, name="bd_3x3")
        bd = cg.concat(
            [conv_bn(bd, width, (1, 3), training, name="bd_1x3"), conv_bn(bd, width, (3, 1), training, name="bd_3x1")],
            axis=3,
        )
        pool = cg.layers.avg_pool2d(x, 3, 1, "SAME", name="pool")
        bp = conv_bn(pool, width, 1, training, name="pool_proj")
        return cg.concat([b1, b3, bd, bp], axis=3)


def inception_v3(optimizer: cg.optim.Optimizer | None = None, width: int = 8) -> Model:
    """Stem conv 3x3 (2 ``width``), module A (8x8), grid reduction (to 4x4), module C, global pool, dense 10."""
    g = cg.Graph()
    with g.as_default():
        g, x, y = _inputs()
        training = cg.layers.training_switch()
        h = conv_bn(x, 2 * width, 3, training, name="stem")
        h = inception_a(h, width, training, name="mixed_a")
        h = grid_reduction(h, 2 * width, training, name="reduction")
        h = inception_c(h, width, training, name="mixed_c")
        logits = cg.layers.dense(_global_average(h), 10, name="logits")
        return finish("inception-v3", g, x, y, logits, optimizer or cg.optim.Adam(3e-3), True, training)


# -------------------------------------------------------------- Transformer
def _tokens(x: cg.Tensor) -> cg.Tensor:
    """(batch, 8, 8, 1) images -> (batch, 8, 8): 8 tokens (the rows) of 8 features."""
    return cg.reshape(x, (-1, 8, 8))


def encoder_block(h: cg.Tensor, heads: int, hidden: int, name: str) -> cg.Tensor:
    """Pre-norm: ``h + attention(norm(h))``, then ``h + dense(gelu(dense(norm(h))))``."""
    d = h.shape[-1]
    assert d is not None
    with cg.name_scope(name):
        normed = cg.layers.layer_norm(h, name="norm1")
        h = h + cg.layers.multi_head_attention(normed, num_heads=heads, name="attention")
        normed = cg.layers.layer_norm(h, name="norm2")
        ff = cg.layers.dense(cg.layers.dense(normed, hidden, activation="gelu", name="ff1"), d, name="ff2")
        return h + ff


def transformer(optimizer: cg.optim.Optimizer | None = None, d_model: int = 32, heads: int = 4) -> Model:
    """Rows projected to ``d_model`` plus position embeddings, one encoder block, layer norm, mean, dense 10."""
    g = cg.Graph()
    with g.as_default():
        g, x, y = _inputs()
        tokens = cg.layers.dense(_tokens(x), d_model, name="project")
        positions = cg.layers.embedding(cg.constant(np.arange(8, dtype=np.int32)), 8, d_model, name="position")
        h = encoder_block(tokens + positions, heads, 2 * d_model, name="encoder")
        pooled = cg.reduce_mean(cg.layers.layer_norm(h, name="final_norm"), axis=1)
        logits = cg.layers.dense(pooled, 10, name="logits")
        return finish("transformer", g, x, y, logits, optimizer or cg.optim.Adam(3e-3), True)


# --------------------------------------------------------------------- LSTM
def lstm(optimizer: cg.optim.Optimizer | None = None, units: int = 64) -> Model:
    """An LSTM of ``units`` over the 8 rows; its final hidden state, dense 10."""
    g = cg.Graph()
    with g.as_default():
        g, x, y = _inputs()
        _, (h, _) = cg.layers.lstm(_tokens(x), units, name="lstm")
        logits = cg.layers.dense(h, 10, name="logits")
        return finish("lstm", g, x, y, logits, optimizer or cg.optim.Adam(1e-2), True)
