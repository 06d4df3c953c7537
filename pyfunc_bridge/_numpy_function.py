"""``numpy_function`` and ``py_func``: the public op-building API."""
import functools

import tensorflow as tf
from tensorflow.python import pywrap_tfe as _pywrap_tfe
from tensorflow.python.autograph.core import config as _autograph_config
from tensorflow.python.eager import context
from tensorflow.python.eager import core as _eager_core
from tensorflow.python.framework import ops as _tf_ops

from pyfunc_bridge import _library, _registry, _tout

STATEFUL_OP = "PyfuncBridge>NumpyFunction"
STATELESS_OP = "PyfuncBridge>NumpyFunctionStateless"
# Default node names.  A node is named after its op type unless told otherwise,
# and ours contain ">", which TF's error interpolation does not parse as a
# node name: its errors then lose "Detected at node ..." and take time
# quadratic in the message's length.
NODE_NAME = "NumpyFunction"
ARRAY_NODE_NAME = "ArrayFunction"

# Like TF's PyFunc: the function is opaque to autodiff.
_tf_ops.no_gradient(STATEFUL_OP)
_tf_ops.no_gradient(STATELESS_OP)

# Library code, not user code: autograph calls it as it is.  (A rule rather
# than @do_not_convert, whose wrapper costs every eager call.)
if not any(getattr(rule, "_prefix", None) == "pyfunc_bridge"
           for rule in _autograph_config.CONVERSION_RULES):
    _autograph_config.CONVERSION_RULES = (
        (_autograph_config.DoNotConvert("pyfunc_bridge"),)
        + tuple(_autograph_config.CONVERSION_RULES))

_COPY_ATTR = {None: "none", True: "true", False: "false"}


def _copy_attr(copy):
    if copy is not None and type(copy) is not bool:
        raise ValueError(f"copy must be None, True or False, got {copy!r}")
    return _COPY_ATTR[copy]


def _inputs(inp):
    if inp is None:
        return []
    if not isinstance(inp, (list, tuple)):
        raise TypeError(
            f"inp must be a list or tuple of tensors, got {type(inp).__name__}; "
            f"wrap a single tensor as [x]")
    tensors = []
    for i, value in enumerate(inp):
        if not isinstance(value, tf.Tensor):
            if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
                raise TypeError(
                    f"inp[{i}] is a {type(value).__name__}; numpy_function takes "
                    f"dense tensors")
            value = tf.convert_to_tensor(value)
        if value.dtype not in _tout.SUPPORTED_DTYPES:
            _tout.dtype_of(value.dtype, f"inp[{i}]")  # raises, naming the dtype
        tensors.append(value)
    return tensors


def _execute(op_name, wrapper, inputs, key, signature, name, attrs):
    """Runs the op eagerly through TF's fast path (the generated wrapper's own
    first step), falling back to the wrapper where the fast path declines.
    `attrs`: the op's further attributes, as (name, value) pairs."""
    ctx = context.context()
    try:
        return _pywrap_tfe.TFE_Py_FastPathExecute(
            ctx, op_name, name, inputs, "key", key, "Tout", signature.dtypes,
            "out_shapes", signature.shapes, *[v for pair in attrs for v in pair])
    except _eager_core._NotOkStatusException as e:
        _tf_ops.raise_from_not_ok_status(e, name)
    except _eager_core._FallbackException:
        return wrapper(input=inputs, key=key, Tout=signature.dtypes,
                       out_shapes=signature.shapes, name=name, **dict(attrs))


_COPY_MODE = {"none": 0, "true": 1, "false": 2}  # bridge_abi.h's PFB_COPY_*


def run_eagerly(op_name, wrapper, func, inputs, signature, name, attrs=(),
                framework=None, record=True, direct=False):
    """Runs a bridge op eagerly; `framework` and `record` go to the entry.

    `direct`: where TF has one CPU device, call the bridge without
    dispatching the op (numpy_function's kernel does exactly that work, and
    TF's eager op dispatch costs more than the bridge itself)."""
    # The kernel of an eager op runs on this thread: the conversion layer finds
    # the function in a thread-local slot, under one constant key, so that TF's
    # eager kernel cache does not grow with every call.
    if context.context().is_async():
        entry = _registry.register(func, framework, name)
        entry.record = record
        result = _execute(op_name, wrapper, inputs, entry.key, signature, name, attrs)
        context.async_wait()  # the entry must outlive the call
        return result
    conversion = _library.conversion()
    slot, key = conversion._eager, conversion.EAGER_KEY
    previous = getattr(slot, "entry", None)
    slot.entry = _registry.Entry(func, key, framework, record, name)
    try:
        if direct and conversion.direct_eager_calls():
            return conversion.call_eagerly(inputs, signature.dtypes, signature.shapes,
                                           _COPY_MODE[dict(attrs)["copy"]])
        conversion.take_raised()
        try:
            return _execute(op_name, wrapper, inputs, key, signature, name, attrs)
        except tf.errors.OpError:
            # SystemExit, KeyboardInterrupt and TF errors raised by the function
            # leave an eager numpy_function as they are, as they leave TF's.
            raised = conversion.take_raised()
            if raised is None:
                raise
            raise raised from None
    finally:
        slot.entry = previous


def _bridge_op(func, inp, Tout, stateful, name, copy, framework=None):
    """The op for `func`; `framework`: None (NumPy) or an array_function adapter."""
    if not callable(func):
        raise TypeError(f"func must be callable, got {type(func).__name__}: {func!r}")
    copy_attr = _copy_attr(copy)
    signature = _tout.normalize(Tout)
    inputs = _inputs(inp)
    lib = _library.ops()
    if stateful:
        op_name, op = STATEFUL_OP, lib.pyfunc_bridge_numpy_function
    else:
        op_name, op = STATELESS_OP, lib.pyfunc_bridge_numpy_function_stateless
    if tf.executing_eagerly():
        result = run_eagerly(op_name, op, func, inputs, signature, name,
                             (("copy", copy_attr),), framework, direct=True)
    else:
        entry = _registry.register(func, framework, name)
        if name is None:
            name = NODE_NAME if framework is None else ARRAY_NODE_NAME
        result = op(input=inputs, key=entry.key, Tout=signature.dtypes,
                    out_shapes=signature.shapes, copy=copy_attr, name=name)
        graph = (result[0].graph if isinstance(result, list) and result
                 else result.graph)
        _registry.keep_alive(entry, graph)
    if signature.single:
        return result[0]
    return result if isinstance(result, (list, tf.Operation)) or result is None else list(result)


def _decorator(api, Tout, stateful, name, copy):
    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args):
            return api(func, list(args), Tout, stateful=stateful, name=name, copy=copy)
        return wrapper
    return decorate


def numpy_function(func=None, inp=None, Tout=None, stateful=True, name=None, *,
                   copy=None):
    """Wraps a Python function taking and returning NumPy arrays as a TF op.

    A drop-in for ``tf.numpy_function``: same arguments, same results, same
    error codes, on pyfunc_bridge's own kernel.

    Args:
      func: the Python function. It receives one ndarray per input (tf.string
        inputs arrive as object arrays of bytes) and returns one value per
        output: ndarrays of the declared dtype, Python scalars or lists (which
        convert to the declared dtype), bytes/str for tf.string.
      inp: a list of tensors (or values convertible to tensors).
      Tout: a dtype, a ``tf.TensorSpec`` (declares, and checks, the static
        shape), or a list of those; ``[]`` for no outputs.  A single dtype or
        spec makes the op return one tensor, a list makes it return a list.
      stateful: whether the function has side effects; stateless ops may be
        merged or pruned by TF's optimizers.
      name: the op's name.
      copy: the copy policy.  ``None`` (default): inputs are read-only zero-copy
        views, outputs are zero-copy unless Python could still change their
        memory after the call, then copied once.  ``True``: private writable
        input copies, outputs always copied.  ``False``: never copy numeric
        data; an output that would need a copy is an InvalidArgument error.

    Returns:
      A tensor, or a list of tensors when Tout is a list.

    Without ``func`` it is a decorator:

    >>> import numpy as np, tensorflow as tf
    >>> @numpy_function(Tout=tf.TensorSpec([None, 2], tf.float32))
    ... def pairs(a):
    ...     return a.reshape(-1, 2)
    >>> pairs(tf.range(4, dtype=tf.float32)).shape
    TensorShape([2, 2])
    >>> numpy_function(lambda a: a * 2, [tf.constant([1, 2])], tf.int32).numpy()
    array([2, 4], dtype=int32)
    """
    if func is None:
        if inp is not None:
            raise TypeError("numpy_function used as a decorator takes no `inp`")
        return _decorator(numpy_function, Tout, stateful, name, copy)
    return _bridge_op(func, inp, Tout, stateful, name, copy)


def py_func(func, inp, Tout, stateful=True, name=None, *, copy=None):
    """TF1's ``tf.compat.v1.py_func`` on pyfunc_bridge's kernel.

    Same semantics as :func:`numpy_function` (NumPy arrays in and out), for
    graphs built with ``tf.compat.v1`` and run by a ``Session``:

    >>> import numpy as np, tensorflow as tf
    >>> with tf.Graph().as_default():
    ...     x = tf.compat.v1.placeholder(tf.float64, [None])
    ...     y = py_func(np.cumsum, [x], tf.float64)
    ...     with tf.compat.v1.Session() as sess:
    ...         sess.run(y, {x: [1.0, 2.0, 3.0]})
    array([1., 3., 6.])
    """
    return _bridge_op(func, inp, Tout, stateful, name, copy)
