from typing import Any, Callable, Literal, Protocol, Sequence, TypeVar, overload

import numpy as np

import tensorflow as tf

_F = TypeVar("_F", bound=Callable[..., Any])
_ToutItem = tf.DType | tf.TensorSpec | type | str
_Tout = _ToutItem | Sequence[_ToutItem]
_Copy = Literal[True, False] | None
_PyToutItem = _ToutItem | tf.RaggedTensorSpec | tf.SparseTensorSpec
_PyTout = _PyToutItem | Sequence[_PyToutItem]

class ProcessPool:
    name: str
    workers: int
    arena_bytes: int
    timeout: float | None
    def __init__(self, workers: int | None = ..., *, arena_bytes: int = ...,
                 name: str | None = ..., timeout: float | None = ...) -> None: ...
    def __enter__(self) -> ProcessPool: ...
    def __exit__(self, *exc: object) -> None: ...
    @property
    def closed(self) -> bool: ...
    def pids(self) -> list[int]: ...
    @property
    def free_input_bytes(self) -> int: ...
    def close(self) -> None: ...

class WorkerError(RuntimeError): ...
class CallTimeoutError(TimeoutError): ...
class PoolClosedError(RuntimeError): ...

_Executor = ProcessPool | Literal["process"] | None

__version__: str

@overload
def numpy_function(
    func: None = ..., inp: None = ..., Tout: _Tout | None = ..., stateful: bool = ...,
    name: str | None = ..., *, copy: _Copy = ..., portable: bool = ...,
    executor: _Executor = ...,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
@overload
def numpy_function(
    func: Callable[..., Any], inp: Sequence[Any] | None, Tout: _Tout,
    stateful: bool = ..., name: str | None = ..., *, copy: _Copy = ...,
    portable: bool = ..., executor: _Executor = ...,
) -> Any: ...
def py_func(
    func: Callable[..., Any], inp: Sequence[Any] | None, Tout: _Tout,
    stateful: bool = ..., name: str | None = ..., *, copy: _Copy = ...,
    portable: bool = ..., executor: _Executor = ...,
) -> Any: ...
@overload
def py_function(
    func: None = ..., inp: None = ..., Tout: _PyTout | None = ..., name: str | None = ...,
    *, portable: bool = ..., executor: None = ...,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
@overload
def py_function(
    func: Callable[..., Any], inp: Sequence[Any] | None, Tout: _PyTout | None,
    name: str | None = ..., *, portable: bool = ..., executor: None = ...,
) -> Any: ...
eager_py_func = py_function

_Framework = Literal["numpy", "torch", "jax", "cupy"]

def array_function(
    func: Callable[..., Any], inp: Sequence[Any] | None, Tout: _Tout, *,
    framework: _Framework, stateful: bool = ..., name: str | None = ..., copy: _Copy = ...,
    portable: bool = ..., executor: _Executor = ...,
) -> Any: ...

def portable(func: _F) -> _F: ...
def trust_pickled(flag: bool = ...) -> bool: ...

class DLPackExporter(Protocol):
    """What pfb.to_dlpack returns: the DLPack protocol, consumable once."""
    def __dlpack__(
        self, *, stream: int | None = ..., max_version: tuple[int, int] | None = ...,
        dl_device: tuple[int, int] | None = ..., copy: bool | None = ...,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

def from_dlpack(obj: Any, *, copy: _Copy = ...) -> tf.Tensor: ...
def to_dlpack(tensor: tf.Tensor, *, copy: _Copy = ...) -> DLPackExporter: ...
def to_numpy(tensor: tf.Tensor, *, copy: _Copy = ...) -> np.ndarray: ...
def from_numpy(array: np.ndarray, *, copy: _Copy = ...) -> tf.Tensor: ...

class FunctionStats:
    calls: int
    errors: int
    bytes_zero_copy: int
    bytes_copied: dict[str, int]
    seconds_in_function: float
    seconds_marshalling: float
    @property
    def bytes_copied_total(self) -> int: ...

class PoolStats:
    calls: int
    seconds_queued: float
    seconds_in_workers: float
    bytes_in: int
    bytes_out: int
    copies_saved: int
    workers_replaced: int
    timeouts: int
    calls_in_kernel: int
    calls_failed: int
    bytes_out_shared: int
    bytes_out_copied: int

class StatsSnapshot:
    functions: dict[str, FunctionStats]
    total: FunctionStats
    enabled: bool
    eager_tensor_path: str
    eager_tensor_missing: tuple[str, ...]
    pools: dict[str, PoolStats]

def stats() -> StatsSnapshot: ...
def reset_stats() -> None: ...
def enable_stats(flag: bool = ...) -> bool: ...
