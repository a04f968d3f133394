"""What a gradient holding NaN or Inf is called, wherever it is found: at the replica or at a shard.

A shard checks the gradients it receives, but holds only some of the
variables; the replica sees all of them. So a replica that pushes to more than
one shard checks its gradients itself and tells every shard what it found (the
push's last message), and each shard then skips, refuses or applies the whole
push by the job's policy: never half a step. Both say it in the same words.

Examples
--------
>>> import numpy as np
>>> first_nonfinite(0, 3, [("b", np.ones(2)), ("w", np.array([np.nan, np.inf, 1.0]))])
"replica 0's gradient for 'w' at step 3 holds 1 NaN and 1 Inf of 3 values"
>>> first_nonfinite(0, 3, [("b", np.ones(2))]) is None
True
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import numpy as np

from ...dataflow.kernels.cpu.training import all_finite
from .config import quoted
from .pieces import Gradient, Pieced


def first_nonfinite(
    replica_id: int, step: int, grads: Iterable[tuple[str, Gradient]], checked: Collection[str] = ()
) -> str | None:
    """What is wrong with the first of ``grads`` that holds NaN or Inf, or None; those named in ``checked`` are
    known finite already."""
    for name, grad in grads:
        if name in checked:
            continue
        flat = (grad.whole() if isinstance(grad, Pieced) else np.ascontiguousarray(grad)).reshape(-1)
        if all_finite(flat):
            continue
        nans = int(np.count_nonzero(np.isnan(flat)))
        infs = int(np.count_nonzero(np.isinf(flat)))
        return (
            f"replica {replica_id}'s gradient for {quoted(name)} at step {step} holds {nans:,} NaN "
            f"and {infs:,} Inf of {flat.size:,} values"
        )
    return None
