"""``array_function``: numpy_function for the arrays of other frameworks."""
from pyfunc_bridge import _frameworks
from pyfunc_bridge._numpy_function import _bridge_op


def array_function(func, inp, Tout, *, framework, stateful=True, name=None, copy=None,
                   portable=False, executor=None):
    """Wraps a function of torch / JAX / NumPy arrays as a TF op.

    Like :func:`numpy_function` (same ``Tout``, shape, error and copy-policy
    rules, same kernel), but ``func`` receives arrays of ``framework``
    (``"numpy"``, ``"torch"``, ``"jax"`` or ``"cupy"``) made through DLPack, and may
    return any object exporting ``__dlpack__`` (a torch tensor, a JAX array,
    ...), an ndarray or Python values.

    Inputs: torch tensors share TensorFlow's memory where the call holds it
    alone, else they are the call's private copy, so an in-place write is
    never seen outside the call (``copy=False``: always shared, and a write
    fails the op, since torch has no read-only tensors); JAX copies them on
    import.  Results exporting ``__dlpack__`` come back
    without a copy when nothing in Python can write their memory afterwards
    (a fresh torch tensor, any JAX array) and they are 64-byte aligned and
    C-contiguous; otherwise they are copied once (``copy=False``: an error).
    ``framework`` ``"cupy"`` (GPU only) is supported too.  The op of torch,
    JAX and CuPy has a GPU kernel: placed on a GPU, inputs arrive as CUDA
    arrays without a copy and CUDA results return without one, ordered
    against TensorFlow's stream; on the CPU kernel CUDA results are an error.

    The framework is imported when the op is built; a missing one is an
    ImportError naming the package to install.  Graph ops record the
    framework, so a process that loads them converts as it did; ``portable``
    is as for :func:`numpy_function`.

    ``executor`` is as for :func:`numpy_function`: in a worker process the
    inputs are the framework's arrays made from NumPy (``torch.from_numpy``,
    ``jax.numpy.asarray``) over the call's own copy in shared memory, and
    results come back as NumPy arrays.

    >>> import numpy as np, tensorflow as tf
    >>> double = lambda a: a * 2
    >>> array_function(double, [tf.constant([1.0, 2.0])], tf.float32,
    ...                framework="numpy").numpy()
    array([2., 4.], dtype=float32)

    With torch (inside a tf.function too):

    >>> import torch
    >>> @tf.function
    ... def softplus(x):
    ...     return array_function(torch.nn.functional.softplus, [x], tf.float32,
    ...                           framework="torch")
    >>> softplus(tf.constant([0.0])).numpy()
    array([0.6931472], dtype=float32)
    """
    adapter = _frameworks.adapter(framework)
    return _bridge_op(func, inp, Tout, stateful, name, copy, adapter, portable, executor,
                      "array_function")
