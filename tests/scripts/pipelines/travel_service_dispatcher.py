"""A tf.data service dispatcher: prints its port as JSON, then, once two
workers are registered (or two minutes passed), how many are, so the job
reaches both; serves until killed.

Started by travel_service_driver.py (tests/pipelines/test_travel_service.py)
in a private network namespace."""
import json, time
import tensorflow as tf

service = tf.data.experimental.service
dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
print(json.dumps({"port": int(dispatcher.target.rsplit(":", 1)[1])}), flush=True)
# Reports when both workers are registered, so the job reaches both.
deadline = time.monotonic() + 120
while dispatcher._num_workers() < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"workers": dispatcher._num_workers()}), flush=True)
dispatcher.join()
