"""``cellgraph install-kernel``: a Jupyter kernelspec, "Python 3 (cellgraph)", whose kernel loads the extension at start.

The kernel is ipykernel's, run by this Python (where cellgraph is installed),
with ``--ext=cellgraph``: IPython's ``InteractiveShellApp.extra_extensions``,
which adds to any extensions the user's own configuration loads instead of
replacing them.
"""

from __future__ import annotations

import platform
import re
import shutil
from pathlib import Path

DEFAULT_NAME = "cellgraph"
DEFAULT_DISPLAY_NAME = "Python 3 (cellgraph)"
EXTENSION_ARGUMENT = "--ext=cellgraph"
# Jupyter's rule for kernel names (jupyter_client.kernelspec); checked here to say it before anything is written.
_NAME = re.compile(r"^[a-z0-9._-]+$", re.IGNORECASE)


class KernelspecError(ValueError):
    """A kernelspec that cannot be installed as asked: a bad name, or both ``user`` and ``prefix``."""


def install(
    name: str = DEFAULT_NAME,
    display_name: str = DEFAULT_DISPLAY_NAME,
    user: bool = False,
    prefix: str | Path | None = None,
) -> Path:
    """Install the kernelspec; return the folder it was written to.

    Parameters
    ----------
    name
        The kernelspec's name (letters, digits, ``.``, ``_``, ``-``); ``jupyter kernelspec list`` shows it.
    display_name
        What the notebook's kernel picker shows.
    user
        Into the user's Jupyter data folder (``~/.local/share/jupyter``) rather than the system's.
    prefix
        Into ``PREFIX/share/jupyter/kernels`` (e.g. a virtual environment's ``sys.prefix``).

    Raises ``KernelspecError`` for a bad name or both ``user`` and ``prefix``,
    ``OSError`` when the folder cannot be written.

    Examples
    --------
    >>> from cellgraph.kernel_ext.kernelspec import install
    >>> install(user=True)  # doctest: +SKIP
    PosixPath('/home/me/.local/share/jupyter/kernels/cellgraph')
    """
    if not _NAME.match(name):
        raise KernelspecError(
            f"kernel name {name!r} is not allowed: use letters, digits, '.', '_' and '-' only (e.g. cellgraph)"
        )
    if user and prefix is not None:
        raise KernelspecError("give --user or --prefix, not both: --user installs for you, --prefix under PREFIX")
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager

    # As ipykernel's own install does on CPython: frozen modules make its debugger warn at every start.
    python_arguments = ["-Xfrozen_modules=off"] if platform.python_implementation() == "CPython" else None
    staged = Path(
        write_kernel_spec(
            overrides={"display_name": display_name},
            extra_arguments=[EXTENSION_ARGUMENT],
            python_arguments=python_arguments,
        )
    )
    try:
        destination = KernelSpecManager().install_kernel_spec(
            str(staged), kernel_name=name, user=user, prefix=None if prefix is None else str(prefix)
        )
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)  # the temporary folder write_kernel_spec made
    return Path(destination)
