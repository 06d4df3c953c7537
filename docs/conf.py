"""Sphinx configuration of pyfunc_bridge's documentation site.

Build: python -m sphinx -W -b html docs docs/_build/html
Examples: python -m sphinx -b doctest docs docs/_build/doctest
"""
import doctest
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "_ext"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

project = "pyfunc_bridge"
author = "the pyfunc_bridge authors"
copyright = "the pyfunc_bridge authors"
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "pyi_signatures",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autosummary_generate = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# The docstrings' "Raises:" sections are prose with examples, not "Type: text" lists.
napoleon_custom_sections = ["Raises"]

html_theme = "furo"
html_title = "pyfunc_bridge"

# Every example runs under the doctest builder (sphinx -b doctest); each page's
# examples share these names and a scratch folder.
doctest_global_setup = """
__name__ = "__main__"  # as in a script: TensorFlow's tracing looks the module up
import os, tempfile
import numpy as np
import tensorflow as tf
import pyfunc_bridge as pfb
import _examples
try:
    import torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
HAVE_GPU = bool(tf.config.list_physical_devices("GPU"))
"""
doctest_default_flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
