"""Small operations of the reference's tensordict surface that belong to no other family:
:meth:`to_tensordict` (a plain copy) and :meth:`param_count`, as a mixin of
:class:`~tdshare.TensorDictBase` (lazy stacks and tensorclasses override ``to_tensordict``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GenericOps"]


class GenericOps:
    """``to_tensordict()`` and ``param_count()``; the host provides ``clone`` and ``values``."""

    def to_tensordict(self, *, retain_none: bool | None = None) -> Any:
        """A copy of this tensordict whose leaves own their memory (not shared, not memory-mapped).

        Args:
            retain_none: accepted as in the reference (entries holding None are always kept).

        Returns:
            A new unlocked tensordict with the same keys, batch size and values.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2]).lock_()
        >>> copy = td.to_tensordict()
        >>> copy.is_locked, copy["a"].data_ptr() == td["a"].data_ptr()
        (False, False)
        """
        host: Any = self
        out = host.clone()
        if out.is_locked:
            out.unlock_()
        return out

    def param_count(self, *, count_duplicates: bool = True) -> int:
        """The number of elements in the tensor leaves (nested ones included).

        Args:
            count_duplicates: count a tensor entered under several keys once per key (``False``:
                once; only the same tensor object counts as a duplicate, not another view of it).

        Returns:
            The total ``numel()`` of the leaves.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), b=torch.zeros(6))
        >>> td["c"] = td["a"]
        >>> td.param_count(), td.param_count(count_duplicates=False)
        (12, 9)
        """
        host: Any = self
        values = [v for v in host.values(True, True) if isinstance(v, torch.Tensor)]
        if not count_duplicates:
            values = list({id(v): v for v in values}.values())
        return sum(v.numel() for v in values)
