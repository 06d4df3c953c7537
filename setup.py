"""Build of pyfunc_bridge's compiled layers.

- pyfunc_bridge/_kernels*.so: the TF ops and kernels (C++, src/kernel/),
  built with tf.sysconfig's flags and loaded with tf.load_op_library.
- pyfunc_bridge/_conversion*.so: the Cython conversion layer (src/conversion/).
- pyfunc_bridge/_pool*.so: the pool's module, both sides' (src/pool/:
  the shared-memory layout, arena allocator, rings and NumPy data-memory
  handler), built with NumPy's headers only: workers import neither
  TensorFlow nor the op library.

The first two use the dlpack.h that ships in TensorFlow's wheel.
"""
import glob
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")
TF_COMPILE_FLAGS = tf.sysconfig.get_compile_flags()
TF_LINK_FLAGS = tf.sysconfig.get_link_flags()
TF_CC_LINK_FLAGS = ["-l:libtensorflow_cc.so.2"]
TF_INCLUDES = [f[2:] for f in TF_COMPILE_FLAGS if f.startswith("-I")]
DLPACK_INCLUDE = os.path.join(tf.sysconfig.get_include(), "external", "dlpack", "include")
if not os.path.exists(os.path.join(DLPACK_INCLUDE, "dlpack", "dlpack.h")):
    sys.exit(f"pyfunc_bridge: dlpack.h not found under {DLPACK_INCLUDE}")
# TF's eager TensorHandle header (src/kernel/eager_tensors.cc) includes farmhash.h.
FARMHASH_INCLUDE = os.path.join(tf.sysconfig.get_include(), "external", "farmhash_archive", "src")
# XLA's builder headers (src/kernel/xla_ops.cc) include highwayhash's.
HIGHWAYHASH_INCLUDE = os.path.join(tf.sysconfig.get_include(), "external", "highwayhash")

# Build toggles (not meaning-changing directives): PFB_DEBUG=1 for -O0 -g;
# PFB_SANITIZE=address for AddressSanitizer + UndefinedBehaviorSanitizer on
# both libraries (run with the ASan runtime preloaded: see the README).
DEBUG = os.environ.get("PFB_DEBUG") == "1"
OPT = ["-O0", "-g"] if DEBUG else ["-O2"]
SANITIZE = os.environ.get("PFB_SANITIZE", "")
if SANITIZE not in ("", "address"):
    sys.exit(f"pyfunc_bridge: PFB_SANITIZE={SANITIZE!r}: only 'address' is supported")
SANITIZER_FLAGS = (["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
                   if SANITIZE else [])
# GCC 12 rejects absl's constexpr comparisons of function pointers (in TF's
# headers) under these three UBSan checks; the kernel is built without them.
KERNEL_SANITIZER_FLAGS = SANITIZER_FLAGS + (
    ["-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute"] if SANITIZE else [])

# Recorded so that importing with another TensorFlow fails with a clear error.
with open(os.path.join(HERE, "pyfunc_bridge", "_build_config.py"), "w") as f:
    f.write("# Written by setup.py at build time.\n")
    f.write(f"TF_VERSION = {tf.__version__!r}\n")


# Compile jobs at once: every core unless PFB_BUILD_JOBS says otherwise.
JOBS = int(os.environ.get("PFB_BUILD_JOBS") or len(os.sched_getaffinity(0)))


def _up_to_date(obj, src, depends):
    """Whether `obj` is newer than its source and every file of src/ it may
    include.

    Cython's C counts as the .pyx it comes from: Cython writes it afresh,
    naming the build environment's paths, whenever a cimported .pxd looks
    newer, and pip's isolated build environment unpacks NumPy's afresh at
    each install.  Installed packages' headers (NumPy's, TensorFlow's) do not
    count, for the same reason; they change only with a version (NumPy's
    names the folder of the Cython objects, CYTHON_BUILD_DIR; the kernel
    builds against one TensorFlow minor version, 2.21)."""
    if not os.path.exists(obj):
        return False
    ours = [p for p in depends if os.path.abspath(p).startswith(SRC + os.sep)]
    generated = os.path.relpath(os.path.abspath(src), os.path.join(HERE, CYTHON_BUILD_DIR))
    if not generated.startswith(os.pardir):
        # The .pyx, what it includes and cimports from its folder, and src/'s headers.
        src = os.path.join(HERE, os.path.splitext(generated)[0] + ".pyx")
        ours += glob.glob(os.path.join(os.path.dirname(src), "**", "*.p*"), recursive=True)
        ours += glob.glob(os.path.join(SRC, "*.h")) + glob.glob(os.path.join(SRC, "*.pxd"))
    built = os.path.getmtime(obj)
    return all(os.path.getmtime(p) <= built for p in [src, *ours] if os.path.exists(p))


def _compile_in_parallel(compiler, sources, output_dir=None, macros=None,
                         include_dirs=None, debug=0, extra_preargs=None,
                         extra_postargs=None, depends=None):
    """CCompiler.compile, one source per job, skipping objects that are up to
    date (distutils compiles an extension's sources one after another, all of
    them each time)."""
    macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
    stale = [obj for obj in objects
             if not _up_to_date(obj, build[obj][0], depends or [])]

    def one(obj):
        src, ext = build[obj]
        # A C source in a C++ extension (the kernel's share of src/pool)
        # takes no C++-only flag.
        post = [f for f in extra_postargs if not (ext == ".c" and "c++" in f)]
        compiler._compile(obj, src, ext, cc_args, post, pp_opts)

    with ThreadPoolExecutor(max(1, JOBS)) as pool:
        list(pool.map(one, stale))  # list(): re-raises a failed compile
    return objects


class BuildExt(build_ext):
    """Compiles each extension's sources in parallel and incrementally, and
    without Python's default -g outside debug builds.

    The kernel library is a plain shared object, not a Python module.  It
    keeps the Python-specific suffix (_kernels.cpython-312-x86_64-linux-gnu.so)
    because it calls CPython's thread-state API: one checkout can hold a build
    for each Python."""

    def finalize_options(self):
        super().finalize_options()
        if self.inplace:
            # pip install -e gives each build a fresh temporary build_temp: the
            # checkout's own keeps the objects for the next build, which then
            # compiles only what changed (the folder `setup.py build_ext` uses).
            build = self.get_finalized_command("build")
            self.build_temp = os.path.join(
                HERE, "build", f"temp.{build.plat_name}-{sys.implementation.cache_tag}")

    def build_extensions(self):
        if not DEBUG and not SANITIZE:
            # Python's sysconfig CFLAGS carry -g: debug info triples the objects.
            for attr in self.compiler.executables:
                flags = getattr(self.compiler, attr, None)
                if isinstance(flags, list):
                    setattr(self.compiler, attr, [f for f in flags if f != "-g"])
        compiler = self.compiler
        compiler.compile = (lambda *args, **kwargs:
                            _compile_in_parallel(compiler, *args, **kwargs))
        super().build_extensions()

    def get_export_symbols(self, ext):
        if ext.name == "pyfunc_bridge._kernels":
            return []
        return super().get_export_symbols(ext)


kernels = Extension(
    "pyfunc_bridge._kernels",
    sources=[
        "src/kernel/ops.cc",
        "src/kernel/bridge.cc",
        "src/kernel/inputs.cc",
        "src/kernel/eager_tensors.cc",
        "src/kernel/gpu_stream.cc",
        "src/kernel/numpy_function.cc",
        "src/kernel/pool_route.cc",
        "src/kernel/pool_post.cc",
        "src/kernel/py_function.cc",
        "src/kernel/python_gil.cc",
        "src/kernel/trace.cc",
        "src/kernel/xla_call.cc",
        "src/kernel/xla_gpu.cc",
        "src/kernel/xla_late.cc",
        "src/kernel/xla_sites.cc",
        "src/kernel/xla_ops.cc",
        # The pool's input records and decoder of a DONE, which the kernel
        # calls itself (one rule for both paths), and the record reader.
        "src/pool/input_records.c",
        "src/pool/records.c",
        "src/pool/reply_decode.c",
    ],
    # The headers too: pool_route.cc embeds the dispatcher's structs, so a
    # kernel built against older ones would misread a pool module's memory
    # (not dispatch_internal.h, which the kernel never includes).
    depends=sorted(glob.glob("src/*.h") + glob.glob("src/kernel/*.h")
                   + [h for h in glob.glob("src/pool/*.h") if not h.endswith("_internal.h")]),
    include_dirs=TF_INCLUDES + [DLPACK_INCLUDE, FARMHASH_INCLUDE, HIGHWAYHASH_INCLUDE, "src"],
    extra_compile_args=[f for f in TF_COMPILE_FLAGS if not f.startswith("-I")]
    + OPT + KERNEL_SANITIZER_FLAGS + ["-Wno-deprecated-declarations", "-Wno-sign-compare"],
    # libtensorflow_cc.so.2 holds XLA (XlaOpKernel, the builder, the FFI
    # registry); `import tensorflow` has loaded it before this library.
    extra_link_args=TF_LINK_FLAGS + TF_CC_LINK_FLAGS + KERNEL_SANITIZER_FLAGS,
    language="c++",
)

conversion = Extension(
    "pyfunc_bridge._conversion",
    sources=["src/conversion/_conversion.pyx"],
    include_dirs=[np.get_include(), DLPACK_INCLUDE, "src"],
    # PyDataMem_SetHandler/GetHandler (alloc.pxi) are NumPy 1.22 API: NumPy
    # 2.0-2.2's headers (the newest on Python 3.10) target 1.21 by default and
    # leave them undeclared.
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION"),
                   ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
    extra_compile_args=OPT + SANITIZER_FLAGS,
    extra_link_args=SANITIZER_FLAGS,
)

# No TensorFlow flag, header or library: a worker loads this module.
POOL_C_SOURCES = ["src/pool/arena.c", "src/pool/ring.c", "src/pool/input_records.c",
                  "src/pool/records.c",
                  "src/pool/reply_decode.c", "src/pool/dispatch_life.c",
                  "src/pool/dispatch_queue.c", "src/pool/dispatch_reply.c",
                  "src/pool/dispatch_route.c", "src/pool/dispatch_submit.c"]
pool_worker = Extension(
    "pyfunc_bridge._pool",
    sources=["src/pool/_pool.pyx"] + POOL_C_SOURCES,
    # src/copy_facts.h and dtype_table.h: rules of the conversion layer too.
    depends=sorted(glob.glob("src/pool/*.h") + ["src/copy_facts.h", "src/dtype_table.h"]),
    include_dirs=[np.get_include(), "src/pool", "src"],
    # PyDataMem_SetHandler is NumPy 1.22 API.
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION"),
                   ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
    extra_compile_args=OPT + SANITIZER_FLAGS,
    extra_link_args=SANITIZER_FLAGS,
)

# Generated C per Python and NumPy: it follows the cimported numpy .pxd, so
# builds for two venvs in one checkout must not share it.
CYTHON_BUILD_DIR = os.path.join(
    "build", f"cython-{sys.implementation.cache_tag}-numpy{np.__version__}")

setup(
    ext_modules=[kernels] + cythonize(
        [conversion],
        include_path=["src/conversion", "src/pool", "src"],
        compiler_directives={"language_level": 3},
        build_dir=CYTHON_BUILD_DIR,
        quiet=True,
    ) + cythonize(
        [pool_worker],
        include_path=["src/pool", "src"],
        compiler_directives={"language_level": 3},
        build_dir=CYTHON_BUILD_DIR,
        quiet=True,
    ),
    cmdclass={"build_ext": BuildExt},
)
