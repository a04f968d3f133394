"""The schema of everything that crosses a process boundary: ``*.proto`` and their generated modules.

``tensor.proto`` (dtypes, shapes, tensors and tensor chunks) and ``graph.proto``
(the ``GraphDef``) are the only schema; ``*_pb2.py`` / ``*_pb2.pyi`` (and
``*_pb2_grpc.py`` for a .proto with a service) are generated from them by
``python protos/generate.py``, never edited by hand. CI runs
``python protos/generate.py --check``.
"""
