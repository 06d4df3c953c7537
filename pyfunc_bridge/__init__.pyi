from typing import Any, Callable, Literal, Sequence, TypeVar, overload

import tensorflow as tf

_F = TypeVar("_F", bound=Callable[..., Any])
_ToutItem = tf.DType | tf.TensorSpec | type | str
_Tout = _ToutItem | Sequence[_ToutItem]
_Copy = Literal[True, False] | None
_PyToutItem = _ToutItem | tf.RaggedTensorSpec | tf.SparseTensorSpec
_PyTout = _PyToutItem | Sequence[_PyToutItem]

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
@overload
def py_function(
    func: None = ..., inp: None = ..., Tout: _PyTout | None = ..., name: str | None = ...,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
@overload
def py_function(
    func: Callable[..., Any], inp: Sequence[Any] | None, Tout: _PyTout | None,
    name: str | None = ...,
) -> Any: ...
