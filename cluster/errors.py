"""The errors the cluster side raises.

A parameter server answers a bad request with a gRPC status code and a message
that names the variable, the step and what was wrong. The same class carries
that code on both sides of the wire: the store raises it, the server turns its
``code`` into the RPC's status, and the client raises it again with the
server's address in front.
"""

from __future__ import annotations

from cellgraph.dataflow.errors import CellgraphError

# The gRPC status names a parameter server answers with (grpc.StatusCode[name]).
STATUS_CODES = (
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "FAILED_PRECONDITION",
    "ABORTED",
    "RESOURCE_EXHAUSTED",
    "OUT_OF_RANGE",
    "DEADLINE_EXCEEDED",
    "UNAUTHENTICATED",
    "UNAVAILABLE",
    "CANCELLED",
    "INTERNAL",
    "UNKNOWN",
)


class ClusterError(CellgraphError):
    """A cluster that could not be started or reached, or a role assignment that does not fit its workers."""


class ParameterServerError(CellgraphError):
    """A request the parameter service refused, or could not answer.

    ``code`` is the gRPC status name (``"INVALID_ARGUMENT"``, ``"NOT_FOUND"``, ...).
    """

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        if code not in STATUS_CODES:
            raise ValueError(f"ParameterServerError: unknown status code {code!r}; known: {', '.join(STATUS_CODES)}")
        super().__init__(message)
        self.code = code
