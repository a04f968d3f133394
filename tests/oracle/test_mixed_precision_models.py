"""Models built under ``cg.layers.policy("mixed_float16" | "mixed_bfloat16")`` trained against ``torch.autocast``.

A CNN with batch norm and an attention + LSTM sequence model (``mixed_models.py``) train 20 SGD steps from the
same weights on the same batches: in cellgraph under the policy (float16 under ``cg.optim.mixed_precision``'s
loss scale, bfloat16 without one), in cellgraph under ``float32``, and in PyTorch under ``torch.autocast`` on the
CPU (with ``GradScaler`` for float16). The half-precision runs must stay within half precision's tolerances of
torch's, and of float32's. Measured on the CPU (torch 2.13): the float16 models' weights end within 2e-4 (CNN) and
6e-4 (sequence) of torch's and within 6e-3 of float32's; the bfloat16 ones within 3.2e-2 and 3.5e-3 of torch's.
Then an overflow injected into the float16 backward (the loss multiplied by 1e4 for one step) is skipped on the
same steps as ``GradScaler`` skips it, and ``compute_gradients`` -> ``clip_by_global_norm`` -> ``apply_gradients``
clips the unscaled gradients as ``scaler.unscale_`` + ``clip_grad_norm_`` do.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from . import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

import cellgraph as cg  # noqa: E402

from .mixed_models import Built, batches, build, torch_train  # noqa: E402

STEPS = 20
LR = {"cnn": 0.2, "sequence": 0.5}
# (loss, weights) against torch under autocast, and (loss, weights) against cellgraph's float32 run: about three
# times the largest deviation measured over both models (float16 keeps 11 bits, bfloat16 8).
TOL = {"mixed_float16": (2e-3, 2e-3, 3e-3, 2e-2), "mixed_bfloat16": (3e-2, 1e-1, 4e-2, 1.5e-1)}


def _train(m: Built, data: list[tuple[np.ndarray, np.ndarray]], boosts: dict[int, float] | None = None) -> dict:
    sess = m.session()
    run: dict = {"start": sess.variable_values(), "losses": [], "scales": [], "norms": [], "after": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", cg.optim.LossScaleWarning)
        for step, (x, y) in enumerate(data):
            feeds = {m.x: x, m.y: y} | ({m.boost: np.float32(boosts[step])} if boosts and step in boosts else {})
            fetches = [m.loss, m.train] + ([m.norm] if m.norm is not None else [])
            out = sess.run(fetches, feeds)
            run["losses"].append(float(out[0]))
            run["norms"] += [float(out[2])] if m.norm is not None else []
            run["scales"].append(float(sess.run(m.mp.loss_scale)) if m.mp is not None else 1.0)
            run["after"].append(sess.variable_values())
    run["skipped"] = [w.message.step for w in caught if isinstance(w.message, cg.optim.LossScaleWarning)]
    return run


def _trained(run: dict) -> list[str]:
    return [k for k in run["start"] if "moving" not in k and "loss_scale" not in k]


def _largest(a: dict[str, np.ndarray], b: dict[str, np.ndarray], keys: list[str]) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in keys)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("model", ["cnn", "sequence"])
def test_a_policy_model_trains_as_torch_autocast_and_near_float32(model: str, policy: str) -> None:
    data = list(batches(model, STEPS))
    mixed = build(model, policy, LR[model])
    assert mixed.logits.dtype == policy.removeprefix("mixed_")
    assert mixed.loss.dtype == "float32"  # the loss widens half logits
    assert {v.output(0).dtype for v in mixed.graph.variables()} == {"float32"} | ({"int64"} if mixed.mp else set())
    got = _train(mixed, data)
    want32 = _train(build(model, "float32", LR[model]), data)
    keys = _trained(want32)
    for k in keys:  # the same variables, the same initial values: seeded by name, float32 in both
        np.testing.assert_array_equal(got["start"][k], want32["start"][k])
    torch_run = torch_train(model, policy, {k: got["start"][k] for k in keys}, data, LR[model])

    loss_tol, weight_tol, loss32_tol, weight32_tol = TOL[policy]
    assert got["losses"][-1] < got["losses"][0] - 0.01  # it learns
    np.testing.assert_allclose(got["losses"], torch_run.losses, rtol=0, atol=loss_tol)
    np.testing.assert_allclose(got["losses"], want32["losses"], rtol=0, atol=loss32_tol)
    assert _largest(got["after"][-1], torch_run.params, keys) < weight_tol
    assert _largest(got["after"][-1], want32["after"][-1], keys) < weight32_tol
    assert got["scales"] == torch_run.scales  # float16: no step overflowed, at 1024 on both sides; bfloat16: none


@pytest.mark.parametrize("clip", [None, 0.5], ids=["unclipped", "clipped"])
def test_an_injected_overflow_is_skipped_as_grad_scaler_skips_it_clipped_or_not(clip: float | None) -> None:
    boosts = {2: 1e4, 5: 1e4}  # the float16 gradients of those steps overflow (~1e4 * 1024 * their size)
    data = list(batches("cnn", 8))
    got = _train(build("cnn", "mixed_float16", LR["cnn"], clip=clip), data, boosts)
    keys = _trained(got)
    torch_run = torch_train("cnn", "mixed_float16", {k: got["start"][k] for k in keys}, data, LR["cnn"], clip, boosts)

    assert got["skipped"] == [3, 6]  # the warning counts steps from 1
    assert got["scales"] == torch_run.scales == [1024.0, 1024.0, 512.0, 512.0, 512.0, 256.0, 256.0, 256.0]
    for step in boosts:
        for k in keys:  # a skipped step changes no weight
            np.testing.assert_array_equal(got["after"][step][k], got["after"][step - 1][k], err_msg=k)
    assert all(np.isfinite(v).all() for v in got["after"][-1].values())  # moving statistics too: the forward was
    assert _largest(got["after"][-1], torch_run.params, keys) < 1e-3
    kept = [i for i in range(len(data)) if i not in boosts]
    np.testing.assert_allclose([got["losses"][i] for i in kept], [torch_run.losses[i] for i in kept], atol=2e-3)
    if clip is not None:
        # The norm clipped is the unscaled one (torch's after unscale_); NaN where the step overflowed.
        np.testing.assert_allclose(got["norms"], torch_run.norms, rtol=1e-3, equal_nan=True)
        assert all(np.isnan(got["norms"][i]) for i in boosts)
        assert max(got["norms"][i] for i in kept) > 2 * clip  # clipping was at work
