"""Reads an endless pipeline whose function sleeps from the tf.data service
at argv[1], so the workers' threads are in bridge calls; prints
{"read": 2000} as JSON after 2000 elements and reads on until killed.

Started by travel_service_launcher_driver.py
(tests/pipelines/test_travel_service.py) in a private network namespace."""
import json, sys, time
import tensorflow as tf
import pyfunc_bridge as pfb


def slow(a):  # the workers' threads spend their time in bridge calls
    time.sleep(0.001)
    return a


ds = tf.data.Dataset.range(10**12).map(
    lambda i: pfb.numpy_function(slow, [i], tf.int64, portable=True),
    num_parallel_calls=4)
ds = ds.apply(tf.data.experimental.service.distribute(
    processing_mode="parallel_epochs", service=sys.argv[1]))
for n, _ in enumerate(ds):
    if n == 2000:
        print(json.dumps({"read": n}), flush=True)
