"""A ctypes DLPack producer for tests: the test suite's one copy of the
dlpack.h and bridge_abi.h layouts, used to feed the conversion layer malformed
tensors and count deleter calls."""
import ctypes

kDLCPU, kDLCUDA = 1, 2
PFB_CALL_TENSORS = 2
kDLInt, kDLUInt, kDLFloat, kDLOpaqueHandle, kDLBfloat, kDLComplex, kDLBool = 0, 1, 2, 3, 4, 5, 6


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
    ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):  # legacy (pre-1.0) layout
    pass


LEGACY_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", LEGACY_DELETER)]

READ_ONLY, IS_COPIED = 1, 2

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The destructor sees a capsule whose reference count is already 0: it takes a
# raw pointer, never a py_object (which would revive and free it again).
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_name_raw = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_GetName", ctypes.pythonapi))


def capsule_name(capsule):
    return _capsule_name(capsule).decode()


def capsule_tensor(capsule):
    """(managed struct, its DLTensor) of an unconsumed capsule of either kind."""
    name = _capsule_name(capsule)
    kind = DLManagedTensorVersioned if name == b"dltensor_versioned" else DLManagedTensor
    managed = ctypes.cast(_capsule_pointer(capsule, name), ctypes.POINTER(kind)).contents
    return managed, managed.dl_tensor


class PfbOutputSpec(ctypes.Structure):
    _fields_ = [("dtype", DLDataType), ("ndim", ctypes.c_int32),
                ("dims", ctypes.POINTER(ctypes.c_int64)), ("device", DLDevice)]


class PfbCall(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("key_len", ctypes.c_size_t),
                ("copy_mode", ctypes.c_int32), ("flags", ctypes.c_int32),
                ("num_inputs", ctypes.c_int32),
                ("inputs", ctypes.POINTER(ctypes.POINTER(DLManagedTensorVersioned))),
                ("num_outputs", ctypes.c_int32),
                ("output_specs", ctypes.POINTER(PfbOutputSpec)),
                ("outputs", ctypes.POINTER(ctypes.POINTER(DLManagedTensorVersioned))),
                ("device_name", ctypes.c_char_p), ("stream", ctypes.c_void_p),
                ("state", ctypes.c_void_p),
                ("reference", ctypes.c_char_p), ("reference_len", ctypes.c_size_t),
                ("pickled", ctypes.c_char_p), ("pickled_len", ctypes.c_size_t),
                ("framework", ctypes.c_char_p), ("framework_len", ctypes.c_size_t),
                # A PfbEagerApi*: none here (py_function inputs through DLPack).
                ("eager", ctypes.c_void_p),
                ("site", ctypes.POINTER(ctypes.c_void_p)),
                ("node_name", ctypes.c_char_p), ("node_name_len", ctypes.c_size_t),
                # A kernel's native pool route slot, and a native call's reply
                # (bridge_abi.h, ABI 6): NULL, none.
                ("route", ctypes.c_void_p), ("reply", ctypes.c_void_p)]


class PfbStatus(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int32), ("message", ctypes.c_void_p)]


# The call needs the GIL: PYFUNCTYPE keeps it held across the call.
CALL = ctypes.PYFUNCTYPE(ctypes.c_int32, ctypes.POINTER(PfbCall), ctypes.POINTER(PfbStatus))


class PfbBridgeApi(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int32), ("call", CALL)]


def bridge_api(capsule):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return ctypes.cast(get(capsule, b"pyfunc_bridge._conversion._bridge_api"),
                       ctypes.POINTER(PfbBridgeApi)).contents


class Producer:
    """Makes DLPack tensors (structs or capsules of either kind) over NumPy
    arrays, malformed on request; counts deleter calls."""

    def __init__(self):
        self.deleted = 0
        self._keep = []
        self._deleter = DELETER(self._delete)
        self._legacy_deleter = LEGACY_DELETER(self._delete)
        self._destructor = CAPSULE_DESTRUCTOR(self._destroy)

    def _delete(self, managed):
        self.deleted += 1

    def _destroy(self, capsule):
        # Like real producers: only a capsule nobody consumed frees its tensor.
        if _capsule_name_raw(capsule) in (b"dltensor", b"dltensor_versioned"):
            self.deleted += 1

    def tensor(self, array, *, ndim=None, shape=None, dtype=None, null_shape=False,
               strides=None, versioned=True, version=(1, 1), device=(kDLCPU, 0),
               null_data=False, flags=READ_ONLY, byte_offset=0):
        shape = list(array.shape) if shape is None else shape
        shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        if versioned:
            m = DLManagedTensorVersioned()
            m.version = DLPackVersion(*version)
            m.deleter = self._deleter
            m.flags = flags
        else:
            m = DLManagedTensor()
            m.deleter = self._legacy_deleter
        t = m.dl_tensor
        t.data = None if null_data else array.ctypes.data
        t.byte_offset = byte_offset
        t.device = DLDevice(*device)
        t.ndim = len(shape) if ndim is None else ndim
        t.dtype = dtype or DLDataType(kDLFloat, 32, 1)
        t.shape = None if null_shape else ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
        if strides is not None:
            strides_arr = (ctypes.c_int64 * len(strides))(*strides)
            self._keep.append(strides_arr)
            t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
        self._keep += [array, shape_arr, m]
        return m

    def capsule(self, array, *, versioned=True, name=None, **kwargs):
        """A capsule over `array` (float32 unless dtype= says otherwise)."""
        m = self.tensor(array, versioned=versioned, **kwargs)
        name = name or (b"dltensor_versioned" if versioned else b"dltensor")
        self._keep.append(name)
        return _capsule_new(ctypes.addressof(m), name,
                            ctypes.cast(self._destructor, ctypes.c_void_p))


class Exporter:
    """An object with the DLPack protocol around one capsule; records the
    keywords its consumer passed."""

    def __init__(self, capsule, device=(kDLCPU, 0), legacy_only=False):
        self.capsule = capsule
        self.device = device
        self.legacy_only = legacy_only
        self.calls = []

    def __dlpack__(self, **kwargs):
        if self.legacy_only and "max_version" in kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.calls.append(kwargs)
        return self.capsule

    def __dlpack_device__(self):
        return self.device


def call(api, key, inputs, out_specs, copy_mode=0, flags=0, reference=b"", pickled=b"",
         framework=b"", site=None):
    """Runs api.call; returns (code, message, outputs).  `reference`,
    `pickled`, `framework`: the op's portable description (bytes).  `site`:
    a ctypes.c_void_p standing for a kernel's PfbCall.site slot (None: no
    slot); the caller releases what the callee leaves there (release_site)."""
    key_b = key.encode()
    in_arr = (ctypes.POINTER(DLManagedTensorVersioned) * max(len(inputs), 1))(
        *[ctypes.pointer(m) for m in inputs])
    specs = (PfbOutputSpec * max(len(out_specs), 1))(*out_specs)
    outs = (ctypes.POINTER(DLManagedTensorVersioned) * max(len(out_specs), 1))()
    c = PfbCall(key_b, len(key_b), copy_mode, flags, len(inputs), in_arr, len(out_specs), specs,
                outs)
    # Length-delimited, like the kernel's: pickles hold NUL bytes.
    c.reference, c.reference_len = reference, len(reference)
    c.pickled, c.pickled_len = pickled, len(pickled)
    c.framework, c.framework_len = framework, len(framework)
    c.eager = None
    if site is not None:
        c.site = ctypes.pointer(site)
    status = PfbStatus()
    code = api.call(ctypes.byref(c), ctypes.byref(status))
    message = ctypes.string_at(status.message).decode() if status.message else None
    if status.message:
        ctypes.CDLL(None).free(ctypes.c_void_p(status.message))
    return code, message, [outs[i] for i in range(len(out_specs))]


def spec(code=kDLFloat, bits=32, shape=None, device=(kDLCPU, 0)):
    dims = None
    if shape is not None:
        dims = ctypes.cast((ctypes.c_int64 * max(len(shape), 1))(*shape),
                           ctypes.POINTER(ctypes.c_int64))
    return PfbOutputSpec(DLDataType(code, bits, 1), -1 if shape is None else len(shape), dims,
                         DLDevice(*device))


def release(outputs):
    """Calls the deleter of each output a bridge call returned."""
    for m in outputs:
        if m:
            m.contents.deleter(m)


def site_object(site):
    """The object a kernel's site slot holds (a new reference), or None."""
    if not site.value:
        return None
    return ctypes.cast(site.value, ctypes.py_object).value


def release_site(site):
    """What a kernel does when it goes: drops the object in its site slot."""
    if site.value:
        ctypes.pythonapi.Py_DecRef(ctypes.c_void_p(site.value))
        site.value = None
