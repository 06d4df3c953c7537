"""Functions whose results copy=False refuses in-process (or accepts), for a
pool to refuse exactly as well (tests/pool/test_process_pool_copy.py names
each with its Tout and the reason, test_pool_ring_calls.py runs them over the
rings).  Like process_functions.py, a module that imports only NumPy (torch
inside the functions that need it): workers import it by name."""
import weakref

import numpy as np

SHARED = np.arange(6.0, dtype=np.float32)  # module state: a result that stays reachable


def fresh(x):
    return np.ones((3, 4), np.float32)


def strided(x):
    return np.arange(12.0, dtype=np.float32)[::2]


def transposed(x):
    return np.ones((3, 4), np.float32).T


def fortran_order(x):
    return np.asfortranarray(np.ones((3, 4), np.float32))


def unaligned(x):
    return np.zeros(4 * 8 + 4, np.uint8)[4:].view(np.float32)


def empty_transposed(x):
    return np.ones((0, 3), np.float32).T


def input_itself(x):
    return x


def input_rows(x):
    return x[::2]


def shared_array(x):
    return SHARED


def view_of_shared(x):
    return SHARED[1:]


def second_strided(x):
    return [np.ones(3, np.float32), np.arange(6.0, dtype=np.float32)[::2]]


def strided_of_another_dtype(x):
    return np.arange(6.0)[::2]  # float64: the dtype check comes first


def torch_fresh(x):
    import torch
    return torch.ones(3, 4)


def torch_transposed(x):
    import torch
    return torch.ones(3, 4).t()


def torch_input_rows(x):
    return x[::2]


def torch_view_of_fresh(x):
    import torch
    whole = torch.ones(4)
    return whole[:2]  # `whole` is gone, but its storage is shared by a view


def torch_conjugate(x):
    import torch
    return torch.ones(3, dtype=torch.complex64).conj()


def torch_as_numpy(x):
    return x.numpy()


def large_fresh(x):
    return np.ones(1 << 16, np.float32)  # 256 KiB


def large_transposed(x):
    return np.ones((256, 256), np.float32).T


# The copy facts' rule (src/copy_facts.h), case by case: a weak
# reference, a chain base held elsewhere, an input view, an offset into a
# fresh array, a list result kept by the function.
_WEAK = []
_KEPT = []


def weakly_held(x):
    made = np.ones(4, np.float32)
    _WEAK[:] = [weakref.ref(made)]  # a weak reference can hand it out again
    return made


def view_of_weakly_held(x):
    whole = np.ones(8, np.float32)
    _WEAK[:] = [weakref.ref(whole)]
    return whole[:4]


def input_first_row(x):
    return x[:1]  # TensorFlow's memory, compact and aligned: shared as it is


def aligned_view_of_fresh(x):
    return np.ones(32, np.float32)[16:]  # 64 bytes into a fresh array


def unaligned_view_of_fresh(x):
    return np.ones(20, np.float32)[1:17]


def kept_list(x):
    _KEPT[:] = [[np.ones(4, np.float32)]]
    return _KEPT[0]  # the list stays reachable, and so do its items


def fresh_twice(x):
    made = np.ones(4, np.float32)
    return (made, made)


def torch_input_first_row(x):
    return x[:1]  # a view of the input: TensorFlow's memory, not foreign
