"""TF's own tf.data service dispatcher, without pyfunc_bridge imported:
prints its port as JSON; serves until killed.

Started by travel_service_launcher_driver.py
(tests/pipelines/test_travel_service.py) in a private network namespace."""
import json
import tensorflow as tf

service = tf.data.experimental.service
dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
print(json.dumps({"port": int(dispatcher.target.rsplit(":", 1)[1])}), flush=True)
dispatcher.join()
