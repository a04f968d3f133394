"""The parameter service: gRPC servers that hold a job's variables, sharded, and the client that uses them.

``create_server`` starts one shard's server; ``ParameterClient`` is one job's
view of all its shards. See ``protos/parameter_service.proto`` for the RPCs.
"""

# First: both set gRPC's environment, which it reads when first imported, before anything here imports grpc.
from . import fork_safety, grpc_io  # noqa: F401
from .auth import ClientTLS, ServerTLS, new_token, read_token_file, write_token_file
from .client import ParameterClient
from .config import OptimizerConfig, TrainingConfig, VariableSpec
from .results import JobInfo, PullResult, PushResult
from .server import create_server

__all__ = [
    "ClientTLS",
    "JobInfo",
    "OptimizerConfig",
    "ParameterClient",
    "PullResult",
    "PushResult",
    "ServerTLS",
    "TrainingConfig",
    "VariableSpec",
    "create_server",
    "new_token",
    "read_token_file",
    "write_token_file",
]
