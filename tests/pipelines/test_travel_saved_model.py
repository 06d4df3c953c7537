"""Functions that travel in SavedModels: saved in one process, loaded and
run in fresh ones (declared functions, pickles and trust, autograph), and
the import that registers the ops, cheaply.  Fresh interpreters run the
scripts tests/scripts/pipelines/travel_saved_model_*.py; they import
tests/travel_functions.py by name."""
import json

import numpy as np
import pytest

from travel_helpers import X, fresh_env, run_python


# SavedModel: saved in one process, loaded in fresh ones.

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("saved")
    info = run_python("pipelines/travel_saved_model_save.py", out)
    return out, info


@pytest.fixture(scope="module")
def loaded(saved):
    out, info = saved
    marker = out / "ran-undeclared"
    return run_python("pipelines/travel_saved_model_load.py", out, "declared", json.dumps(info),
                      env=fresh_env(PFB_TEST_MARKER=str(marker)))


@pytest.fixture(scope="module")
def loaded_bare(saved):
    out, _ = saved
    return run_python("pipelines/travel_saved_model_load.py", out, "bare",
                      env=fresh_env(PFB_TRUST_PICKLED="1"))


def test_saved_numpy_function_runs_in_a_fresh_process(loaded):
    assert loaded["numpy"] == {"ok": (X * 2).tolist()}


def test_saved_py_function_gradient_in_a_fresh_process(loaded):
    # d(x**3)/dx = 3 x**2, computed inside the saved function ...
    y, grad = loaded["py_gradient"]["ok"]
    np.testing.assert_allclose(y, X ** 3)
    np.testing.assert_allclose(grad, 3 * X ** 2)
    # ... and by a tape around the loaded one.
    np.testing.assert_allclose(loaded["outer_gradient"], 3 * X ** 2)


def test_saved_array_function_converts_as_torch(saved, loaded):
    if not saved[1]["torch"]:
        pytest.skip("torch is not installed")
    # travel_functions.torch_softplus raises unless it receives torch tensors.
    np.testing.assert_allclose(loaded["torch"]["ok"], np.log1p(np.exp(X)), rtol=1e-6)


def test_module_not_imported_names_it(loaded_bare):
    error = loaded_bare["numpy"]["error"]
    assert "travel_functions:times2" in error
    assert "import travel_functions" in error
    assert loaded_bare["imported"] is False  # pfb imported nothing


def test_undeclared_function_is_refused_and_never_runs(saved, loaded):
    error = loaded["undeclared"]["error"]
    assert "travel_functions:undeclared_writer" in error
    assert "@pfb.portable" in error
    assert "ran-undeclared" not in loaded["markers_trusted"]


def test_os_system_is_refused(loaded):
    error = loaded["os_system"]["error"]
    assert "'os:system'" in error and "did not declare" in error


def test_untrusted_pickle_is_refused_and_never_unpickled(loaded):
    error = loaded["untrusted"]["error"]
    assert "arbitrary code" in error
    assert "pfb.trust_pickled(True)" in error and "PFB_TRUST_PICKLED=1" in error
    assert loaded["markers_untrusted"] == []


def test_trusted_pickle_runs(loaded):
    assert loaded["trusted"] == {"ok": (X + 1000).tolist()}
    assert loaded["markers_trusted"] == ["ran-a", "unpickled-a"]


def test_trust_from_the_environment(loaded_bare):
    assert loaded_bare["pickled"] == {"ok": (X + 1000).tolist()}


def test_an_autograph_converted_lambda_travels_as_written(tmp_path):
    """The SavedModel embeds the lambda as written: the converted one names
    autograph's internals (ag__.converted_call), which fail where it is
    loaded, even with TensorFlow there."""
    saved = run_python("pipelines/travel_saved_model_autograph_save.py", tmp_path / "model")
    assert saved == {"converted": True}
    loaded = run_python("pipelines/travel_saved_model_autograph_load.py", tmp_path / "model")
    assert "error" not in loaded, loaded["error"]
    np.testing.assert_allclose(loaded["ok"], [1.5, 2.5, 3.5])


# Import registers the ops, cheaply.

def test_import_registers_the_ops_under_100_ms():
    runs = []
    for _ in range(3):  # best of a few: the machine is shared
        runs.append(run_python("pipelines/travel_saved_model_import_cost.py"))
        if runs[-1]["ms"] < 100:
            break
    result = min(runs, key=lambda r: r["ms"])
    assert result["registered"] == [True] * 4
    assert result["conversion"] is False
    assert result["ms"] < 100, [r["ms"] for r in runs]
