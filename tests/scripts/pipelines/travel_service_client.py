"""Reads a pipeline of declared, portable and pid-reporting functions from
the tf.data service at argv[1] in the processing mode argv[2]; prints the
(value, worker pid) pairs as JSON.

Started by the drivers of tests/pipelines/test_travel_service.py
(travel_service_driver.py, travel_service_launcher_driver.py) in a private
network namespace."""
import json, sys
import tensorflow as tf
import pyfunc_bridge as pfb
import travel_functions as tfn

offset = 1000

ds = tf.data.Dataset.range(20)
ds = ds.map(lambda i: pfb.numpy_function(tfn.affine, [i], tf.int64),
            num_parallel_calls=4)
ds = ds.map(lambda v: pfb.numpy_function(lambda a: a + offset, [v], tf.int64,
                                         portable=True), num_parallel_calls=4)
ds = ds.map(lambda v: (v, pfb.numpy_function(tfn.worker_pid, [v], tf.int64)))
ds = ds.apply(tf.data.experimental.service.distribute(
    processing_mode=sys.argv[2], service=sys.argv[1]))
print(json.dumps([[int(v), int(pid)] for v, pid in ds]))
