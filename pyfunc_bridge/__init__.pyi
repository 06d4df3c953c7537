from typing import Any, Callable, Literal, Sequence, TypeVar, overload

import tensorflow as tf

_F = TypeVar("_F", bound=Callable[..., Any])
_ToutItem = tf.DType | tf.TensorSpec | type | str
_Tout = _ToutItem | Sequence[_ToutItem]
_Copy = Literal[True, False] | None

__version__: str

@overload
def numpy_function(
    func: None = ..., inp: None = ..., Tout: _Tout | None = ..., stateful: bool = ...,
    name: str | None = ..., *, copy: _Copy = ...,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
@overload
def numpy_function(
    func: Callable[..., Any], inp: Sequence[Any] | None, Tout: _Tout,
    stateful: bool = ..., name: str | None = ..., *, copy: _Copy = ...,
) -> Any: ...
def py_func(
    func: Callable[..., Any], inp: Sequence[Any] | None, Tout: _Tout,
    stateful: bool = ..., name: str | None = ..., *, copy: _Copy = ...,
) -> Any: ...

class FunctionStats:
    calls: int
    errors: int
    bytes_zero_copy: int
    bytes_copied: dict[str, int]
    seconds_in_function: float
    seconds_marshalling: float
    @property
    def bytes_copied_total(self) -> int: ...

class StatsSnapshot:
    functions: dict[str, FunctionStats]
    total: FunctionStats
    enabled: bool

def stats() -> StatsSnapshot: ...
def reset_stats() -> None: ...
def enable_stats(flag: bool = ...) -> bool: ...
