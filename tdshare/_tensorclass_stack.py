"""Stacking and concatenating tensorclass instances: through plain tensordicts, then wrapped again.

A tensorclass's tensordict may hold other tensorclasses; :func:`plain_collection` replaces each
by its collection (leaves shared), the tensordicts are stacked or concatenated, and the result is
dressed again in the classes of the first instance.
"""

from __future__ import annotations

from typing import Any

from ._errors import InvalidArgumentError
from ._nodes import kind_of
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase, wrapped_collection

__all__ = ["combine_instances", "plain_collection"]


def plain_collection(td: TensorDictBase) -> TensorDict:
    """``td`` with every wrapped entry (a tensorclass) replaced by its collection; leaves shared."""
    leaves: dict[str, Any] = {}
    for key, value in td._tensordict.items():
        inner = value if isinstance(value, TensorDictBase) else wrapped_collection(value)
        leaves[key] = plain_collection(inner) if inner is not None else value
    return TensorDict._from_leaves(leaves, td.batch_size, td.device, td._names)


Spec = dict[str, tuple[Any, dict[str, Any], Any]]  # key -> (kind or None, fields, spec of the level)


def _spec(td: TensorDictBase) -> Spec:
    out: Spec = {}
    for key, value in td._tensordict.items():
        if isinstance(value, TensorDictBase):
            out[key] = (None, {}, _spec(value))
        elif (kind := kind_of(value)) is not None and kind.unwrap is not None and kind.wrap is not None:
            inner, fields = kind.unwrap(value)
            out[key] = (kind, fields, _spec(inner))
    return out


def _dress(td: TensorDictBase, spec: Spec) -> TensorDictBase:
    for key, (kind, fields, sub) in spec.items():
        child = td._tensordict.get(key)
        if isinstance(child, TensorDictBase):
            _dress(child, sub)
            if kind is not None:
                td._tensordict[key] = kind.wrap(child, fields)
    return td


def combine_instances(items: list[Any], dim: int, new_dim: bool) -> Any:
    """``torch.stack`` (``new_dim``) or ``torch.cat`` of tensorclass instances of one class along ``dim``.

    Raises:
        InvalidArgumentError: an empty sequence, or instances of different classes.
    """
    what = "stack" if new_dim else "cat"
    if not items:
        raise InvalidArgumentError(f"Cannot {what} an empty sequence of tensorclass instances.")
    cls = type(items[0])
    for item in items:
        if type(item) is not cls:
            raise InvalidArgumentError(
                f"Cannot {what} a {type(item).__name__} with instances of {cls.__name__}: all must be of one class."
            )
    plains = [plain_collection(item._tensordict) for item in items]
    out = (TensorDict.stack if new_dim else TensorDict.cat)(plains, dim)
    return cls._from_tensordict(_dress(out, _spec(items[0]._tensordict)))
