"""A quick look at a scheduler's address before Dask connects: an unknown host or a refused port is told at once.

Dask's own connect retries a refused or unresolvable address until its whole
time-out has passed and then reports a time-out, which sends the user
looking at firewalls. Resolving the host and opening one TCP connection
takes milliseconds and tells those cases apart. ``Cluster.connect`` (and so
``%cluster connect``) looks here first; ``tls_configured`` says whether a
``tls://`` address can be tried without ``security=``.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client
    from distributed.security import Security

PROBE_S = 3.0  # the longest the look may take; past it, Dask's connect waits as usual
# What open_client waits past its time-out for Dask's own error, which names the cause.
HANDSHAKE_GRACE_S = 1.0
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


def tls_configured(security: Security | None = None) -> bool:
    """Whether ``security`` (by default, Dask's configuration) gives a client what TLS needs: a certificate context.

    Without one Dask's TLS connector raises a bare ``TypeError`` about an
    ``ssl_context`` argument the user never passed.
    """
    from distributed.security import Security

    context = (security or Security()).get_connection_args("client").get("ssl_context")
    return isinstance(context, ssl.SSLContext)


def open_client(address: str, security: Security | None, timeout: float) -> Client:
    """A ``distributed.Client`` of the scheduler at ``address``, or ``TimeoutError`` after ``timeout`` seconds.

    Dask's ``timeout`` covers the TCP connect, not the handshake after it: a
    port that accepts and never answers (a stuck process, a port that is not
    a scheduler's) would block the caller for ever. So the client is made on a
    daemon thread, waited for with a deadline, and closed by that thread should
    it arrive after the caller has given up. Dask's own error, when it comes
    in time, is raised as it is.
    """
    from distributed import Client

    lock = threading.Lock()
    arrived = threading.Event()
    outcome: list[Any] = []
    given_up = False

    def make() -> None:
        try:
            result: Any = Client(address, security=security, timeout=timeout, set_as_default=False)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread, which raises it
            result = err
        with lock:
            if not given_up:
                outcome.append(result)
                arrived.set()
                return
        if isinstance(result, Client):  # too late: nobody holds it
            with contextlib.suppress(Exception):
                result.close(timeout=timeout)

    threading.Thread(target=make, name=f"cellgraph-connect-{address}", daemon=True).start()
    # A little past ``timeout``: Dask's own time-out, which says more, arrives first when it comes.
    arrived.wait(timeout + HANDSHAKE_GRACE_S)
    with lock:
        if not outcome:
            given_up = True
            raise TimeoutError("the port took the connection and sent no Dask handshake")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    client: Client = outcome[0]
    return client


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


__all__ = ["PROBE_S", "open_client", "tls_configured", "unreachable"]
