"""What the op-building APIs share (numpy_function, py_func, py_function,
array_function): argument checks, the decorator form, building a bridge op
in a graph (with its portable description, pyfunc_bridge/_portable.py), and
running one eagerly.  The API modules keep only what differs between them."""
import functools
import os

from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.python import pywrap_tfe as _pywrap_tfe
from tensorflow.python.autograph.core import config as _autograph_config
from tensorflow.python.eager import context
from tensorflow.python.eager import core as _eager_core
from tensorflow.python.eager import executor as _executor
from tensorflow.python.framework import errors_impl as _errors_impl
from tensorflow.python.framework import ops as _tf_ops
from tensorflow.python.util import nest as _nest
from tensorflow.python.util import tf_stack as _tf_stack

from pyfunc_bridge import _errors, _library, _portable, _registry, _tout

# Library code, not user code: autograph calls it as it is.  (A rule rather
# than @do_not_convert, whose wrapper costs every eager call.)
if not any(getattr(rule, "_prefix", None) == "pyfunc_bridge"
           for rule in _autograph_config.CONVERSION_RULES):
    _autograph_config.CONVERSION_RULES = (
        (_autograph_config.DoNotConvert("pyfunc_bridge"),)
        + tuple(_autograph_config.CONVERSION_RULES))

# A node attribute marking a graph op whose calls run in a process pool: its
# kernel is asynchronous (src/kernel/numpy_function.cc, docs/pool.md).
POOL_ATTR = "_pyfunc_bridge_pool"


def check_callable(func):
    """Raises NotCallableError (a ValueError, as TF's, and a TypeError) unless
    `func` is callable.

    >>> check_callable(3)
    Traceback (most recent call last):
    ...
    pyfunc_bridge._errors.NotCallableError: Expected func to be callable, got int: 3; pass a function or an object with __call__
    """
    if not callable(func):
        raise _errors.NotCallableError(
            f"Expected func to be callable, got {type(func).__name__}: {func!r}; "
            f"pass a function or an object with __call__")


def require_inp(inp, api_name):
    """TF's TypeError for a function given without `inp` (only a decorator
    takes none)."""
    if inp is None:
        raise TypeError(
            f"Missing argument `inp`: the list of the function's inputs ([] for none); "
            f"only {api_name} used as a decorator (`func=None`) takes no `inp`")


def input_list(inp):
    """`inp` as a list (None: no inputs), or a TypeError."""
    if inp is None:
        return []
    if not isinstance(inp, (list, tuple)):
        raise TypeError(
            f"inp must be a list or tuple of tensors, got {type(inp).__name__}; "
            f"wrap a single tensor as [x]")
    return list(inp)


def convert_input(value, what):
    """`value` as a tensor.  In a graph a value that does not convert is a
    TypeError, TF's class there (its op builder re-raises the ValueError of
    None or a ragged list as "... have types [<NOT CONVERTIBLE TO TENSOR>]");
    eagerly the ValueError stays, as TF's eager py_function raises it."""
    try:
        return _tf_ops.convert_to_tensor(value)
    except ValueError as exc:
        if context.executing_eagerly():
            raise
        raise TypeError(f"{what} is not convertible to a tensor: {exc}") from exc


def check_input_dtypes(tensors, what):
    """Raises a TypeError naming the first input (`what.format(i)`) whose
    dtype does not cross the bridge."""
    supported = _tout.supported_dtypes()
    for i, tensor in enumerate(tensors):
        if tensor.dtype not in supported:
            _tout.dtype_of(tensor.dtype, what.format(i))  # raises, naming the dtype


def decorator(api, api_name, inp, *args, **kwargs):
    """`api` (called as api(func, inp, *args, **kwargs)) without `func`: a
    decorator that makes the decorated function's arguments the inputs.  It
    declares a module-level function portable (_portable.declare_if_nameable),
    so that graphs built elsewhere may run it by name."""
    if inp is not None:
        # TF's words first (code matches on them).
        raise TypeError(
            f"Don't set the `inp` argument when using {api_name} as a decorator "
            f"(`func=None`): the decorated function's arguments are its inputs")

    def decorate(func):
        _portable.declare_if_nameable(func)  # graphs from elsewhere may name it

        @functools.wraps(func)
        def wrapper(*call_args):
            return api(func, list(call_args), *args, **kwargs)
        return wrapper
    return decorate


# Default node names.  A node is named after its op type unless told
# otherwise, and ours contain ">", which TF's error interpolation does not
# parse as a node name: its errors then lose "Detected at node ... defined at"
# and take time quadratic in the message's length.
_NODE_NAMES = {
    "PyfuncBridge>NumpyFunction": "NumpyFunction",
    "PyfuncBridge>NumpyFunctionStateless": "NumpyFunction",
    "PyfuncBridge>ArrayFunction": "ArrayFunction",
    "PyfuncBridge>ArrayFunctionStateless": "ArrayFunction",
    "PyfuncBridge>PyFunction": "PyFunction",
    "PyfuncBridge>PyFunctionGrad": "PyFunctionGrad",
}


_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_FILES = frozenset(
    os.path.join(_HERE, name) for name in os.listdir(_HERE) if name.endswith(".py"))


class BridgeFrames(_tf_stack.StackTraceFilter):
    """Leaves this package's frames out of the stack TF records for an op
    built under it, as TF leaves out its own: the stack that errors show
    ("defined at", XLA's "The op is created at") then ends at the user's
    line.  `wrapper`: the op's generated wrapper, whose code TF compiled
    from a string (file ``<string>``, shared by every op library's
    wrappers: a frame of code the user exec'd while building the op would be
    left out too).  One instance per op built: TF's filters belong to the
    thread that enters them."""

    def __init__(self, wrapper):
        super().__init__()
        self._files = _PACKAGE_FILES | {wrapper.__code__.co_filename}

    def get_filtered_filenames(self):
        return self._files | self.parent.get_filtered_filenames()


def node_name(op_type, framework=None):
    """The default name of a graph node of a bridge op: array_function's
    (numpy_function's op with a `framework`) are ArrayFunction.

    >>> node_name("PyfuncBridge>NumpyFunctionStateless")
    'NumpyFunction'
    >>> node_name("PyfuncBridge>NumpyFunction", framework=object())
    'ArrayFunction'
    """
    return "ArrayFunction" if framework is not None else _NODE_NAMES[op_type]


def build_graph_op(op_type, wrapper, func, inputs, signature, name, attrs=(),
                   framework=None, portable=False, runs=None, nameable=True,
                   executor=None, api=None):
    """Builds a bridge op of type `op_type` in a graph and returns what
    `wrapper` (the op's generated wrapper) returns.  The node is named `name`,
    by default node_name(op_type, framework).

    The function the kernel runs (`runs`, default `func`) is registered under
    a new key, which the op's graph and its outer graphs keep alive.  The op
    also carries `func`'s portable description (_portable.attrs): its
    reference, its pickle with `portable=True` (of `runs`), and `framework`'s
    name, so that a process where the key is not registered can resolve it.
    `nameable`: False where a reference alone could not rebuild `runs`.
    `attrs`: the op's further attributes, as (name, value) pairs.
    `executor`: the pool this process runs the calls in (None: in-process);
    another process that loads the graph runs them in-process.  `api`: the
    public function building it, for the entry (its profiler events)."""
    travel = _portable.attrs(func, portable, framework and framework.name,
                             obj=runs, nameable=nameable)
    entry = _registry.register(func if runs is None else runs, framework, name,
                               executor=executor, api=api)
    # The graph the op is built in, taken from neither result form: a list of
    # outputs, (outputs, forward) for py_function, the Operation of a stateful
    # op without outputs, or [] for a stateless one (TF's generated wrappers
    # return the Operation only for stateful ops).
    graph = _tf_ops.get_default_graph()
    with BridgeFrames(wrapper):
        result = wrapper(input=inputs, key=entry.key, Tout=signature.dtypes,
                         out_shapes=signature.shapes,
                         name=node_name(op_type, framework) if name is None else name,
                         **dict(attrs), **travel)
    _registry.keep_alive(entry, graph)
    if executor is not None:
        # Its kernel posts the calls it routes to the pool (pool_route.h);
        # a kernel without it stays synchronous, which costs in-process
        # calls less.  (A stateless op without outputs shows no Operation.)
        ops = [item if isinstance(item, _tf_ops.Operation) else item.op
               for item in _nest.flatten(result)]
        if ops:
            ops[0]._set_attr(POOL_ATTR, _attr_value_pb2.AttrValue(b=True))
    return result


_INTERNAL = 13  # TF's error code INTERNAL


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
        if e.code == _INTERNAL:  # a result without a tensor form: as call_eagerly
            raise _library.conversion().eager_error(e.code, e.message) from None
        _tf_ops.raise_from_not_ok_status(e, name)
    except _eager_core._FallbackException:
        return wrapper(input=inputs, key=key, Tout=signature.dtypes,
                       out_shapes=signature.shapes, name=name, **dict(attrs))


def run_eagerly(op_name, wrapper, func, inputs, signature, name, attrs=(),
                framework=None, record=True, copy_mode=None, executor=None, api=None):
    """Runs a bridge op eagerly; `framework`, `record`, `executor` and `api`
    go to the entry.

    `copy_mode` (PfbCall's, from copy_policy): where TF has one CPU device,
    call the bridge without dispatching the op (numpy_function's kernel does
    exactly that work, and TF's eager op dispatch costs more than the bridge
    itself); None: always dispatch the op."""
    # The conversion layer finds the function in this thread's eager slot,
    # under the slot's key, wherever TF runs the kernel (GPU kernels run on
    # TF's threads); one key per thread keeps TF's eager kernel cache from
    # growing with every call.
    if context.context().is_async():
        # An async executor would run the function on its own thread, where the
        # TF ops it runs (queued behind it) or a lock the caller holds wait for
        # ever; TF's eager numpy_function calls it on this thread, once the
        # ops queued before it have run.
        context.async_wait()
        with context.executor_scope(_executor.new_executor(enable_async=False)):
            return run_eagerly(op_name, wrapper, func, inputs, signature, name, attrs,
                               framework, record, copy_mode, executor, api)
    conversion = _library.conversion()
    slot = conversion.eager_slot()
    key = slot.key
    previous = slot.entry
    slot.entry = _registry.Entry(func, key, framework, record, name, eager=True,
                                 executor=executor, api=api)
    slot.raised = None
    try:
        if copy_mode is not None and conversion.direct_eager_calls():
            return conversion.call_eagerly(inputs, signature.dtypes, signature.shapes,
                                           copy_mode)
        return _execute(op_name, wrapper, inputs, key, signature, name, attrs)
    except _errors_impl.OpError:
        # The function's own exception leaves an eager numpy_function / py_func
        # / array_function as TF's leaves: as it is, or (as an instance of its
        # class and of the TF error) combined.  Either path left it in this
        # thread's slot (the conversion layer's _failure, errors.pxi's
        # _eager_raised decides); its own cause stays, the OpError's context goes.
        raised = conversion.take_raised()
        if raised is None:
            raise
        try:
            raise raised from raised.__cause__
        finally:
            raised = None  # this frame, which its traceback holds, must not hold it: a cycle
    finally:
        slot.entry = previous
