"""Loads and runs what travel_saved_model_save.py saved in the folder
argv[1], as argv[2] says: "declared" (imports the declaring module, trusts
pickles half-way through) or "bare" (neither); prints the outcomes as JSON.

Run by tests/pipelines/test_travel_saved_model.py (tests/fresh_python.py),
with tests/ and tests/pipelines/ on the path."""
import json, pathlib, sys
import tensorflow as tf
import pyfunc_bridge as pfb

out = pathlib.Path(sys.argv[1])
how = sys.argv[2]
x = tf.constant([1.0, 2.0, 3.0])

def run(name):
    try:
        value = tf.saved_model.load(str(out / name)).f(x)
    except tf.errors.OpError as e:
        return {"error": e.message, "type": type(e).__name__}
    return {"ok": tf.nest.map_structure(lambda t: t.numpy().tolist(), value)}

def markers():
    return sorted(p.name for p in out.iterdir()
                  if p.name.startswith(("ran-", "unpickled-")))

if how == "declared":
    # Imports the declaring module; trusts pickles only half-way through
    # (argv[3]: what the save printed).
    import travel_functions  # noqa: F401  (declares the saved functions)
    res = {"numpy": run("numpy"), "py_gradient": run("py_gradient")}
    loaded = tf.saved_model.load(str(out / "py"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = loaded.f(x)
    res["outer_gradient"] = tape.gradient(y, x).numpy().tolist()
    if json.loads(sys.argv[3])["torch"]:
        res["torch"] = run("torch")
    res["undeclared"] = run("undeclared")
    res["os_system"] = run("os_system")
    res["untrusted"] = run("pickled_a")
    res["markers_untrusted"] = markers()
    pfb.trust_pickled(True)
    res["trusted"] = run("pickled_a")
    res["markers_trusted"] = markers()
    print(json.dumps(res))
else:  # "bare": does not import the declaring module; trusts pickles
    # through the environment.
    res = {"numpy": run("numpy"), "pickled": run("pickled_b")}
    res["imported"] = "travel_functions" in sys.modules
    print(json.dumps(res))
