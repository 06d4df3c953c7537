"""What the test_xla*.py files share: the dtypes XLA takes, sample values,
jit-compiled functions and their HLO, and scripts in fresh interpreters."""
import numpy as np
import tensorflow as tf

from conftest import ROOT, script_env
from fresh_python import fresh_python

NUMERIC = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16,
           tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool,
           tf.complex64, tf.complex128]


def sample(dtype, shape=(2, 3)):
    n = int(np.prod(shape))
    if dtype == tf.bool:
        return tf.constant(np.arange(n).reshape(shape) % 3 == 0)
    if dtype.is_complex:
        return tf.cast(tf.reshape(tf.range(n, dtype=tf.float64), shape), dtype) * (1 + 2j)
    return tf.cast(tf.reshape(tf.range(n), shape), dtype)


def flip(a):
    # Reversed rows, a new array: for every dtype, bool and bfloat16 included.
    return np.ascontiguousarray(a[::-1])


def jit(fn):
    return tf.function(fn, jit_compile=True)


def outer_tape(f):
    """`f`'s gradient by a tape around the call (imported by scripts too)."""
    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = f(x)
        return tape.gradient(y, x)
    return grad


def hlo(fn, *args):
    return fn.experimental_get_compiler_ir(*args)(stage="hlo")


def run_script(script, *args, PYTHONPATH=None, **env):
    """tests/scripts/`script` with `args` in a fresh interpreter (this
    checkout's package first on its path, then `PYTHONPATH`); its stdout's
    lines."""
    env = script_env(*[p for p in (ROOT, PYTHONPATH) if p], TF_CPP_MIN_LOG_LEVEL="2",
                     CUDA_VISIBLE_DEVICES="", **env)
    proc = fresh_python(script, *args, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()
