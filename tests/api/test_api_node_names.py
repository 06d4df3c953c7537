"""Graph nodes get default names that TensorFlow's error interpolation
parses: errors then say where the op was defined, and cost what TF's cost."""
import functools
import os
import re
import time

import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import API_PAIRS, error_of, py_function_gradient, raising


def _graph_nodes(fn, *args):
    graph = tf.function(fn).get_concrete_function(*args).graph
    nodes = list(graph.get_operations())
    for function in graph._functions.values():  # gradient and loop bodies
        nodes.extend(function.graph.get_operations())
    return [(op.type, op.name) for op in nodes if op.type.startswith("PyfuncBridge>")]


def test_default_node_names_are_names_tensorflow_errors_can_tag():
    x = tf.constant([1.0, 2.0])

    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pfb.py_function(lambda a: a * a, [x], tf.float32)
        a = pfb.numpy_function(lambda a: a, [x], tf.float32)
        b = pfb.numpy_function(lambda a: a, [x], tf.float32, stateful=False)
        c = pfb.py_func(lambda a: a, [x], tf.float32)
        d = pfb.array_function(lambda a: a, [x], tf.float32, framework="numpy")
        return tape.gradient(y, x), a, b, c, d

    nodes = _graph_nodes(fn, x)
    expected = {
        "PyfuncBridge>PyFunction": {"PyFunction"},
        "PyfuncBridge>PyFunctionGrad": {"PyFunctionGrad"},
        "PyfuncBridge>NumpyFunction": {"NumpyFunction", "ArrayFunction"},
        "PyfuncBridge>NumpyFunctionStateless": {"NumpyFunction"},
    }
    assert len(nodes) == 6, nodes
    for op_type, name in nodes:
        base = re.sub(r"_[0-9]+$", "", name.rsplit("/", 1)[-1])  # unique_name's suffix
        assert base in expected[op_type], (op_type, name)


def test_a_name_given_by_the_caller_is_kept():
    x = tf.constant([1.0])
    nodes = _graph_nodes(lambda x: pfb.numpy_function(lambda a: a, [x], tf.float32,
                                                      name="mine"), x)
    assert [name for _, name in nodes] == ["mine"]


@pytest.mark.parametrize("op", sorted(API_PAIRS))
def test_graph_errors_name_the_node_where_it_was_defined(op):
    ours, theirs = API_PAIRS[op]
    for api in (ours, theirs):
        err = error_of(api, raising(ValueError("marker")), "graph")
        assert type(err) is tf.errors.InvalidArgumentError
        assert "Detected at node" in err.message, err.message[:500]
        assert "defined at (most recent call last)" in err.message
        assert "marker" in err.message


def test_the_gradient_op_is_tagged_in_errors():
    @tf.custom_gradient
    def broken(a):
        def grad(dy):
            raise ValueError("gradient marker")
        return a * 1, grad

    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        py_function_gradient(broken)(tf.constant([1.0]))
    assert "Detected at node" in info.value.message
    assert "gradient marker" in info.value.message
    assert "PyFunctionGrad" in info.value.message


@pytest.mark.parametrize("op", ["numpy_function", "py_function"])
def test_a_long_graph_error_costs_about_what_tensorflows_costs(op):
    ours, theirs = API_PAIRS[op]
    message = " ".join(["long message"] * 3100)  # 40k characters
    x = tf.constant([1.0])
    seconds = {}
    for label, api in (("theirs", theirs), ("ours", ours)):
        @tf.function
        def fn(x, api=api):
            return api(raising(ValueError(message)), [x], tf.float32)

        with pytest.raises(tf.errors.InvalidArgumentError):
            fn(x)  # traced here
        start = time.perf_counter()
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            fn(x)
        seconds[label] = time.perf_counter() - start
        assert message in info.value.message
        assert "Detected at node" in info.value.message
    # A loose guard: before, 40k characters took 27 s against TF's 0.1 s.
    assert seconds["ours"] < 10 * seconds["theirs"] + 1.0, seconds


PACKAGE_DIR = os.path.dirname(pfb.__file__)
# API_PAIRS with array_function as a partial: a lambda would add a frame of
# its own to the stacks compared here.
FRAME_PAIRS = {**API_PAIRS, "array_function": (
    functools.partial(pfb.array_function, framework="numpy"), tf.numpy_function)}


def _frames(message, header):
    """(file name, line, function) of each frame listed after `header` in a
    TF error message (TF writes the paths shortened by their common prefix)."""
    lines = message.split(header, 1)[1].splitlines()[1:]
    frames = []
    for line in lines:
        match = re.match(r'\s*File "(.*)", line (\d+), in (.*)', line)
        if match is None:
            if line.strip():
                break
            continue
        frames.append((os.path.basename(match[1]), int(match[2]), match[3]))
    return frames


def _xla_error(api):
    @tf.function(jit_compile=True)
    def fn(x):
        return api(lambda a: a, [x], tf.float32)  # both APIs' ops are built here
    with pytest.raises(tf.errors.OpError) as info:
        fn(tf.constant([1.0]))
    return info.value


@pytest.mark.parametrize("op", sorted(FRAME_PAIRS))
def test_xla_errors_show_the_users_frames_as_tensorflows(op):
    """An op XLA cannot compile (TF's never; ours when an output declares no
    shape) is named with where it was created, and that stack ends at the
    user's line, as TF's does."""
    ours, theirs = (_xla_error(api) for api in FRAME_PAIRS[op])
    assert type(ours) is type(theirs) is tf.errors.InvalidArgumentError
    assert "Tout=tf.TensorSpec(shape, dtype)" in ours.message
    got = _frames(ours.message, "Stack trace for op definition:")
    want = _frames(theirs.message, "The op is created at:")
    assert got[-1] == want[-1]
    assert got[-1][0] == os.path.basename(__file__) and got[-1][2] == "fn"
    assert "pyfunc_bridge" not in ours.message.split("Stack trace for op definition:", 1)[1]
    assert "<string>" not in ours.message


@pytest.mark.parametrize("op", sorted(FRAME_PAIRS))
def test_graph_errors_show_the_users_frames_as_tensorflows(op):
    ours, theirs = (error_of(api, raising(ValueError("marker")), "graph")
                    for api in FRAME_PAIRS[op])
    header = "defined at (most recent call last):"
    got, want = _frames(ours.message, header), _frames(theirs.message, header)
    assert got == want
    assert got[-1][2] == "call"  # conftest.error_of's line that builds the op


def test_the_gradient_op_records_no_frame_of_the_package():
    graph = py_function_gradient(lambda a: a * a).get_concrete_function(
        tf.constant([1.0])).graph
    ops = [op for function in graph._functions.values()
           for op in function.graph.get_operations()] + graph.get_operations()
    (grad,) = [op for op in ops if op.type == "PyfuncBridge>PyFunctionGrad"]
    files = [frame.filename for frame in grad.traceback]
    assert files and not [f for f in files if f.startswith(PACKAGE_DIR) or f == "<string>"]
