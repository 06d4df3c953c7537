"""Runs the malformed-tensor property of test_conversion_fuzz.py under the
hypothesis profile argv[1] and prints its counts as a "FIGURES {json}"
line.  A crash must not take pytest down, hence a fresh interpreter; each
case is written to $PFB_FUZZ_LAST first, so the test can name the one that
crashed.

Run by tests/conversion/test_conversion_fuzz.py (tests/fresh_python.py),
with tests/ and tests/conversion/ on the path."""
import json
import sys

import conftest  # noqa: F401  (registers the hypothesis profiles)
from hypothesis import settings

settings.load_profile(sys.argv[1])
import test_conversion_fuzz as fuzz  # noqa: E402

fuzz.malformed_inner()
print("FIGURES " + json.dumps(dict(fuzz.FIGURES)))
