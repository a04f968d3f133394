"""``cellgraph ps``: run one parameter server from the command line until it is told to stop.

    cellgraph ps --port 5000 --token-file ~/.cellgraph/job.token --checkpoint-dir ckpt/

It prints one line, ``cellgraph ps: serving on HOST:PORT ...`` (an IPv6
host in brackets, ``[::1]:5000``, as clients must write it), once it
listens (``--port 0`` picks a free port, which that line names), and stops
cleanly on Ctrl-C or SIGTERM, letting calls in flight finish.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ..errors import ParameterServerError
from .auth import ServerTLS, new_token, read_token_file, write_token_file
from .server import create_server, host_port, serve_forever


def add_parser(commands: Any) -> None:
    """Add the ``ps`` command to the ``cellgraph`` command line's subparsers."""
    ps = commands.add_parser("ps", help="run a parameter server (one shard of a job's variables)")
    ps.add_argument(
        "--host", default="127.0.0.1", help="address to bind, IPv4 or IPv6 (default 127.0.0.1: this machine only)"
    )
    ps.add_argument("--port", type=_in_range(0, 65535), default=0, help="port to listen on (default 0: any free port)")
    auth = ps.add_mutually_exclusive_group(required=True)
    auth.add_argument("--token-file", type=Path, help="file holding the job's token; every call must carry it")
    auth.add_argument("--no-auth", action="store_true", help="accept calls without a token (trusted networks only)")
    ps.add_argument("--new-token", action="store_true", help="write a new token to --token-file (mode 600) first")
    ps.add_argument("--checkpoint-dir", type=Path, default=None, help="where Save writes and Restore reads")
    ps.add_argument("--keep", type=_in_range(1, None), default=5, help="complete checkpoints to keep (default 5)")
    ps.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS")
    ps.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    ps.add_argument("--tls-client-ca", type=Path, help="PEM CA: require client certificates it signed")
    ps.set_defaults(run=run)


def _in_range(low: int, high: int | None) -> Any:
    """An argparse type: an int in [low, high] (gRPC took port -1 as 65535 and 70000 as 4464; --keep 0 kept none)."""
    bounds = f"from {low} to {high}" if high is not None else f"{low} or more"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int {bounds}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an int {bounds}, got {text!r}")
        return value

    return parse


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; 2 on bad arguments."""
    try:
        token = _token(args)
        tls = _tls(args)
        server, port = create_server(
            host_port(args.host, args.port),
            token=token,
            tls=tls,
            checkpoint_dir=args.checkpoint_dir,
            keep_checkpoints=args.keep,
        )
    except (ParameterServerError, ValueError) as err:
        print(f"cellgraph ps: {err}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    parts = [
        f"token from {args.token_file}" if token is not None else "NO authentication",
        "TLS" + (" with client certificates" if args.tls_client_ca else "") if tls is not None else "no TLS",
        f"checkpoints in {args.checkpoint_dir}" if args.checkpoint_dir else "no checkpoint directory",
    ]
    print(f"cellgraph ps: serving on {host_port(args.host, port)} ({', '.join(parts)})", flush=True)
    serve_forever(server, stop)
    print("cellgraph ps: stopped", flush=True)
    return 0


def _token(args: argparse.Namespace) -> str | None:
    if args.no_auth:
        if args.new_token:
            raise ValueError("--new-token needs --token-file, not --no-auth")
        return None
    if args.new_token:
        token = new_token()
        try:
            write_token_file(args.token_file, token)
        except OSError as err:  # a folder there, a file on the path: a traceback before
            raise ValueError(f"--new-token: cannot write token file '{args.token_file}': {err.strerror}") from None
        return token
    return read_token_file(args.token_file)


def _tls(args: argparse.Namespace) -> ServerTLS | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    return ServerTLS.from_files(args.tls_cert, args.tls_key, args.tls_client_ca)
