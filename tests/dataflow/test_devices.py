"""Device names: parsing, validation, merging, and nested ``cg.device`` scopes."""

from __future__ import annotations

import pytest

import cellgraph as cg
from cellgraph.dataflow.devices import DeviceSpec, canonical, merge

from .errors_helpers import raises

EXPECTED = "expected /job:<name>/task:<i>/device:<cpu|gpu>:<k> (every part optional, e.g. '/device:gpu:0' or '/job:ps')"


@pytest.mark.parametrize(
    ("text", "spec", "written"),
    [
        ("/job:worker/task:0/device:gpu:1", DeviceSpec("worker", 0, "gpu", 1), "/job:worker/task:0/device:gpu:1"),
        ("/job:ps/task:12/device:cpu:0",    DeviceSpec("ps", 12, "cpu", 0),    "/job:ps/task:12/device:cpu:0"),
        ("/device:gpu:0",                   DeviceSpec(None, None, "gpu", 0),  "/device:gpu:0"),
        ("/device:cpu",                     DeviceSpec(None, None, "cpu"),     "/device:cpu"),
        ("/job:ps",                         DeviceSpec("ps"),                  "/job:ps"),
        ("/job:worker/task:1",              DeviceSpec("worker", 1),           "/job:worker/task:1"),
        ("/task:3",                         DeviceSpec(None, 3),               "/task:3"),
        ("/job:worker/device:GPU:2",        DeviceSpec("worker", None, "gpu", 2), "/job:worker/device:gpu:2"),
        ("/gpu:0",                          DeviceSpec(None, None, "gpu", 0),  "/device:gpu:0"),  # TF's short form
        ("",                                DeviceSpec(),                      ""),
    ],
)  # fmt: skip
def test_device_names_parse_and_write_back_canonically(text: str, spec: DeviceSpec, written: str) -> None:
    assert DeviceSpec.parse(text) == spec
    assert str(spec) == written == canonical(text)
    assert DeviceSpec.parse(written) == spec


def test_full_names_and_matching() -> None:
    full = DeviceSpec.parse("/job:worker/task:0/device:gpu:0")
    assert full.is_full and not DeviceSpec.parse("/job:worker").is_full
    assert DeviceSpec.parse("/job:worker/device:gpu").matches(full)
    assert not DeviceSpec.parse("/job:ps").matches(full)
    assert DeviceSpec().matches(full)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("job:ps",                      "it must start with '/'"),
        ("/job:ps/",                    "'' is not a job, task or device part"),
        ("/job:ps/task:x",              "'task:x' is not a job, task or device part"),
        ("/device:tpu:0",               "'device:tpu:0' is not a job, task or device part"),
        ("/job:ps/task:-1",             "'task:-1' is not a job, task or device part"),
        ("/job:1ps",                    "'job:1ps' is not a job, task or device part"),
        ("/job:a/job:b",                "'job:b' repeats or comes after a later part"),
        ("/device:cpu:0/task:1",        "'task:1' repeats or comes after a later part"),
        ("/job:ps/device:cpu:0/gpu:0",  "'gpu:0' repeats or comes after a later part"),
    ],
)  # fmt: skip
def test_a_malformed_name_shows_the_bad_string_and_the_expected_form(text: str, why: str) -> None:
    with raises(cg.PlacementError, f"malformed device name {text!r}: {why}; {EXPECTED}"):
        DeviceSpec.parse(text)


def test_other_bad_specs() -> None:
    with raises(cg.PlacementError, f"a device name must be a string, got int; {EXPECTED}"):
        DeviceSpec.parse(0)  # type: ignore[arg-type]
    with raises(cg.PlacementError, "device type 'tpu' is not one of cpu, gpu"):
        DeviceSpec(device_type="tpu")
    with raises(cg.PlacementError, f"device index 0 needs a device type; {EXPECTED}"):
        DeviceSpec(index=0)


def test_placement_error_is_a_cellgraph_value_error() -> None:
    assert issubclass(cg.PlacementError, cg.CellgraphError)
    assert issubclass(cg.PlacementError, ValueError)
    assert cg.DeviceSpec is DeviceSpec


@pytest.mark.parametrize(
    ("outer", "inner", "merged"),
    [
        ("/job:worker/task:1",           "/device:gpu:0",   "/job:worker/task:1/device:gpu:0"),
        ("/job:worker/task:1/device:cpu:0", "/job:ps",      "/job:ps/task:1/device:cpu:0"),
        ("/device:gpu:1",                "/device:cpu",     "/device:cpu:1"),  # field by field, as TensorFlow
        ("",                             "/job:ps/task:0",  "/job:ps/task:0"),
        ("/job:ps/task:0",               "",                "/job:ps/task:0"),
    ],
)  # fmt: skip
def test_merge_inner_parts_win_missing_ones_come_from_outside(outer: str, inner: str, merged: str) -> None:
    assert str(merge(DeviceSpec.parse(outer), DeviceSpec.parse(inner))) == merged


def test_nested_device_scopes_merge(fresh_graph: cg.Graph) -> None:
    x = cg.placeholder((2,), name="x")
    with cg.device("/job:worker/task:1"):
        a = x * 2.0
        with cg.device("/device:GPU:0"):
            b = x * 3.0
            with cg.device("/job:ps"):
                c = x * 4.0
            with cg.device(None):  # clears the enclosing scopes
                d = x * 5.0
        e = x * 6.0
    assert x.node.device == ""
    assert a.node.device == "/job:worker/task:1"
    assert b.node.device == "/job:worker/task:1/device:gpu:0"
    assert c.node.device == "/job:ps/task:1/device:gpu:0"
    assert d.node.device == ""
    assert e.node.device == "/job:worker/task:1"


def test_a_device_scope_is_validated_when_entered(fresh_graph: cg.Graph) -> None:
    x = cg.placeholder((2,), name="x")
    with cg.device("/job:worker"):
        with raises(cg.PlacementError, f"malformed device name 'gpu:0': it must start with '/'; {EXPECTED}"):
            with cg.device("gpu:0"):
                pass
        y = x * 2.0  # the failed scope left the stack as it was
    assert y.node.device == "/job:worker"
    with cg.device(DeviceSpec("ps", 0)):
        z = x * 2.0
    assert z.node.device == "/job:ps/task:0"
