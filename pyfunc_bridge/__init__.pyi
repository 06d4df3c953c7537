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
