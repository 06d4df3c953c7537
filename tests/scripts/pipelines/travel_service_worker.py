"""A tf.data service worker of the dispatcher at argv[1], with pyfunc_bridge
and the declared functions imported: prints its pid as JSON; serves until
killed.

Started by travel_service_driver.py (tests/pipelines/test_travel_service.py)
in a private network namespace."""
import json, os, sys
import tensorflow as tf
import pyfunc_bridge  # noqa: F401  (registers the ops)
import travel_functions  # noqa: F401  (declares the functions the pipeline names)

service = tf.data.experimental.service
worker = service.WorkerServer(service.WorkerConfig(
    dispatcher_address=sys.argv[1], worker_address="127.0.0.1:%port%", port=0))
print(json.dumps({"pid": os.getpid()}), flush=True)
worker.join()
