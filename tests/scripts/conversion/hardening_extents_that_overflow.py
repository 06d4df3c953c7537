"""Offers from_dlpack, in both capsule kinds, each case of argv[1] (a JSON
list of [capsule keywords, words of the BufferError]; "dtype" as [code,
bits]) and prints one line per case: REFUSED, WRONG MESSAGE or ACCEPTED;
then how many capsules the producer freed.  Some cases crashed before
their fix, hence a fresh interpreter.

Run by tests/conversion/test_conversion_hardening.py
(tests/fresh_python.py), with tests/ on the path."""
import json
import re
import sys

import numpy as np

import pyfunc_bridge as pfb
import dlpack_ctypes as dl

conv = pfb._library.conversion()
producer = dl.Producer()
with conv.aligned_allocation():
    a = np.arange(10, dtype=np.float32)
cases = json.loads(sys.argv[1])
for versioned in (True, False):
    for kwargs, words in cases:
        kwargs = dict(kwargs)
        if "dtype" in kwargs:
            kwargs["dtype"] = dl.DLDataType(*kwargs["dtype"], 1)
        capsule = producer.capsule(a, versioned=versioned, **kwargs)
        try:
            t = pfb.from_dlpack(capsule)
        except BufferError as e:
            ok = re.search(words, str(e)) and dl.capsule_name(capsule) in (
                "dltensor", "dltensor_versioned")
            print("REFUSED" if ok else "WRONG MESSAGE", kwargs, e, flush=True)
        else:
            print("ACCEPTED", kwargs, t.shape, flush=True)
        del capsule
print("deleted", producer.deleted)
