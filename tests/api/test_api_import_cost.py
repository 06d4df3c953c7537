"""Importing pyfunc_bridge, in a fresh interpreter: the import is cheap,
names load lazily, the pool loads on first use, and a TensorFlow of another
version fails the import clearly."""
import json
import re
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import pyfunc_bridge as pfb


# --------------------------------------------------------------------------
# Import cost and version check (in a fresh interpreter).

_SUBPROCESS = textwrap.dedent("""
    import json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    # TensorFlow itself imports jax when it is installed (and cloudpickle):
    # only new imports count.
    already = {m for m in ("torch", "jax", "jaxlib", "cloudpickle") if m in sys.modules}
    POOL = ("pyfunc_bridge.pool.process_pool", "pyfunc_bridge.worker.start_worker",
            "pyfunc_bridge.pool.statistics", "pyfunc_bridge._pool",
            "pyfunc_bridge.pool.pickling", "cloudpickle")

    def state():
        with open("/proc/self/maps") as f:
            kernels = sorted({line.split()[-1] for line in f if "/_kernels." in line})
        return {
            "conversion": "pyfunc_bridge._conversion" in sys.modules,
            "kernels": kernels,
            "heavy": sorted(m for m in ("torch", "jax", "jaxlib")
                            if m in sys.modules and m not in already),
            "pool": sorted(m for m in POOL if m in sys.modules and m not in already),
        }

    real = tf.__version__
    tf.__version__ = "2.20.0"
    try:
        import pyfunc_bridge
        mismatch = None
    except ImportError as e:
        mismatch = str(e)
    tf.__version__ = real
    for name in [m for m in sys.modules if m.startswith("pyfunc_bridge")]:
        del sys.modules[name]

    # The op wrappers TF generates take 20-35 ms, four times the library's load.
    wrappers_made = []
    load_op_library = tf.load_op_library
    tf.load_op_library = lambda path: wrappers_made.append(path) or load_op_library(path)
    import pyfunc_bridge as pfb
    from tensorflow.python.framework import op_def_registry
    after_import = state()
    registered = op_def_registry.get("PyfuncBridge>PyFunction") is not None
    wrappers_at_import = len(wrappers_made)
    not_in_dir = [name for name in pfb.__all__ if name not in dir(pfb)]
    after_dir = state()
    y = pfb.numpy_function(lambda a: a + 1, [tf.constant(1.0)], tf.float32)
    after_use = state()
    wrappers_at_use = len(wrappers_made)
    stats = pfb.stats()  # (no pool used: the pools' statistics are not loaded for it)
    after_stats = state()
    import numpy as np
    with pfb.ProcessPool(1) as pool:
        z = pfb.numpy_function(np.negative, [tf.constant(1.0)], tf.float32, executor=pool)
    after_pool = state()
    print(json.dumps({"mismatch": mismatch, "after_import": after_import,
                      "not_in_dir": not_in_dir, "after_dir": after_dir,
                      "after_use": after_use, "value": float(y), "after_stats": after_stats,
                      "pools": list(stats.pools), "after_pool": after_pool,
                      "pool_value": float(z),
                      "registered": registered, "wrappers_at_import": wrappers_at_import,
                      "wrappers_at_use": wrappers_at_use}))
""")


@pytest.fixture(scope="module")
def fresh_interpreter():
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_is_cheap(fresh_interpreter):
    # The op library loads at import (graphs naming the ops must load), the
    # conversion layer and the frameworks on first use.
    state = fresh_interpreter["after_import"]
    assert state["conversion"] is False
    assert len(state["kernels"]) == 1
    assert state["heavy"] == []
    assert state["pool"] == []  # the process pool loads on first use (pfb.ProcessPool)


def test_import_registers_the_ops_and_makes_their_wrappers_on_first_use(fresh_interpreter):
    # A graph that names the ops loads after the import alone; the Python
    # wrappers wait for the first op built.
    assert fresh_interpreter["registered"] is True
    assert fresh_interpreter["wrappers_at_import"] == 0
    assert fresh_interpreter["wrappers_at_use"] == 1


def test_dir_lists_the_lazy_names_without_loading_them(fresh_interpreter):
    # (ProcessPool and the conversion API are module attributes made on first access.)
    assert fresh_interpreter["not_in_dir"] == []
    assert fresh_interpreter["after_dir"] == fresh_interpreter["after_import"]


def test_first_use_loads_the_libraries(fresh_interpreter):
    # The check above would be vacuous if the probes could not see the libraries.
    state = fresh_interpreter["after_use"]
    assert fresh_interpreter["value"] == 2.0
    assert state["conversion"] is True
    assert len(state["kernels"]) == 1
    assert state["heavy"] == []
    # In-process calls and the statistics need no pool module.
    assert state["pool"] == [] and fresh_interpreter["after_stats"]["pool"] == []
    assert fresh_interpreter["pools"] == []


def test_a_pool_loads_its_modules_on_first_use(fresh_interpreter):
    state = fresh_interpreter["after_pool"]
    assert fresh_interpreter["pool_value"] == -1.0
    # (cloudpickle counts where TensorFlow did not import it already.)
    assert {"pyfunc_bridge.pool.process_pool", "pyfunc_bridge.worker.start_worker",
            "pyfunc_bridge.pool.statistics", "pyfunc_bridge._pool",
            "pyfunc_bridge.pool.pickling"} <= set(state["pool"])


def test_import_with_mismatched_tf_fails(fresh_interpreter):
    from pyfunc_bridge._build_config import TF_VERSION
    msg = fresh_interpreter["mismatch"]
    assert msg is not None
    assert "2.20.0" in msg and TF_VERSION in msg


def test_check_tensorflow_version(monkeypatch):
    from pyfunc_bridge._build_config import TF_VERSION
    pfb._library.check_tensorflow_version()  # the installed one passes
    monkeypatch.setattr(tf, "__version__", "2.20.0")
    with pytest.raises(ImportError) as info:
        pfb._library.check_tensorflow_version()
    msg = str(info.value)
    assert "2.20.0" in msg and TF_VERSION in msg
    assert "built for TensorFlow" in msg


@pytest.mark.parametrize("version", ["3.21.0", "2.2.0", "2.210.0"])
def test_check_tensorflow_version_compares_major_minor(monkeypatch, version):
    from pyfunc_bridge._build_config import TF_VERSION
    major, minor = TF_VERSION.split(".")[:2]
    monkeypatch.setattr(tf, "__version__", f"{major}.{minor}.99")
    pfb._library.check_tensorflow_version()  # a patch release is compatible
    monkeypatch.setattr(tf, "__version__", version)
    with pytest.raises(ImportError, match=re.escape(version)):
        pfb._library.check_tensorflow_version()
