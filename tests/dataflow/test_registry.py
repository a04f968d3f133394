from __future__ import annotations

import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import OPS
from cellgraph.dataflow.registry import Registry


def test_duplicate_registration_names_the_earlier_file_and_line() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1)  # the line the error must point at
    with pytest.raises(cg.RegistryError, match=r"widget 'a' is already registered \(at .*test_registry.py:\d+\)"):
        reg.register("a", 2)
    assert reg.lookup("a") == 1


def test_miss_lists_what_is_known() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("b", 1)
    reg.register("a", 2)
    with pytest.raises(cg.RegistryError, match=r"no widget named 'c'; known: a, b"):
        reg.lookup("c")


def test_op_registry_rejects_a_second_matmul() -> None:
    with pytest.raises(cg.RegistryError, match=r"op 'MatMul' is already registered \(at .*math.py:\d+\)"):
        OPS.register("MatMul", OPS.lookup("MatMul"))


def test_unknown_op_lists_known_ops() -> None:
    with pytest.raises(cg.RegistryError, match=r"no op named 'MatMull'; known: .*MatMul"):
        OPS.lookup("MatMull")
