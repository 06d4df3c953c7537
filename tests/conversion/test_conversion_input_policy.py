"""The input policy (converters.pxi, _input_arrays; bridge_abi.h, PfbCall.inputs):
under copy=None a function may write its inputs in place.  Memory that is the
call's alone (IS_COPIED: TF's buffer nothing else references, or a copy) is
handed over as a writable zero-copy view; memory TF shares (READ_ONLY) as a
private writable copy, counted as "shared_input"; copy=False keeps read-only
zero-copy views, copy=True private copies.  Fed by a ctypes producer, so the
flags are the test's own."""
import numpy as np
import pytest

import dlpack_ctypes as dl
import pyfunc_bridge as pfb

COPY_MODES = {None: 0, True: 1, False: 2}


def _call(api, registered, flags, copy):
    seen = {}

    def func(a):
        seen["address"] = a.ctypes.data
        seen["writable"] = a.flags.writeable
        seen["values"] = a.copy()
        if a.flags.writeable:
            a += 1  # in place, as augmentation code does
        return np.ascontiguousarray(a * 2)

    producer = dl.Producer()
    x = np.arange(4, dtype=np.float32)
    original = x.copy()
    key = registered(func)
    code, message, outs = dl.call(api, key, [producer.tensor(x, flags=flags)], [dl.spec()],
                                  copy_mode=COPY_MODES[copy])
    assert (code, message) == (0, None)
    assert producer.deleted == 1
    np.testing.assert_array_equal(seen["values"], original)
    for out in outs:
        out.contents.deleter(out)
    return seen, x, original


@pytest.mark.parametrize("copy", [None, True, False])
def test_shared_memory_is_never_written(api, registered, copy):
    seen, x, original = _call(api, registered, dl.READ_ONLY, copy)
    np.testing.assert_array_equal(x, original)  # the producer's memory is unchanged
    if copy is False:
        assert not seen["writable"] and seen["address"] == x.ctypes.data
    else:
        assert seen["writable"] and seen["address"] != x.ctypes.data


def test_memory_that_is_the_calls_alone_is_a_writable_zero_copy_view(api, registered):
    seen, x, original = _call(api, registered, dl.IS_COPIED, None)
    assert seen["writable"] and seen["address"] == x.ctypes.data
    np.testing.assert_array_equal(x, original + 1)  # written where it lives


@pytest.mark.parametrize("copy", [True, False])
def test_other_policies_do_not_write_memory_that_is_the_calls_alone(api, registered, copy):
    seen, x, original = _call(api, registered, dl.IS_COPIED, copy)
    np.testing.assert_array_equal(x, original)
    assert (seen["address"] == x.ctypes.data) == (copy is False)


def test_shared_inputs_are_counted_under_their_own_reason(api, registered, stats_on):
    _call(api, registered, dl.READ_ONLY, None)
    shared = pfb.stats().total
    assert shared.bytes_copied["shared_input"] == 16  # the input, copied
    pfb.reset_stats()
    _call(api, registered, dl.IS_COPIED, None)
    own = pfb.stats().total
    assert own.bytes_copied["shared_input"] == 0
    assert own.bytes_zero_copy == 32  # the input and the fresh result
