"""The job's dataclasses (``config.py``) to and from their protobuf messages.

Reading a message checks it as it goes: a message off the wire is untrusted,
so every field that could be nonsense (an unset dtype, a negative dim, an
unknown optimizer) is refused with a status code and a message that names it.
"""

from __future__ import annotations

import math

from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS
from cellgraph.dataflow.schedules import FIELDS, Schedule, schedule_from_fields
from cellgraph.dataflow.shapes import fmt
from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import tensor_pb2

from ..errors import ParameterServerError
from .chunks import dtype_enum, dtype_of
from .config import OptimizerConfig, TrainingConfig, VariableSpec, check_moving_momentum, quoted

_MODES = {"sync": pb.SYNC, "async": pb.ASYNC}
_MODE_NAMES = {v: k for k, v in _MODES.items()}
_NONFINITE = {"reject": pb.NONFINITE_REJECT, "skip_step": pb.NONFINITE_SKIP_STEP, "apply": pb.NONFINITE_APPLY}
_NONFINITE_NAMES = {v: k for k, v in _NONFINITE.items()}
# The most bytes a NumPy array can have: more is a declaration no machine can hold, not a request to try.
MAX_ARRAY_BYTES = 2**63 - 1
# The longest variable name (UTF-8 bytes) a server takes: names travel in every chunk and error message, and a
# 100 KB name was held and repeated without a word.
MAX_NAME_BYTES = 1024


def _invalid(message: str) -> ParameterServerError:
    return ParameterServerError(message, "INVALID_ARGUMENT")


# ------------------------------------------------------------------ variables
def spec_to_proto(spec: VariableSpec) -> pb.VariableSpecProto:
    rows = spec.rows if spec.rows is not None else (0, spec.shape[0] if spec.shape else 0)
    return pb.VariableSpecProto(
        name=spec.name,
        dtype=dtype_enum(spec.dtype),  # type: ignore[arg-type]
        shape=tensor_pb2.TensorShapeProto(dim=spec.shape),
        full_shape=tensor_pb2.TensorShapeProto(dim=spec.whole_shape),
        row_start=rows[0],
        row_stop=rows[1],
        moving=spec.moving,
        moving_momentum=spec.momentum,
    )


def spec_from_proto(proto: pb.VariableSpecProto) -> VariableSpec:
    if not proto.name:
        raise _invalid("a variable spec has no name")
    where = f"variable {quoted(proto.name)}"
    check_name(proto.name, where)
    shape, full = tuple(proto.shape.dim), tuple(proto.full_shape.dim) or tuple(proto.shape.dim)
    for label, dims in (("shape", shape), ("full shape", full)):
        if any(d < 0 for d in dims):
            raise _invalid(f"{where}: {label} {fmt(dims)} has a negative dim; a variable's shape is fully known")
    rows = (proto.row_start, proto.row_stop)
    if shape != full:
        # A partition: rows [start, stop) of axis 0 of the whole variable.
        if len(shape) != len(full) or shape[1:] != full[1:] or not 0 <= rows[0] < rows[1] <= full[0]:
            raise _invalid(f"{where}: a piece of shape {fmt(shape)} rows {rows[0]}:{rows[1]} does not fit {fmt(full)}")
        if rows[1] - rows[0] != shape[0]:
            raise _invalid(f"{where}: rows {rows[0]}:{rows[1]} are {rows[1] - rows[0]} rows, the piece has {shape[0]}")
    dtype = dtype_of(proto.dtype, where)
    for label, dims in (("shape", shape), ("full shape", full)):
        nbytes = math.prod(dims) * dtype.itemsize  # Python ints: no overflow
        if nbytes > MAX_ARRAY_BYTES:
            raise _invalid(
                f"{where}: {label} {fmt(dims)} of {dtype.name} is {nbytes:,} bytes, "
                f"more than any array can hold ({MAX_ARRAY_BYTES:,})"
            )
    momentum = proto.moving_momentum
    check_moving_momentum(proto.name, momentum)
    if momentum and not proto.moving:
        raise _invalid(f"{where}: moving_momentum {momentum!r} is given for a variable that is not a moving statistic")
    return VariableSpec(proto.name, dtype, shape, full, rows, proto.moving, momentum)


def check_name(name: str, where: str) -> None:
    """Refuse a name of unprintable characters (a NUL, a newline) or over ``MAX_NAME_BYTES``: it would be held,
    written to checkpoints and quoted in messages as it came."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise _invalid(f"{where}: a name of {size:,} bytes is longer than the limit of {MAX_NAME_BYTES:,} bytes")
    bad = next((i for i, c in enumerate(name) if not c.isprintable()), None)
    if bad is not None:
        raise _invalid(
            f"{where}: a name must be printable characters; character {bad} is {name[bad]!r} "
            "(no NUL, newline or other control character)"
        )


# ------------------------------------------------------------------ optimizer and training
def optimizer_to_proto(config: OptimizerConfig) -> pb.OptimizerConfigProto:
    # Each hyperparameter has the proto field of its name (the registry's names are the schema's).
    rate = config.learning_rate
    if isinstance(rate, Schedule):
        # So are a schedule's fields (dataflow/schedules.py): LearningRateScheduleProto has one of each name.
        schedule = pb.LearningRateScheduleProto(kind=rate.kind, **rate.fields())
        return pb.OptimizerConfigProto(kind=config.kind, learning_rate_schedule=schedule, **config.hyperparameters)
    return pb.OptimizerConfigProto(kind=config.kind, learning_rate=rate, **config.hyperparameters)


def optimizer_from_proto(proto: pb.OptimizerConfigProto) -> OptimizerConfig:
    if proto.kind not in OPTIMIZER_KINDS:
        return OptimizerConfig(kind=proto.kind)  # refused there, naming the kinds known
    names = OPTIMIZER_KINDS.lookup(proto.kind).names()
    rate: float | Schedule = proto.learning_rate
    if proto.HasField("learning_rate_schedule"):
        given = proto.learning_rate_schedule
        try:
            fields = {name: getattr(given, name) for name in FIELDS.get(given.kind, ())}
            rate = schedule_from_fields(given.kind, fields)
        except ValueError as err:  # an unknown kind or a bad field, named
            raise _invalid(f"{proto.kind} optimizer: {err}") from None
    return OptimizerConfig(proto.kind, rate, **{name: getattr(proto, name) for name in names})


def training_to_proto(config: TrainingConfig) -> pb.TrainingConfigProto:
    proto = pb.TrainingConfigProto(
        mode=_MODES[config.mode],
        replicas_to_aggregate=config.replicas_to_aggregate,
        checkpoint_every=config.checkpoint_every,
        nonfinite=_NONFINITE[config.nonfinite],
    )
    if config.max_staleness is not None:
        proto.max_staleness = config.max_staleness
    return proto


def training_from_proto(proto: pb.TrainingConfigProto) -> TrainingConfig:
    if proto.mode not in _MODE_NAMES:
        raise _invalid(f"training mode {proto.mode} is not SYNC (1) or ASYNC (2)")
    if proto.nonfinite not in _NONFINITE_NAMES:
        raise _invalid(f"nonfinite {proto.nonfinite} is not REJECT (0), SKIP_STEP (1) or APPLY (2)")
    staleness = proto.max_staleness if proto.HasField("max_staleness") else None
    mode = _MODE_NAMES[proto.mode]
    nonfinite = _NONFINITE_NAMES[proto.nonfinite]
    return TrainingConfig(mode, proto.replicas_to_aggregate, staleness, proto.checkpoint_every, nonfinite)  # type: ignore[arg-type]
