"""Hangs (in a subprocess, then) where the reader thread dies on the reply.

Run by tests/pool/test_process_pool_errors.py in a fresh interpreter
(tests/fresh_python.py)."""
import tensorflow as tf, pyfunc_bridge as pfb
import process_functions as pf
with pfb.ProcessPool(1, name="unloadable pool") as pool:
    try:
        pfb.numpy_function(pf.returns_what_does_not_load, [tf.constant(1)], tf.int32,
                           executor=pool)
    except tf.errors.UnknownError as exc:
        message = str(exc)
    else:
        raise AssertionError("no error")
    assert "of unloadable pool sent a reply this process cannot unpickle" in message, message
    assert "RuntimeError: this value does not load in the parent" in message, message
    assert int(pfb.numpy_function(pf.double, [tf.constant(2)], tf.int32, executor=pool)) == 4
print("done")
