"""The suite's own placement rule (tests/conftest.py): where TF has a GPU,
tests not marked `gpu` run on the CPU, graphs and Sessions included.  Runs
where pinning is on: on a GPU machine, or with PFB_PIN_CPU=1."""
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from conftest import _PIN

pytestmark = pytest.mark.skipif(not _PIN, reason="pinning is on with a GPU or PFB_PIN_CPU=1")

_ARGS = ("Placeholder", "NoOp")


def test_a_graph_made_in_a_test_and_its_session_run_on_the_cpu():
    with tf.Graph().as_default() as graph:
        y = pfb.numpy_function(lambda a: a + 1, [tf.constant([1.0, 2.0])], tf.float32)
        z = tf.matmul(tf.reshape(y, [1, 2]), tf.reshape(y, [2, 1]))
        with tf.compat.v1.Session() as session:
            assert session.run(z)[0][0] == 13.0
    assert [op.device for op in graph.get_operations()
            if "CPU" not in op.device] == []


def test_a_traced_function_runs_on_the_cpu():
    @tf.function
    def double(x):
        return pfb.py_function(lambda a: a * 2, [x], tf.float32)

    graph = double.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
    assert double(tf.constant(2.0)).numpy() == 4.0
    assert [op.device for op in graph.get_operations()
            if op.type not in _ARGS and "CPU" not in op.device] == []


@pytest.mark.gpu
def test_a_test_marked_gpu_is_not_pinned():
    with tf.Graph().as_default() as graph:
        tf.constant(1.0)
    assert [op.device for op in graph.get_operations()] == [""]
