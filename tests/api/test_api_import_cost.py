"""Importing pyfunc_bridge, in a fresh interpreter: the import is cheap,
names load lazily, the pool loads on first use, and a TensorFlow of another
version fails the import clearly."""
import json
import re

import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
from fresh_python import fresh_python


# --------------------------------------------------------------------------
# Import cost and version check (in a fresh interpreter).

_SUBPROCESS = "api/import_cost.py"


@pytest.fixture(scope="module")
def fresh_interpreter():
    proc = fresh_python(_SUBPROCESS, timeout=120)
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
