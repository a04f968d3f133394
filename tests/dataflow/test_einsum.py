"""``cg.einsum`` against ``np.einsum``, the ops it builds, and its refusals' words."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg

RNG = np.random.default_rng(7)

EQUATIONS = {
    "bqhd,bkhd->bhqk": [(2, 3, 4, 5), (2, 6, 4, 5)],
    "bhqk,bkhd->bqhd": [(2, 4, 3, 6), (2, 6, 4, 5)],
    "btd,de->bte": [(2, 3, 4), (4, 5)],
    "bij,bjk->bik": [(2, 3, 4), (2, 4, 5)],
    "ij,jk->ik": [(2, 3), (3, 4)],
    "ij,kj->ik": [(2, 3), (4, 3)],
    "ij,ij->i": [(2, 3), (2, 3)],
    "i,i->": [(3,), (3,)],
    "i,j->ij": [(3,), (4,)],
    "ij->ji": [(2, 3)],
    "ij->": [(2, 3)],
    "ij,jk": [(2, 3), (3, 4)],
    "abcd,cdef->abef": [(2, 3, 4, 5), (4, 5, 6, 7)],
    "ijk,ikl->jl": [(2, 3, 4), (2, 4, 5)],
    "ijx,k->ik": [(2, 3, 4), (5,)],
    "abc,cd,de->abe": [(2, 3, 4), (4, 5), (5, 6)],
    "ij,jk->ik ": [(0, 3), (3, 4)],
}


@pytest.mark.parametrize("equation", list(EQUATIONS))
def test_einsum_matches_numpy(equation: str) -> None:
    arrays = [RNG.normal(size=s).astype(np.float32) for s in EQUATIONS[equation]]
    g = cg.Graph()
    with g.as_default():
        out = cg.einsum(equation, *[cg.constant(a) for a in arrays])
    want = np.einsum(equation.strip(), *arrays)
    assert out.shape == want.shape
    np.testing.assert_allclose(cg.Session(g).run(out), want, rtol=1e-5, atol=1e-5)


def test_attention_contraction_is_one_batched_product_without_reshapes() -> None:
    """The Transformer's score contraction costs two transposes and one BatchMatMul."""
    g = cg.Graph()
    with g.as_default():
        q = cg.placeholder((None, 3, 4, 5), name="q")
        k = cg.placeholder((None, 6, 4, 5), name="k")
        scores = cg.einsum("bqhd,bkhd->bhqk", q, k)
    ops = [n.op for n in g.nodes if n.op != "Placeholder"]
    assert sorted(ops) == ["BatchMatMul", "Transpose", "Transpose"]
    assert scores.shape == (None, 4, 3, 6)
    qa, ka = RNG.normal(size=(2, 3, 4, 5)), RNG.normal(size=(2, 6, 4, 5))
    got = cg.Session(g).run(scores, {q: qa, k: ka})
    np.testing.assert_allclose(got, np.einsum("bqhd,bkhd->bhqk", qa, ka), rtol=1e-5, atol=1e-5)


def test_gradients_flow_to_every_operand() -> None:
    a_data, b_data = RNG.normal(size=(2, 3)), RNG.normal(size=(3, 4))
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((2, 3), "float64", name="a")
        b = cg.placeholder((3, 4), "float64", name="b")
        da, db = cg.gradients(cg.reduce_sum(cg.einsum("ij,jk->ik", a, b)), [a, b])
    got_a, got_b = cg.Session(g).run([da, db], {a: a_data, b: b_data})
    np.testing.assert_allclose(got_a, np.ones((2, 4)) @ b_data.T)
    np.testing.assert_allclose(got_b, a_data.T @ np.ones((2, 4)))


@pytest.mark.parametrize(
    ("equation", "shapes", "words"),
    [
        ("ii->i", [(3, 3)], "label 'i' repeats in operand 0 ('ii'); diagonals and traces are not supported"),
        ("...ij,jk", [(2, 3), (3, 4)], "'...' is not supported; name each batch axis with a letter"),
        ("ij,jk->ik", [(2, 3)], "the equation names 2 operand(s) but 1 were given"),
        ("ij,jk->iz", [(2, 3), (3, 4)], "output label 'z' is in no operand"),
        ("ij,jk->ii", [(2, 3), (3, 4)], "output label 'i' repeats"),
        ("ij,jk->ik", [(2, 3), (4, 4)], "label 'j' is 3 in one operand and 4 in operand 1"),
        ("ijk,jk->i", [(2, 3), (3, 4)], "operand 0 has 3 label(s) ('ijk') but rank 2 (shape (2, 3))"),
        ("i1,j->ij", [(2, 3), (3,)], "operand 0 has '1'; labels are letters a-z and A-Z"),
    ],
)
def test_einsum_refusals_name_the_equation_and_what_is_wrong(equation: str, shapes: list, words: str) -> None:
    g = cg.Graph()
    with g.as_default():
        tensors = [cg.constant(np.ones(s, np.float32)) for s in shapes]
        before = len(g.nodes)
        with pytest.raises(cg.ShapeError) as info:
            cg.einsum(equation, *tensors)
    assert f"einsum {equation!r}: {words}" in str(info.value)
    assert len(g.nodes) == before  # nothing left behind


def test_merging_two_unknown_axes_is_refused_with_advice() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((None, None, 4), name="a")
        w = cg.placeholder((4, 5), name="w")
        # a and b merge into one axis of unknown size, but cannot be split back.
        with pytest.raises(
            cg.ShapeError, match="cannot reshape to axes 'abe', more than one of unknown size; give the"
        ):
            cg.einsum("abd,de->abe", a, w)
        b = cg.placeholder((None, None, 2, 4), name="b")
        c = cg.placeholder((None, 4, 5), name="c")
        with pytest.raises(cg.ShapeError, match="cannot merge axes 'xyk' of 'bxyk', more than one of unknown size"):
            cg.einsum("bxyk,bkz->bxyz", b, c)


# Each einsum is a chain of ops the op table checks one by one (CUDA column
# included); these check the chains: gradients by central finite differences,
# and a size-0 label, against np.einsum.
CHAINS = {
    "bqhd,bkhd->bhqk": ([(2, 3, 2, 4), (2, 5, 2, 4)], None),
    "bhqk,bkhd->bqhd": ([(2, 2, 3, 5), (2, 5, 2, 4)], [(None, 2, 3, 5), (None, 5, 2, 4)]),
    "btd,de->bte": ([(2, 3, 4), (4, 5)], [(None, 3, 4), (4, 5)]),
    "ij,ij->i": ([(3, 4), (3, 4)], None),
    "abc,cd,de->abe": ([(2, 3, 4), (4, 5), (5, 2)], None),
    "ji,kj": ([(3, 2), (4, 3)], None),
    "ijk->j": ([(2, 3, 4)], None),
}


def _chain(equation: str, arrays: list[np.ndarray], static: list | None) -> tuple:
    g = cg.Graph()
    with g.as_default():
        tensors = [
            cg.placeholder(static[i] if static else a.shape, "float64", name=f"in{i}") for i, a in enumerate(arrays)
        ]
        out = cg.einsum(equation, *tensors)
    return g, tensors, out


@pytest.mark.parametrize("equation", list(CHAINS))
def test_einsum_gradients_match_finite_differences(equation: str) -> None:
    shapes, static = CHAINS[equation]
    arrays = [RNG.uniform(-1, 1, size=s) for s in shapes]
    g, tensors, out = _chain(equation, arrays, static)
    weights = RNG.uniform(0.5, 1.5, size=np.einsum(equation, *arrays).shape)
    with g.as_default():
        loss = cg.reduce_sum(out * cg.constant(weights, dtype="float64"))
        grads = cg.gradients(loss, tensors)
    sess = cg.Session(g)
    feeds = dict(zip(tensors, arrays))
    for i, got in enumerate(sess.run(grads, feeds)):
        numeric = np.zeros_like(arrays[i])
        for index in np.ndindex(*arrays[i].shape):
            values = []
            for step in (1e-6, -1e-6):
                bumped = arrays[i].copy()
                bumped[index] += step
                values.append(float(sess.run(loss, {**feeds, tensors[i]: bumped})))
            numeric[index] = (values[0] - values[1]) / 2e-6
        np.testing.assert_allclose(got, numeric, rtol=1e-5, atol=1e-7, err_msg=f"{equation}: operand {i}")


@pytest.mark.parametrize("equation", list(CHAINS))
def test_einsum_with_an_empty_label_matches_numpy(equation: str) -> None:
    """Each label in turn is size 0 in every operand that has it."""
    shapes = CHAINS[equation][0]
    inputs = equation.split("->")[0].split(",")
    for label in sorted(set("".join(inputs))):
        arrays = [
            RNG.uniform(-1, 1, size=[0 if c == label else d for c, d in zip(labels, s)])
            for labels, s in zip(inputs, shapes)
        ]
        g, tensors, out = _chain(equation, arrays, None)
        got = cg.Session(g).run(out, dict(zip(tensors, arrays)))
        want = np.einsum(equation, *arrays)
        assert got.shape == want.shape, (label, got.shape, want.shape)
        np.testing.assert_allclose(got, want, err_msg=f"{equation} with {label!r} empty")
