"""How a graph, a cluster or a job shows itself in Jupyter: a hook the layer above installs.

The IR and the cluster layer know nothing of widgets. Their objects'
``_repr_mimebundle_`` ask ``bundle(kind, ...)``, and what makes the bundle
for a kind (a widget in a kernel, a text summary elsewhere) is registered from
above: the ``cellgraph`` package, which sits over every layer, registers the
widget side's functions (``cellgraph.widgets.reprs``) by name, to be imported
on the first display only, so that ``import cellgraph`` stays free of the
widget stack. A kind with nothing registered shows as its object's ``repr``.

Examples
--------
>>> class Thing:
...     def __repr__(self):
...         return "<Thing>"
>>> bundle("example-kind", Thing(), None, None)  # nothing registered: the plain repr
{'text/plain': '<Thing>'}
>>> register("example-kind", lambda: lambda obj, include, exclude: {"text/plain": f"shown: {obj!r}"})
>>> bundle("example-kind", Thing(), None, None)
{'text/plain': 'shown: <Thing>'}
>>> unregister("example-kind")
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# Makes the MIME bundle of one object: (the object, include, exclude) -> {mime type: data}, as IPython asks.
Bundler = Callable[[Any, Any, Any], dict[str, Any]]

_lock = threading.Lock()
_loaders: dict[str, Callable[[], Bundler]] = {}  # by kind: returns the bundler (importing it on first use)
_bundlers: dict[str, Bundler] = {}  # the bundlers loaded so far


def register(kind: str, loader: Callable[[], Bundler]) -> None:
    """Show objects of ``kind`` with the bundler ``loader()`` returns, called on the first display of that kind."""
    with _lock:
        _loaders[kind] = loader
        _bundlers.pop(kind, None)


def unregister(kind: str) -> None:
    """Show objects of ``kind`` as their plain ``repr`` again."""
    with _lock:
        _loaders.pop(kind, None)
        _bundlers.pop(kind, None)


def bundle(kind: str, obj: object, include: Any, exclude: Any) -> dict[str, Any]:
    """``obj``'s MIME bundle, made by what is registered for ``kind``; its ``repr`` when nothing is."""
    with _lock:
        bundler = _bundlers.get(kind)
        loader = _loaders.get(kind) if bundler is None else None
    if bundler is None:
        if loader is None:
            return {"text/plain": repr(obj)}
        bundler = loader()  # outside the lock: it may import a module, which may display nothing but takes time
        with _lock:
            if _loaders.get(kind) is loader:
                _bundlers[kind] = bundler
    return bundler(obj, include, exclude)


__all__ = ["Bundler", "bundle", "register", "unregister"]
