"""Functions that tests/pool/test_process_pool_*.py run in worker processes.

A module of its own, importing only the standard library and NumPy: a worker
imports a function's module to run it (functions travel by reference), and
the test modules import TensorFlow, which a worker should not have to load.
"""
import os
import sys
import time

import numpy as np

calls = 0  # what stateful() counts, in whichever process runs it


def plus_one(a):
    return a + 1


def double(a):
    return a * 2


def identity(a):
    return a


def add(a, b):
    return a + b


def returns_a_lambda(a):
    return lambda: a  # pickle cannot send it back


def returns_an_array_and_a_lambda(a):
    return [a * 2, lambda: a]


def _cannot_load():
    raise RuntimeError("this value does not load in the parent")


class LoadsOnlyWhereMade:
    """Pickles in the worker; unpickling it raises."""

    def __reduce__(self):
        return (_cannot_load, ())


def returns_what_does_not_load(a):
    return LoadsOnlyWhereMade()


def pid(_):
    return np.int64(os.getpid())


def slow_pid(seconds):
    """Waits, then returns the worker's pid: holds a worker for a while."""
    time.sleep(float(seconds))
    return np.int64(os.getpid())


def stateful(_):
    global calls
    calls += 1
    return np.int64(calls)


def raises_value_error(_):
    raise ValueError("bad value from the worker")


def raises_key_error(_):
    raise KeyError("missing key in the worker")


class Unpicklable(Exception):
    """An exception that cannot be rebuilt from its pickle."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def raises_unpicklable(_):
    raise Unpicklable("one", "two")


class WorkerCustomError(Exception):
    """A function's own exception that pickles, with an attribute of its own."""

    def __init__(self, message, code=0):
        super().__init__(message, code)
        self.code = code


def raises_custom(_):
    raise WorkerCustomError("custom error from the worker", 7)


def exits(code):
    os._exit(int(code))


def upper(s):
    return np.char.upper(s.astype(bytes)).astype(object)


def to_float(_):
    return 2.5


def returns_none(_):
    return None


def returns_a_bytearray(_):
    return bytearray(b"ab")


def returns_a_bytes_memoryview(_):
    return memoryview(b"ab")


def float64_array(a):
    return np.asarray(a, dtype=np.float64)


def two_results(a):
    return a + 1, a * 2


def view_of_input(a):
    return a[::2]


def torch_square(t):
    return t * t


def _concatenate(items):
    if type(items[0]).__module__.startswith("torch"):
        import torch
        return torch.cat(items)
    return np.concatenate(items)


def _equal(a, b):
    if type(a).__module__.startswith("torch"):
        import torch
        return torch.equal(a, b)
    return np.array_equal(a, b)


def over_blocks(*args):
    """For each input, whether it views a block of the input arena (its
    chain of bases ends at a view of the arena's mapping) rather than being
    a pulled copy."""
    def viewed(a):
        while isinstance(a, np.ndarray):
            a = a.base
        return isinstance(a, memoryview) and not isinstance(a.obj, (bytes, bytearray))
    return np.array([viewed(a) for a in args])


def keeper():
    """A function that keeps every input it is given (an accumulator) and
    returns them all, concatenated: it reads the inputs of earlier calls."""
    kept = []

    def keep(x):
        kept.append(x)
        return _concatenate(kept)
    return keep


def hoarder():
    """A function that keeps every input it is given and returns how many it
    holds."""
    kept = []

    def hoard(x):
        kept.append(x)
        return np.int64(len(kept))
    return hoard


def deduplicator():
    """A function that flags inputs it has seen before (keeping each one)."""
    seen = []

    def is_duplicate(x):
        duplicate = any(_equal(x, s) for s in seen)
        seen.append(x)
        return np.bool_(duplicate)
    return is_duplicate


def keep_last():
    """Keeps only its latest input: each call lets go of the one before."""
    last = []

    def keep(x):
        last[:] = [x]
        return x.sum()
    return keep


def slow_double_in_place(a):
    """Holds the worker a while, then doubles its input in place (NumPy
    under copy=True, or torch) and returns it."""
    time.sleep(0.15)
    a *= 2
    return a


def double_in_place_once_there(path, a):
    """slow_double_in_place, holding the worker until the file `path`
    exists (the test's state, not a time) rather than for a while."""
    wait_for_file(path)
    a *= 2
    return a


def briefly_double_in_place(*arrays):
    """slow_double_in_place of each of its inputs, for a few milliseconds;
    returns their sum."""
    time.sleep(0.003)
    for a in arrays:
        a *= 2
    return sum(arrays)


def _mark():
    """Tells the test that this worker is inside a function: an empty file
    named by its pid in the folder PFB_TEST_MARKS names (if any)."""
    folder = os.environ.get("PFB_TEST_MARKS")
    if folder:
        open(os.path.join(folder, str(os.getpid())), "w").close()


def hang(seconds):
    """Marks, then sleeps: a worker stuck in a function (GIL released)."""
    _mark()
    time.sleep(float(seconds))
    return np.int64(os.getpid())


def spin(seconds):
    """Marks, then loops in pure Python: a stuck worker that holds the GIL."""
    _mark()
    deadline = time.monotonic() + float(seconds)
    n = 0
    while time.monotonic() < deadline:
        n += 1
    return np.int64(os.getpid())


def wait_for_file_after(path, data):
    """wait_for_file, holding an input block (`data`) meanwhile."""
    return wait_for_file(path)


def wait_for_file(path):
    """Marks, then returns once the file `path` exists: holds a worker until
    the test says."""
    _mark()
    path = path.item() if isinstance(path, np.ndarray) else path  # eager: a 0-d array
    path = path.decode() if isinstance(path, bytes) else str(path)
    while not os.path.exists(path):
        time.sleep(0.01)
    return np.int64(os.getpid())


def loaded(names):
    """Which of the modules `names` (bytes) this process has imported: asked
    of a worker, it tells what a function sent to it brought in."""
    return np.array([bytes(name).decode() in sys.modules for name in names])


_kept_results = []


def keeps_its_result(a):
    """Keeps each result and overwrites the one before: a result the worker
    can still change must reach the parent as a copy."""
    if _kept_results:
        _kept_results[-1][...] = -1
    _kept_results.append(a * 2)
    return _kept_results[-1]


def worker_modules(_):
    """Whether this worker loaded TensorFlow, and its compiled module."""
    return np.array(["tensorflow" in sys.modules, "pyfunc_bridge._pool" in sys.modules])


class _NoArray:
    """A result that claims DLPack and fails to give it."""

    def __dlpack__(self, **kwargs):
        raise RuntimeError("this result cannot become an array")

    def __dlpack_device__(self):
        return (1, 0)


def fresh_then_failing(a):
    """A fresh large array, then an item that fails to convert in the worker."""
    return np.ones(a.size, np.float32), _NoArray()
def tensorflow_imported(_):
    """Whether this worker has imported TensorFlow."""
    import sys
    return np.bool_("tensorflow" in sys.modules)


def handles_sigusr1(seconds):
    """Sleeps with a SIGUSR1 handler of its own, which raises: the function
    answers the pool's timeout signal instead of being ended by it."""
    import signal

    def handler(signum, frame):
        raise RuntimeError("SIGUSR1 handled by the function")
    signal.signal(signal.SIGUSR1, handler)
    time.sleep(float(seconds))
    return np.int64(os.getpid())


def type_name(a):
    """The qualified name of the type the function received."""
    return np.array([f"{type(a).__module__}.{type(a).__qualname__}".encode()])


def returns_a_memoryview(a):
    return memoryview(np.asarray(a) * 2)


def returns_an_mmap(a):
    import mmap
    data = (np.asarray(a) * 2).tobytes()
    region = mmap.mmap(-1, len(data))
    region[:] = data
    return region


class ArrayHolder:
    """An object that exports an array (__array__) and does not pickle (it
    holds a lock)."""

    def __init__(self, array):
        import threading
        self.lock = threading.Lock()
        self.array = array

    def __array__(self, dtype=None, copy=None):
        return self.array


def returns_an_array_holder(a):
    return ArrayHolder(np.asarray(a) * 2)


def torch_bfloat16_ones(n):
    """A fresh torch bfloat16 tensor (torch has no NumPy type for it)."""
    import torch
    return torch.ones(int(n), dtype=torch.bfloat16)


def torch_zeros_of(n, dtype):
    """A fresh torch tensor of the torch dtype named by the string `dtype`."""
    import torch
    return torch.zeros(int(n), dtype=getattr(torch, np.asarray(dtype).item().decode()))


_SHARED_BFLOAT16 = []


def shared_torch_bfloat16(_):
    """A torch bfloat16 tensor that stays reachable (module state)."""
    import torch
    if not _SHARED_BFLOAT16:
        _SHARED_BFLOAT16.append(torch.ones(1000, dtype=torch.bfloat16))
    return _SHARED_BFLOAT16[0]


def quarter_mib_of(value):
    """A fresh 1 MiB float32 array (in the result arena: sent without a copy)."""
    return np.full(1 << 18, value, np.float32)


def torch_requires_grad(n):
    """A torch result that requires a gradient."""
    import torch
    return torch.ones(int(n), requires_grad=True) * 2


def double_in_place(a):
    a *= 2  # copy=True: the call's own inputs, writable
    return a


def writable(a):
    return np.bool_(a.flags.writeable)


def as_python_float(a):
    return float(a)


def fail_from_five(a):
    if int(a) >= 5:
        raise ValueError(f"input {int(a)} is too large")
    return a


def hang_at_twenty(i):
    """Element 20 of a map sleeps a minute (a timeout's victim); the others
    answer (i + 1, this worker's pid)."""
    if int(i) == 20:
        time.sleep(60)
    return np.array([int(i) + 1, os.getpid()], np.int64)


def sleep_at_eight(a):
    """Element 8 marks (_mark), then sleeps: a worker busy in a known call."""
    if int(a) == 8:
        _mark()
        time.sleep(30)
    return a


_kept_inputs = []


def keeps_its_input(a):
    """Keeps each input (the worker keeps its block in the input arena) and
    returns twice it."""
    _kept_inputs.append(a)
    return a * 2


def keeps_and_returns_its_input(a):
    """Keeps each input and returns it as it is."""
    _kept_inputs.append(a)
    return a


def is_writable(a):
    """Whether the function may write its input (copy=True, torch)."""
    return np.bool_(a.flags.writeable)


def short_type_name(a):
    """The type the function was handed (a NumPy scalar, an array, a tensor)."""
    return np.bytes_(type(a).__name__.encode())


def total_length(a):
    """The bytes of a string input, all elements together."""
    return np.int64(sum(len(s) for s in np.asarray(a, dtype=object).flat))


class LoadedBy:
    """A callable whose unpickling calls `loader` (as an import that hangs
    or fails would run in the worker)."""

    def __init__(self, loader):
        self.loader = loader

    def __call__(self, x):
        return x

    def __reduce__(self):
        return (self.loader, ())


def hang_when_loaded():
    _mark()
    time.sleep(60)
    return identity


def fail_to_load():
    raise ValueError("this function cannot be loaded")


class SlowToLoad:
    """A callable whose unpickling takes `seconds`, and each call
    `call_seconds` (default: as long)."""

    def __init__(self, seconds, call_seconds=None):
        self.seconds = seconds
        self.call_seconds = seconds if call_seconds is None else call_seconds

    def __call__(self, x):
        time.sleep(self.call_seconds)
        return x

    def __reduce__(self):
        return (load_slowly, (self.seconds, self.call_seconds))


def load_slowly(seconds, call_seconds):
    time.sleep(seconds)
    return SlowToLoad(seconds, call_seconds)


def normalize_in_place(img):
    # As augmentation code writes it for tf.numpy_function.
    img -= 1.0
    img /= 2.0
    return img


def torch_normalize_in_place(t):
    t.sub_(1.0).div_(2.0)
    return t


def keyed_results(a):
    """A dict result: TF's eager numpy_function returns its values by sorted key."""
    return {"b": a, "a": {"c": a + 1}}


def logged_sleep(i, seconds, folder):
    """Sleeps, leaving `<i>.start` (its start time) in `folder` as it starts
    and `<i>.end` as it ends: which calls ran at once, and which ended."""
    folder = folder.decode() if isinstance(folder, bytes) else str(folder)
    with open(os.path.join(folder, f"{int(i)}.start"), "w") as f:
        f.write(repr(time.time()))
    time.sleep(float(seconds))
    with open(os.path.join(folder, f"{int(i)}.end"), "w") as f:
        f.write(repr(time.time()))
    return np.int64(i)


class DeviceArray:
    """A DLPack producer in CUDA memory (it never exports: the bridge refuses
    it on a CPU op first)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("pyfunc_bridge: not to be asked for a device capsule")

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def device_result(_):
    return DeviceArray()


def torch_bits16(_):
    """A torch tensor of a bit type, which torch's own DLPack export refuses."""
    import torch
    return torch.zeros(4, dtype=torch.int16).view(torch.bits16)


class _HangsWhenReleased(bytearray):
    """A buffer whose release hangs (a finalizer stuck on a lock, say)."""

    def __del__(self):
        time.sleep(60)


def hangs_when_released(_):
    """Returns at once; its result's buffer hangs as the worker lets go of it."""
    return np.frombuffer(_HangsWhenReleased(8), np.float64)


class SlowToFreeInWorker:
    """An object whose release, where it was unpickled (a worker), marks
    and then takes `seconds`: work outside any call, as a function that
    holds it is forgotten."""

    def __init__(self, seconds):
        self.seconds, self.unpickled = seconds, False

    def __setstate__(self, state):
        self.__dict__.update(state, unpickled=True)

    def __del__(self):
        if self.unpickled:
            _mark()
            time.sleep(self.seconds)
