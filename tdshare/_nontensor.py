"""NonTensorData: a non-tensor value (a string, a number, a JSON document, any object) as a leaf.

``td["label"] = "cat"`` stores ``NonTensorData("cat")``; reading ``td["label"]`` gives back
``"cat"``.  On disk the value is JSON inside the leaf's ``meta.json`` when JSON can hold it
exactly enough (the reference's rule, :func:`tdshare._format.is_json_value`), otherwise
pickled, and pickles are only ever loaded when the caller allows it.
"""

from __future__ import annotations

from typing import Any

from ._format import NONTENSOR_TYPE, VALUE
from ._nodes import NodeKind, register

__all__ = ["NonTensorData", "NONTENSOR"]


class NonTensorData:
    """A non-tensor leaf of a TensorDict: holds ``data``, shared by the views of its tensordict."""

    __slots__ = ("data",)
    data: Any

    def __init__(self, data: Any) -> None:
        if isinstance(data, NonTensorData):
            data = data.data
        self.data = data

    def tolist(self) -> Any:
        """The value (a NonTensorData holds one value, whatever the batch size)."""
        return self.data

    def __eq__(self, other: object) -> bool:
        other_data = other.data if isinstance(other, NonTensorData) else other
        try:
            return bool(self.data == other_data)
        except Exception:  # e.g. ambiguous truth values of array-likes
            return self.data is other_data

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"NonTensorData(data={self.data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (NonTensorData, (self.data,))


NONTENSOR = register(NodeKind("NonTensorData", VALUE, "NonTensorData", NonTensorData, NONTENSOR_TYPE))
