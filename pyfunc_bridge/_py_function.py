"""``py_function``: a Python function of EagerTensors as a once-differentiable op.

The op returns the function's results and one more, internal output: a scalar
variant holding what the call recorded for its gradient (a tape over the
function's TF computation).  The gradient op takes that tensor back, so every
forward call is paired with its own backward call, and the recorded state
lives as long as TF keeps the tensor: until the gradient has run and the tape
(or graph) that could run it again is gone.  Where nothing can take the
gradient (no tape watches an eager call, no gradient is wired in a graph) the
call records nothing.
"""
import contextlib
import functools

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.python import pywrap_tfe as _pywrap_tfe
from tensorflow.python.eager import record as _record
from tensorflow.python.framework import ops as _tf_ops
from tensorflow.python.ops import control_flow_util as _control_flow_util
from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
from tensorflow.python.ops.resource_variable_ops import ResourceVariable as _ResourceVariable
from tensorflow.python.util import nest as _nest

from pyfunc_bridge import _library, _op, _registry, _tout

OP = "PyfuncBridge>PyFunction"
GRAD_OP = "PyfuncBridge>PyFunctionGrad"


def _floating(dtype):
    return dtype.is_floating or dtype.is_complex


def _input_grads(op, grads):
    """The input gradients of the call `op`, from `grads`: one per output of
    the function (None where none flows back)."""
    outputs = op.outputs[:-1]
    output_grads = []
    for output, grad in zip(outputs, grads):
        if not _floating(output.dtype):
            continue
        if grad is None:
            grad = tf.zeros_like(output)
        elif not isinstance(grad, tf.Tensor):
            grad = tf.convert_to_tensor(grad)  # IndexedSlices
        output_grads.append(grad)
    input_dtypes = [t.dtype for t in op.inputs]
    floating = [dtype for dtype in input_dtypes if _floating(dtype)]
    if not floating:
        return [None] * len(input_dtypes)
    if _built_for_xla(op) and not _being_built(op.graph):
        return _rerun_grads(op, output_grads)
    grad_op = _library.ops().pyfunc_bridge_py_function_grad
    with _op.BridgeFrames(grad_op):
        input_grads = iter(grad_op(
            forward=op.outputs[-1], grads=output_grads, Tdx=floating,
            name=None if tf.executing_eagerly() else _op.node_name(GRAD_OP)))
    return [next(input_grads) if _floating(dtype) else None for dtype in input_dtypes]


# A node attribute (kept in GraphDefs and SavedModels) marking a call built
# in a graph XLA compiles, whose forward state is an XLA tuple, no TF tensor;
# the op's shape function (ops.cc) reads it to redo _not_trainable on load.
_XLA_ATTR = "_pyfunc_bridge_xla"


def _built_for_xla(op):
    # A tape's stand-in op (_MockOp) has no node_def: a call outside XLA,
    # whose gradient _build_for_xla does not record.
    node_def = getattr(op, "node_def", None)
    return node_def is not None and _XLA_ATTR in node_def.attr


def _being_built(graph):
    """Whether `graph` is still being traced around this gradient (the same
    function, or pfor's loop function inlined into it), where the forward
    state stays in one XLA program.  A while-loop or cond gradient's branch
    and a tape's backward function are built after the forward graph got
    its outputs (TF re-enters it as the default graph for the latter)."""
    if graph is _tf_ops.get_default_graph():
        return True
    stack = getattr(_tf_ops._default_graph_stack, "stack", None) or []
    return not getattr(graph, "outputs", None) and any(g is graph for g in stack)


def _forward_function(op):
    """The caller registered for `op` (flat EagerTensors in, flat results
    out), resolved from its portable description where this process did not
    build it."""
    key = op.get_attr("key").decode()
    entry = _registry.lookup(key)
    if entry is None:
        entry = _registry.resolver(key, op.get_attr("reference").decode(),
                                   op.get_attr("pickled"), op.get_attr("framework").decode(),
                                   True, len(op.outputs) - 1)
    return entry.func


@contextlib.contextmanager
def _recording():
    """Tapes and accumulators record on this thread for the duration, also
    where TF stopped them (an eager tape's backward pass runs so, and an XLA
    custom call on the thread that runs the compiled function), as the
    conversion layer's own recording does (tensors.pxi)."""
    stopped = _pywrap_tfe.TFE_Py_TapeSetIsStopped()
    if stopped:
        _pywrap_tfe.TFE_Py_TapeSetRestartOnThread()
    try:
        yield
    finally:
        if stopped:
            _pywrap_tfe.TFE_Py_TapeSetStopOnThread()


def _rerun_grads(op, output_grads):
    """The gradient of an XLA-compiled call taken outside its graph (a tape
    around the jit_compile=True function, a tf.while_loop or tf.cond
    gradient), where its forward state, an XLA tuple, cannot travel: a
    py_function of the inputs and output gradients that reruns the function
    under a tape, as the gradient custom call does inside one XLA program."""
    func = _forward_function(op)
    inputs = list(op.inputs)
    tracked = [i for i, x in enumerate(inputs) if _floating(x.dtype)]
    differentiable = [i for i, y in enumerate(op.outputs[:-1]) if _floating(y.dtype)]

    def gradient(*args):
        xs = list(args[:len(inputs)])
        sources = [xs[i] for i in tracked]
        with _recording():
            with tf.GradientTape() as tape:
                tape.watch(sources)
                ys = list(func(*xs))
        # Results TF did not compute (ndarrays) contribute nothing, as in _Forward.
        pairs = [(ys[i], g) for i, g in zip(differentiable, args[len(inputs):])
                 if isinstance(ys[i], tf.Tensor)]
        if not pairs:
            return [tf.zeros_like(s) for s in sources]
        results = tape.gradient([y for y, _ in pairs], sources,
                                output_gradients=[g for _, g in pairs],
                                unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(r) for r in results]  # IndexedSlices -> dense

    specs = [tf.TensorSpec(inputs[i].shape, inputs[i].dtype) for i in tracked]
    input_grads = iter(py_function(gradient, inputs + output_grads, specs))
    return [next(input_grads) if _floating(x.dtype) else None for x in inputs]


@_tf_ops.RegisterGradient(OP)
def _py_function_grad(op, *grads):
    """The gradient of one call: its own recorded state, its own gradients."""
    return _input_grads(op, grads[:-1])


def _not_trainable(forward):
    """Marks the forward-state output as no trainable tensor (TF reads a
    variant's trainability from its handle data), so that symbolic
    tf.gradients adds no ZerosLike of it either; imported here, where XLA
    compiles, not when the package is."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.python.framework import cpp_shape_inference_pb2
    from tensorflow.python.ops import handle_data_util
    result = cpp_shape_inference_pb2.CppShapeInferenceResult
    handle_data_util.set_handle_data(forward, result.HandleData(
        is_set=True, shape_and_type=[result.HandleShapeAndType(dtype=types_pb2.DT_INT32)]))


def _build_for_xla(build, inputs):
    """build() in a graph XLA compiles (jit_compile=True), with the call put
    on the tapes by hand: recorded as usual, the tape would ask for zeros of
    the forward-state output (a variant), which XLA's ZerosLike cannot make
    (TF 2.21 aborts the process), even though nothing uses them.  Symbolic
    tf.gradients is kept from making them by _not_trainable."""
    with _record.stop_recording():
        outputs, forward = build()
    _not_trainable(forward)
    forward.op._set_attr(_XLA_ATTR, _attr_value_pb2.AttrValue(b=True))
    if outputs:
        op = forward.op
        attrs = ("key", op.get_attr("key"))
        # The forward-mode rule is given explicitly: a hand-recorded op gets
        # TF's generic one, which would differentiate the gradient op.
        _record.record_operation(
            OP, list(outputs), inputs, lambda *grads: _input_grads(op, grads),
            forward_function=lambda *tangents: _forward_mode(
                attrs, inputs, list(outputs) + [forward], list(tangents))[:-1])
    return outputs, forward


@_tf_ops.RegisterGradient(GRAD_OP)
def _py_function_grad_grad(op, *grads):
    # A second derivative would need the gradient's own recorded computation;
    # answering None would read as "no dependence", a silently wrong result.
    raise LookupError(
        "pfb.py_function is differentiable once: its gradient has no gradient. "
        "Compute higher derivatives inside the function, or with TF ops outside it")


def _register_vectorization():
    """tf.vectorized_map (and GradientTape.jacobian) run an op they cannot
    vectorize in a loop, but refuse to for an op with a variant output, as
    this one's forward state is: the loop is registered for it here.  (pfor
    is loaded by ``import tensorflow``; a TF without these names keeps
    TF's refusal.)"""
    try:
        from tensorflow.python.ops.parallel_for import pfor
        loop = functools.partial(pfor._fallback_converter,
                                 root_cause="pfb.py_function runs Python per iteration")
        pfor.RegisterPFor(OP)(loop)
    except (ImportError, AttributeError):
        pass


_register_vectorization()


def _forward_mode(attr_tuple, inputs, outputs, tangents):
    """The Jacobian-vector product of one call (tf.autodiff.ForwardAccumulator):
    the function run again, as a py_function of the inputs and their
    tangents, under an accumulator of its own.  TF's generic rule would
    transpose the gradient op, which is not differentiable."""
    attrs = dict(zip(attr_tuple[::2], attr_tuple[1::2]))
    key = attrs["key"].decode() if isinstance(attrs["key"], bytes) else attrs["key"]
    slot = _library.conversion().eager_slot()
    entry = slot.entry if slot.key == key else _registry.lookup(key)
    if entry is None:
        raise LookupError(f"pyfunc_bridge: the function of py_function op {key!r} is gone, "
                          f"so its forward-mode gradient cannot run")
    func = entry.func
    tracked = [i for i, x in enumerate(inputs) if _floating(x.dtype)]
    differentiable = [i for i, y in enumerate(outputs[:-1]) if _floating(y.dtype)]
    if not tracked or not differentiable:
        return [None] * len(outputs)
    tangents = [tf.zeros_like(inputs[i]) if tangents[i] is None else tangents[i]
                for i in tracked]

    def jvp(*args):
        xs = list(args[:len(inputs)])
        with _recording(), tf.autodiff.ForwardAccumulator(
                [xs[i] for i in tracked], list(args[len(inputs):])) as acc:
            ys = list(func(*xs))
        return [acc.jvp(ys[i], unconnected_gradients=tf.UnconnectedGradients.ZERO)
                if isinstance(ys[i], tf.Tensor) else tf.zeros_like(outputs[i])
                for i in differentiable]

    # Under XLA every output needs its static shape; elsewhere the dtypes
    # alone (TF's forward-mode dispatch cannot trace an op's shape attribute).
    xla = (not tf.executing_eagerly() and
           _control_flow_util.GraphOrParentsInXlaContext(_tf_ops.get_default_graph()))
    products = py_function(jvp, list(inputs) + tangents,
                           [tf.TensorSpec(outputs[i].shape, outputs[i].dtype) if xla
                            else outputs[i].dtype for i in differentiable])
    result = [None] * len(outputs)
    for i, product in zip(differentiable, products):
        result[i] = product
    return result


def _register_forward_mode():
    """Gives the op its forward-mode rule (forwardprop is loaded by
    ``import tensorflow``)."""
    try:
        from tensorflow.python.eager import forwardprop
        forwardprop._SPECIAL_CASES[OP] = _forward_mode
    except (ImportError, AttributeError):
        pass


_register_forward_mode()


class _Signature:
    """Tout for py_function: dense specs and composite TypeSpecs, flattened to
    the op's component tensors."""

    def __init__(self, Tout):
        self.single = Tout is not None and not isinstance(Tout, (list, tuple))
        items = [] if Tout is None else [Tout] if self.single else list(Tout)
        self.specs = []
        self.components = []  # per output: its component TensorSpecs
        for i, item in enumerate(items):
            what = "Tout" if self.single else f"Tout[{i}]"
            if isinstance(item, tf.TypeSpec) and not isinstance(item, tf.TensorSpec):
                if not isinstance(item, (tf.RaggedTensorSpec, tf.SparseTensorSpec)):
                    raise TypeError(
                        f"{what}: py_function outputs may be dtypes, tf.TensorSpec, "
                        f"tf.RaggedTensorSpec or tf.SparseTensorSpec, got "
                        f"{type(item).__name__}")
                parts = _nest.flatten(item, expand_composites=True)
            elif isinstance(item, tf.TensorSpec):
                parts = [item]
            else:
                parts = [tf.TensorSpec(None, _tout.dtype_of(item, what))]
            self.specs.append(item)
            self.components.append(parts)
        self.composite = frozenset(
            i for i, spec in enumerate(self.specs)
            if isinstance(spec, (tf.RaggedTensorSpec, tf.SparseTensorSpec)))
        flat = _tout.normalize([part for parts in self.components for part in parts])
        self.dtypes = flat.dtypes
        self.shapes = flat.shapes
        self._check_count = _library.conversion().check_count  # the one count check

    def flatten(self, result):
        """The function's result -> one value per component tensor."""
        n = len(self.specs)
        self._check_count(result, n)
        if n == 0:
            return []
        # A list or tuple holds one value per output; anything else is the one
        # output (as for numpy_function).
        values = result if isinstance(result, (list, tuple)) else (result,)
        flat = []
        for i, (spec, value) in enumerate(zip(self.specs, values)):
            if type(value) is _EagerTensor and i not in self.composite:
                flat.append(value)  # the common case, checked by the kernel
            elif i in self.composite:
                if not isinstance(value, spec.value_type):
                    raise ValueError(
                        f"output {i}: Tout declares {spec} but the function returned "
                        f"{type(value).__name__}; return a {spec.value_type.__name__}")
                if not spec.is_compatible_with(value):
                    raise ValueError(
                        f"output {i}: Tout declares {spec} but the function returned a "
                        f"{type(value).__name__} of spec {tf.type_spec_from_value(value)}; "
                        f"match the declared dtype, shape and ragged_rank")
                flat.extend(_nest.flatten(value, expand_composites=True))
            elif isinstance(value, _ResourceVariable):
                # TF's class (RuntimeError: UnknownError) and its words first.
                raise RuntimeError(
                    f"Attempting to return a variable from an eagerly executed py_func: "
                    f"output {i} is the tf.Variable {value.name!r} (shape {value.shape}, "
                    f"{value.dtype.name}), and outputs are tensors, NumPy arrays or Python "
                    f"values; return its value, variable.read_value()")
            elif isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
                kind = type(value).__name__
                raise ValueError(
                    f"output {i}: the function returned a {kind} but Tout declares a "
                    f"dense tensor; declare Tout=tf.{kind}Spec(...)")
            else:
                flat.append(value)
        return flat

    def pack(self, flat):
        """The op's component tensors -> the declared structure."""
        values = []
        for spec, parts in zip(self.specs, self.components):
            chunk, flat = flat[:len(parts)], flat[len(parts):]
            if isinstance(spec, (tf.RaggedTensorSpec, tf.SparseTensorSpec)):
                values.append(_nest.pack_sequence_as(spec, chunk, expand_composites=True))
            else:
                values.append(chunk[0])
        if self.single:
            return values[0]
        return values  # [] for no outputs, as TF's eager py_function


def _flat_inputs(inp):
    structure = []
    dense = True
    for i, value in enumerate(_op.input_list(inp)):
        if not isinstance(value, tf.Tensor):
            if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
                dense = False
            else:
                value = _op.convert_input(value, f"inp[{i}]")
        structure.append(value)
    flat = structure if dense else _nest.flatten(structure, expand_composites=True)
    _op.check_input_dtypes(flat, "inp (component {})")
    return structure, flat


def _caller(func, structure, signature):
    """What the kernel runs: component tensors in, component values out."""
    composite = any(not isinstance(v, tf.Tensor) for v in structure)
    # Specs rather than the (symbolic) inputs: portable=True pickles the caller.
    specs = [tf.type_spec_from_value(v) for v in structure] if composite else None
    # One dense output: an EagerTensor result is the whole flat list (what
    # signature.flatten makes of it), checked by the conversion layer.
    single_dense = len(signature.specs) == 1 and not signature.composite

    def call(*flat):
        if specs is not None:
            args = _nest.pack_sequence_as(specs, list(flat), expand_composites=True)
        else:
            args = flat
        result = func(*args)
        if single_dense and type(result) is _EagerTensor:
            return (result,)
        try:
            return signature.flatten(result)
        except ValueError as exc:
            # TF's words first (code matches on them), then which output and the fix.
            raise ValueError(
                f"py_function: func={func!r} returned {result!r}, which did not match "
                f"Tout={signature.specs!r}. {exc}") from None
    # The registry key and the statistics name the user's function.
    return functools.update_wrapper(call, func, updated=())


def _py_function(func, inp, Tout, name, portable=False):
    _op.check_callable(func)
    signature = _tout.cached(_Signature, Tout)
    structure, inputs = _flat_inputs(inp)
    call = _caller(func, structure, signature)
    lib = _library.ops()
    op = lib.pyfunc_bridge_py_function
    if tf.executing_eagerly():
        # Record the call for its gradient only when a tape watches it.
        entry_record = _record.should_record_backprop(inputs)
        outputs, forward = _op.run_eagerly(
            OP, op, call, inputs, signature, name, record=entry_record)
    else:
        # A reference names `func`; another process rebuilds the caller around
        # it for dense inputs and outputs only (_resolve._dense_caller).
        dense = not signature.composite and all(isinstance(v, tf.Tensor) for v in structure)
        def build():
            return _op.build_graph_op(OP, op, func, inputs, signature, name,
                                      portable=portable, runs=call, nameable=dense)
        if _control_flow_util.GraphOrParentsInXlaContext(_tf_ops.get_default_graph()):
            outputs, forward = _build_for_xla(build, inputs)
        else:
            outputs, forward = build()
        if not signature.specs:
            # No outputs: the op itself, for Session.run and control
            # dependencies (TF's py_function returns its Operation too).
            return forward.op
    return signature.pack(list(outputs))


def py_function(func=None, inp=None, Tout=None, name=None, *, portable=False,
                executor=None):
    """Wraps a Python function of EagerTensors as a once-differentiable TF op.

    A drop-in for ``tf.py_function``: same arguments, same results, the same
    error classes, on pyfunc_bridge's own kernel (docs/differences.md lists the
    deliberate differences).

    Args:
      func: the Python function.  It receives one EagerTensor per input
        (RaggedTensor/SparseTensor inputs arrive as such), wrapping the op's
        input memory without a copy (host inputs report CPU:0 on any CPU, as
        TF's do).  It may run TF ops, placed under the op's device scope, and
        returns EagerTensors, NumPy arrays, Python scalars, RaggedTensors or
        SparseTensors as Tout declares (None when Tout declares nothing).  A
        NumPy result of another numeric dtype converts where no value
        changes (ints in range, floats narrowed as ``astype`` rounds them);
        otherwise, and for floats declared as ints, it is an
        InvalidArgumentError naming the value.
      inp: a list of tensors, RaggedTensors or SparseTensors.
      Tout: a dtype, a ``tf.TensorSpec`` (declares, and checks, the static
        shape), a ``tf.RaggedTensorSpec``/``tf.SparseTensorSpec``, or a list
        of those; ``[]`` for no outputs (required, as for TensorFlow).
      name: the op's name.
      portable: as for :func:`numpy_function`: also embed the function (with
        what the op needs around it), serialized by cloudpickle, in graph ops.
        Without it, only a module-level function with dense inputs and outputs
        travels, by name.
      executor: only None.  py_function's function takes EagerTensors and is
        differentiated through its tape, both of which exist in this process
        only; any other value is a ValueError (numpy_function and
        array_function take ``executor=``).

    Returns:
      What Tout declares: one value, or a list.  With no outputs: ``[]``
      eagerly, the ``tf.Operation`` in a graph (for ``Session.run`` and
      control dependencies), as ``tf.py_function``.

    The op is differentiable once, in eager mode, in tf.function and in TF1
    graphs: the gradient is that of the TF computation the function ran,
    recorded per call.

    >>> import tensorflow as tf
    >>> x = tf.constant(3.0)
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(x)
    ...     y = py_function(lambda a: a * a, [x], tf.float32)
    >>> float(tape.gradient(y, x))
    6.0
    >>> @py_function(Tout=tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1))
    ... def split(a):
    ...     return tf.RaggedTensor.from_row_lengths(a, [1, 2])
    >>> split(tf.constant([1, 2, 3])).to_list()
    [[1], [2, 3]]
    >>> import numpy as np
    >>> py_function(lambda a: np.array([1, 2]), [x], tf.int32).numpy()  # int64 in range
    array([1, 2], dtype=int32)
    """
    if executor is not None:
        raise ValueError(
            f"py_function takes no executor (got {executor!r}): its function receives "
            f"EagerTensors and records gradients on a tape, which live in this process "
            f"only. Use pfb.numpy_function or pfb.array_function with executor= to run "
            f"a function in worker processes")
    if Tout is None:  # before `func`, as TF: `@py_function(tf.int32)` forgot the name
        raise TypeError(_tout.MISSING_TOUT.replace("numpy_function", "py_function"))
    if func is None:
        return _op.decorator(_py_function, "py_function", inp, Tout, name, portable)
    _op.require_inp(inp, "py_function")
    return _py_function(func, inp, Tout, name, portable)
