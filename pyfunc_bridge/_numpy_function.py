"""``numpy_function`` and ``py_func``: the public op-building API."""
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as _tf_ops

from pyfunc_bridge import _library, _op, _tout

STATEFUL_OP = "PyfuncBridge>NumpyFunction"
STATELESS_OP = "PyfuncBridge>NumpyFunctionStateless"
# array_function's ops for frameworks that hold device memory: kernels on the
# CPU and the GPU (numpy_function's run on the CPU only).
ARRAY_OP = "PyfuncBridge>ArrayFunction"
ARRAY_STATELESS_OP = "PyfuncBridge>ArrayFunctionStateless"

# Like TF's PyFunc: the function is opaque to autodiff.
for _op_type in (STATEFUL_OP, STATELESS_OP, ARRAY_OP, ARRAY_STATELESS_OP):
    _tf_ops.no_gradient(_op_type)


# Python values that TF's eager numpy_function passes through np.array.
_PYTHON_VALUES = (bool, int, float, complex, str, bytes, list, tuple)


def _inputs(inp, eager):
    tensors = []
    for i, value in enumerate(_op.input_list(inp)):
        if not isinstance(value, tf.Tensor):
            if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
                raise TypeError(
                    f"inp[{i}] is a {type(value).__name__}; numpy_function takes "
                    f"dense tensors")
            if eager and isinstance(value, _PYTHON_VALUES):
                # TF's eager numpy_function calls func(*map(np.array, inp)):
                # 1.5 is float64 there and 3 int64, not convert_to_tensor's 32 bits.
                value = _numpy_input(value)
            value = _op.convert_input(value, f"inp[{i}]")
        tensors.append(value)
    _op.check_input_dtypes(tensors, "inp[{}]")
    return tensors


def _numpy_input(value):
    """`value` as np.array makes it, where that has a tensor form; otherwise
    `value` itself, whose conversion error names it."""
    try:
        array = np.array(value)
    except ValueError:  # a ragged list
        return value
    return value if array.dtype == object else array


def _bridge_op(func, inp, Tout, stateful, name, copy, framework=None, portable=False,
               executor=None, api="numpy_function"):
    """The op for `func`; `framework`: None (NumPy) or an array_function adapter;
    `portable`: embed the pickled function in graph ops (_portable.py);
    `executor`: where the calls run (pool/process_pool.py, executor)."""
    _op.check_callable(func)
    if executor is None:
        pool = None
    else:  # the pool's modules load with its first use (import stays cheap)
        from pyfunc_bridge.pool import process_pool
        pool = process_pool.executor(executor, api)
    copy_attr, copy_mode = _library.conversion().copy_policy(copy)
    signature = _tout.normalize(Tout)
    eager = tf.executing_eagerly()
    inputs = _inputs(inp, eager)
    lib = _library.ops()
    # TF runs a dispatched eager op as a function, which prunes a stateless op
    # without outputs: eagerly such a call runs once, stateful or not.
    stateful = stateful or (eager and not signature.dtypes)
    # A worker process receives host memory: pool calls stay on the CPU kernel.
    if framework is not None and pool is None:
        op_name, op = ((ARRAY_OP, lib.pyfunc_bridge_array_function) if stateful else
                       (ARRAY_STATELESS_OP, lib.pyfunc_bridge_array_function_stateless))
    elif stateful:
        op_name, op = STATEFUL_OP, lib.pyfunc_bridge_numpy_function
    else:
        op_name, op = STATELESS_OP, lib.pyfunc_bridge_numpy_function_stateless
    if eager:
        result = _op.run_eagerly(op_name, op, func, inputs, signature, name,
                                 (("copy", copy_attr),), framework, copy_mode=copy_mode,
                                 executor=pool, api=api)
        if not signature.dtypes:
            return None  # Tout=[]: TF's eager numpy_function returns None
    else:
        result = _op.build_graph_op(op_name, op, func, inputs, signature, name,
                                    (("copy", copy_attr),), framework, portable,
                                    executor=pool, api=api)
    if signature.single or (eager and framework is None and len(signature.dtypes) == 1):
        # Eagerly TF's numpy_function and py_func return a one-entry Tout
        # list's result as a tensor, not a list of one (in graphs a list).
        return result[0]
    return result if isinstance(result, (list, tf.Operation)) or result is None else list(result)


def numpy_function(func=None, inp=None, Tout=None, stateful=True, name=None, *,
                   copy=None, portable=False, executor=None):
    """Wraps a Python function taking and returning NumPy arrays as a TF op.

    A drop-in for ``tf.numpy_function``: same arguments, same results, the
    same error classes in graphs, on pyfunc_bridge's own kernel (docs/differences.md
    lists the deliberate differences).

    Args:
      func: the Python function. It receives one ndarray per input (tf.string
        inputs arrive as object arrays of bytes); a 0-d input arrives as a
        NumPy scalar (``bytes`` for tf.string) in a graph and as a 0-d array
        eagerly, as with ``tf.numpy_function``.  It returns one value per
        output: ndarrays of the declared dtype, Python scalars or lists (which
        convert to the declared dtype), bytes/str for tf.string.
      inp: a list of tensors (or values convertible to tensors).
      Tout: a dtype, a ``tf.TensorSpec`` (declares, and checks, the static
        shape), or a list of those; ``[]`` for no outputs.  A single dtype or
        spec makes the op return one tensor, a list makes it return a list.
      stateful: whether the function has side effects; stateless ops may be
        merged or pruned by TF's optimizers.
      name: the op's name.
      copy: the copy policy.  ``None`` (default): inputs are writable, as
        with TensorFlow, and zero-copy where the call holds TensorFlow's
        buffer alone, else a private copy, so no write is seen outside the
        call; outputs are zero-copy unless Python could still change their
        memory after the call, then copied once.  ``True``: private writable
        input copies, outputs always copied.  ``False``: never copy numeric
        data: read-only input views, and an output that would need a copy is
        an InvalidArgument error.
      portable: also embed the function, serialized by cloudpickle, in graph
        ops, so that another process can run it (a SavedModel, a tf.data
        service worker) where it trusts pickles (:func:`trust_pickled`).  For
        lambdas, closures and functions of ``__main__``; a module-level
        function travels by name when the loading process declares it
        (:func:`portable`).  Eager calls ignore it.
      executor: where the function runs.  ``None`` (default): in this
        process.  A :class:`ProcessPool`, or ``"process"`` (a shared pool
        with one worker per core, started on first use and closed at exit):
        in worker processes, so that Python code that holds the GIL runs on
        several cores under a parallel ``tf.data`` map.  Numeric inputs and
        results move through shared memory; strings and scalars are pickled;
        the function is pickled once per worker (cloudpickle).  Workers
        share no Python state with this process.

    Returns:
      A tensor, or a list of tensors when Tout is a list.  With no outputs
      (``Tout=[]``): None eagerly, the ``tf.Operation`` in a graph (for
      ``Session.run`` and control dependencies), as ``tf.numpy_function``;
      ``[]`` in a graph with ``stateful=False`` (TF's too: nothing keeps such
      an op, so the graph prunes it).

    Raises:
      The TF error class of the function's exception (``ValueError`` ->
      ``tf.errors.InvalidArgumentError``, ...), its message with the Python
      traceback.  Eagerly the error is also of the function's own class, as
      ``tf.numpy_function`` raises it eagerly, so both ``except`` clauses
      catch it:

      >>> try:
      ...     numpy_function(lambda a: {}["key"], [tf.constant(1.0)], tf.float32)
      ... except KeyError as err:
      ...     (err.args, isinstance(err, tf.errors.UnknownError))
      (('key',), True)

    Without ``func`` it is a decorator, which also declares a module-level
    function portable:

    >>> import numpy as np, tensorflow as tf
    >>> @numpy_function(Tout=tf.TensorSpec([None, 2], tf.float32))
    ... def pairs(a):
    ...     return a.reshape(-1, 2)
    >>> pairs(tf.range(4, dtype=tf.float32)).shape
    TensorShape([2, 2])
    >>> numpy_function(lambda a: a * 2, [tf.constant([1, 2])], tf.int32).numpy()
    array([2, 4], dtype=int32)

    In a worker process (``executor=``), here in a map that keeps several
    calls in flight:

    >>> from pyfunc_bridge import ProcessPool
    >>> with ProcessPool(2) as pool:
    ...     dataset = tf.data.Dataset.range(4).map(
    ...         lambda x: numpy_function(lambda a: a * 10, [x], tf.int64, executor=pool),
    ...         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ...     [int(v) for v in dataset]
    [0, 10, 20, 30]
    """
    if Tout is None:  # before `func`, as TF: `@numpy_function(tf.int32)` forgot the name
        raise TypeError(_tout.MISSING_TOUT)
    if func is None:
        return _op.decorator(numpy_function, "numpy_function", inp, Tout,
                             stateful=stateful, name=name, copy=copy, portable=portable,
                             executor=executor)
    _op.require_inp(inp, "numpy_function")
    return _bridge_op(func, inp, Tout, stateful, name, copy, portable=portable,
                      executor=executor)


def py_func(func, inp, Tout, stateful=True, name=None, *, copy=None, portable=False,
            executor=None):
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
    return _bridge_op(func, inp, Tout, stateful, name, copy, portable=portable,
                      executor=executor, api="py_func")
