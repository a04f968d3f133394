"""A quick look at a scheduler's address before Dask connects: an unknown host or a refused port is told at once.

Dask's own connect retries a refused or unresolvable address until its whole
time-out has passed (60 s for ``%cluster connect``) and then reports a
time-out, which sends the user looking at firewalls. Resolving the host and
opening one TCP connection takes milliseconds and tells those cases apart.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from typing import Any

PROBE_S = 3.0  # the longest the look may take; past it, Dask's connect waits as usual
# Errors of connect() that say the address cannot work, whatever Dask would try for its time-out.
_HOPELESS = {
    errno.ECONNREFUSED: "the connection was refused: nothing listens on port {port} of {host}",
    errno.EHOSTUNREACH: "the host {host} cannot be reached (no route to it)",
    errno.ENETUNREACH: "the network of {host} cannot be reached",
}


def unreachable(address: str, within: float = PROBE_S) -> str | None:
    """Why nothing can answer at ``address`` (an unknown host, a refused port), or ``None`` when that is not known.

    ``None`` also for an address this cannot read (``Cluster.connect`` says
    what is wrong with it) and for a look that did not finish ``within``
    seconds (a firewall that drops packets): Dask's connect then waits its
    own time-out.

    Examples
    --------
    >>> import socket
    >>> with socket.socket() as free:  # a port nothing listens on
    ...     free.bind(("127.0.0.1", 0))
    ...     port = free.getsockname()[1]
    >>> unreachable(f"tcp://127.0.0.1:{port}")  # doctest: +ELLIPSIS
    'the connection was refused: nothing listens on port ... of 127.0.0.1'
    >>> unreachable("tcp://no-such-host.invalid:8786")  # doctest: +ELLIPSIS
    "the host 'no-such-host.invalid' ..."
    """
    from distributed.comm import get_address_host_port

    try:
        host, port = get_address_host_port(address)
    except ValueError:  # a malformed address, or a transport without host and port (inproc://, ucx://)
        return None
    deadline = time.monotonic() + within
    try:
        infos = _resolve(host, port, within)
    except socket.gaierror as err:
        if err.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return f"the host {host!r} is unknown ({err.strerror}): check the name"
        return f"the host {host!r} could not be looked up ({err.strerror})"
    if infos is None:  # the name service is slow: no verdict
        return None
    reasons = []
    for family, kind, proto, _, sockaddr in infos:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(left)
            try:
                sock.connect(sockaddr)
            except TimeoutError:
                return None
            except OSError as err:
                if err.errno not in _HOPELESS:
                    return None
                reasons.append(_HOPELESS[err.errno].format(host=host, port=port))
                continue
        return None  # something listens there: Dask's handshake says whether it is a scheduler
    # Every address of the host refused: say it once per distinct reason.
    return "; ".join(dict.fromkeys(reasons)) or None


def _resolve(host: str, port: int, within: float) -> list[tuple[Any, ...]] | None:
    """``getaddrinfo(host, port)`` for TCP, or ``None`` if it has not answered within ``within`` seconds.

    ``getaddrinfo`` takes no time-out, so it runs on a daemon thread that is
    left to finish on its own when it takes too long.
    """
    outcome: list[Any] = []

    def look_up() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as err:  # handed to the waiting thread, which raises it
            outcome.append(err)

    thread = threading.Thread(target=look_up, name=f"cellgraph-resolve-{host}", daemon=True)
    thread.start()
    thread.join(within)
    if not outcome:
        return None
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return list(outcome[0])
