"""Real pipeline code, written for TensorFlow's functions, run unchanged with
pfb's in every mode and through a pool, with TensorFlow as the oracle:
augmentation that normalises and flips in place, a tokenizer that returns
np.array(ids), PIL decoding, try/except around eager calls, float64 noise for
a float32 py_function, and tf.data's legacy map function."""
import io

import numpy as np
import pytest
import tensorflow as tf

import pyfunc_bridge as pfb
import real_code_functions as rc

PIL = pytest.importorskip("PIL.Image")

IMAGES = np.random.default_rng(0).integers(0, 255, (4, 5, 6, 3)).astype(np.float32)
TEXTS = [b"the cat sat on the mat", b"the mat", b"a cat", b"on on on"]


@pytest.fixture(scope="module")
def pool():
    with pfb.ProcessPool(2, name="real code") as shared:
        yield shared


def _pngs():
    out = []
    for img in IMAGES.astype(np.uint8):
        buf = io.BytesIO()
        PIL.fromarray(img).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def _apis(pool):
    """name -> numpy_function-like callable: TF's, pfb's in-process, pfb's in a pool."""
    return {"tf": tf.numpy_function, "pfb": pfb.numpy_function,
            "pool": lambda f, inp, tout: pfb.numpy_function(f, inp, tout, executor=pool)}


def _all_modes(api, func, values, tout):
    """The function over `values` eagerly, in a tf.function, and in tf.data."""
    eager = [api(func, [v], tout).numpy() for v in values]
    graph_fn = tf.function(lambda v: api(func, [v], tout))
    graph = [graph_fn(v).numpy() for v in values]
    data = list(tf.data.Dataset.from_tensor_slices(values).map(
        lambda v: api(func, [v], tout), num_parallel_calls=2).as_numpy_iterator())
    return eager, graph, data


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("func", [rc.normalize, rc.flip_in_place], ids=lambda f: f.__name__)
def test_in_place_augmentation(pool, func):
    apis = _apis(pool)
    want = [func(np.array(img)) for img in IMAGES]
    for name in ("pfb", "pool"):
        source = tf.constant(IMAGES)
        for got in _all_modes(apis[name], func, source, tf.float32):
            _assert_same(got, want)
        np.testing.assert_array_equal(source.numpy(), IMAGES)  # never written


def test_in_place_shuffle_of_token_ids(pool):
    ids = np.arange(20, dtype=np.int64).reshape(4, 5)
    for name, api in _apis(pool).items():
        ds = tf.data.Dataset.from_tensor_slices((ids, np.arange(4))).map(
            lambda x, s: api(rc.shuffle_tokens, [x, s], tf.int64))
        got = list(ds.as_numpy_iterator())
        want = [rc.shuffle_tokens(row.copy(), s) for s, row in enumerate(ids)]
        _assert_same(got, want)


def test_tokenizer_py_function_returns_int64_for_int32():
    def pipeline(py_function):
        return list(tf.data.Dataset.from_tensor_slices(TEXTS).map(
            lambda t: py_function(rc.tokenize_text, [t], tf.int32)).as_numpy_iterator())

    want = pipeline(tf.py_function)
    got = pipeline(pfb.py_function)
    _assert_same(got, want)
    assert all(g.dtype == np.int32 for g in got)
    eager = pfb.py_function(rc.tokenize_text, [tf.constant(TEXTS[0])], tf.int32)
    np.testing.assert_array_equal(eager.numpy(), want[0])


def test_tokenizer_numpy_function(pool):
    for name, api in _apis(pool).items():
        got = list(tf.data.Dataset.from_tensor_slices(TEXTS).map(
            lambda t: api(rc.tokenize_for_numpy_function, [t], tf.int32)).as_numpy_iterator())
        _assert_same(got, [rc.tokenize_for_numpy_function(t) for t in TEXTS])


def test_pil_decode(pool):
    pngs = _pngs()
    want = [rc.decode_png(p) for p in pngs]
    for name, api in _apis(pool).items():
        for got in _all_modes(api, rc.decode_png, tf.constant(pngs), tf.uint8):
            _assert_same(got, want)


def test_float64_noise_for_a_float32_py_function():
    def run(py_function):
        return tf.function(lambda n: py_function(rc.random_noise, [n], tf.float32))(
            tf.constant(3)).numpy()

    np.testing.assert_array_equal(run(pfb.py_function), run(tf.py_function))


@pytest.mark.parametrize("api", ["numpy_function", "py_func"])
def test_try_except_around_an_eager_call(api):
    def parse_or_default(text):
        try:
            return getattr(pfb, api)(rc.parse_int, [text], tf.int64).numpy()
        except ValueError:
            return -1

    assert [parse_or_default(t) for t in (b"12", b"x", b"7")] == [12, -1, 7]


def test_try_except_around_an_eager_pool_call(pool):
    def parse_or_default(text):
        try:
            return pfb.numpy_function(rc.parse_int, [text], tf.int64, executor=pool).numpy()
        except ValueError:
            return -1

    assert [parse_or_default(t) for t in (b"12", b"x")] == [12, -1]


def test_legacy_map_function():
    def pipeline(py_func):
        return list(tf.compat.v1.data.Dataset.range(4).map_with_legacy_function(
            lambda x: py_func(lambda v: v * 2, [x], tf.int64)).as_numpy_iterator())

    assert pipeline(pfb.py_func) == pipeline(tf.compat.v1.py_func) == [0, 2, 4, 6]
