"""The memory-mapping methods a lazy stack does member by member: ``share_memory_``,
``load_memmap_``, ``memmap_refresh_``, and the ``make_memmap*`` refusal (an entry goes into one
member).  :class:`LazyStackMemmap` is a base of :class:`tdshare.LazyStackedTensorDict`, ahead of
the memmap family it overrides.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import InvalidArgumentError, NotSupportedError
from ._keys import NestedKey
from ._read import load_into
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase

__all__ = ["LazyStackMemmap"]

T = TypeVar("T", bound="LazyStackMemmap")


class LazyStackMemmap(TensorDictBase):
    """A lazy stack's memory-mapping methods, member by member (see the module docstring)."""

    if TYPE_CHECKING:  # the lazy stack's own state
        _members: list[TensorDictBase]
        _stack_dim: int
        _stack_dim_name: str | None

    def share_memory_(self: T) -> T:
        """Move every member to shared memory and lock the stack.

        Returns:
            ``self``.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(x=torch.zeros(2)), TensorDict(x=torch.ones(2)))
        >>> _ = ls.share_memory_()
        >>> ls.is_shared(), ls.is_locked, ls.tensordicts[0]["x"].is_shared()
        (True, True, True)
        """
        for td in self._members:
            td.share_memory_()
        self._is_shared = True
        return self.lock_()

    def load_memmap_(
        self: T,
        prefix: str | os.PathLike,
        robust_key: bool | None = True,
        *,
        allow_pickle: bool | None = None,
        mode: str | None = None,
    ) -> T:
        """Load the lazy stack saved in the folder ``prefix`` into this one, member into member.

        Every member is reused (``ls.tensordicts[i]`` stays the same object); a memory-mapped
        stack ends memory-mapped into ``prefix`` and locked.

        Args:
            prefix: the folder a lazy stack was saved into (``memmap``/``memmap_``).
            robust_key: as for :meth:`load_memmap`.
            allow_pickle: as for :meth:`load_memmap`, for the non-tensor values it reads.
            mode: as for :meth:`load_memmap` (``"r"``: read only; the stack gets no folder).

        Returns:
            ``self``.

        Raises:
            InvalidArgumentError: ``prefix`` holds no lazy stack, or one of another member count
                or stack dimension; nothing is changed then.

        >>> import tempfile
        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     _ = LazyStackedTensorDict(TensorDict(a=torch.ones(2)), TensorDict(a=torch.zeros(2))).memmap(path)
        ...     ls = LazyStackedTensorDict(TensorDict(a=torch.full((2,), 9.0)), TensorDict(a=torch.full((2,), 9.0)))
        ...     first = ls.tensordicts[0]
        ...     print(ls.load_memmap_(path)["a"].tolist(), ls.tensordicts[0] is first)
        [[1.0, 1.0], [0.0, 0.0]] True
        """
        path = os.path.abspath(os.fspath(prefix))
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"load_memmap_ of a lazy stack reads a saved folder; {path!r} is not one.")
        found: Any = TensorDict.load_memmap(path, robust_key=robust_key, allow_pickle=allow_pickle, mode=mode)
        if not isinstance(found, LazyStackMemmap):
            raise InvalidArgumentError(f"{path!r} holds a {type(found).__name__}, not a LazyStackedTensorDict.")
        if len(found._members) != len(self._members) or found._stack_dim != self._stack_dim:
            raise InvalidArgumentError(
                f"{path!r} holds a lazy stack of {len(found._members)} members along dim {found._stack_dim}; "
                f"this one has {len(self._members)} along dim {self._stack_dim}."
            )
        was_memmap = self._is_memmap
        for i, td in enumerate(self._members):
            load_into(td, os.path.join(path, str(i)), robust_key, allow_pickle=allow_pickle, mode=mode)
        self._stack_dim_name = found._stack_dim_name
        self._memmap_prefix = path if mode != "r" else None
        if was_memmap and self._memmap_prefix is not None:
            self._is_memmap = self._is_locked = True
        return self

    def memmap_refresh_(self: T, *, allow_pickle: bool | None = None) -> T:
        """Refresh every member: map the entries other processes added since (see ``TensorDict.memmap_refresh_``).

        Args:
            allow_pickle: as for :meth:`load_memmap`, for the non-tensor values it reads.

        Returns:
            ``self``.

        Raises:
            NotMemmapError: a member is not memory-mapped (``memmap_()`` a ``load_memmap()`` result first).

        >>> import tempfile
        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     writer = LazyStackedTensorDict(TensorDict(a=torch.ones(2)), TensorDict(a=torch.zeros(2))).memmap_(path)
        ...     reader = LazyStackedTensorDict.load_memmap(path).memmap_()  # another process, usually
        ...     _ = writer.tensordicts[0].make_memmap_from_tensor("b", torch.arange(2.0))
        ...     print("b" in reader.tensordicts[0], reader.memmap_refresh_().tensordicts[0]["b"].tolist())
        False [0.0, 1.0]
        """
        for td in self._members:
            td.memmap_refresh_(allow_pickle=allow_pickle)  # type: ignore[attr-defined]
        return self

    def make_memmap(self, key: NestedKey, *args: Any, **kwargs: Any) -> Any:
        """Not for a lazy stack: add the entry to a member (``ls.tensordicts[i].make_memmap``).

        Args:
            key: the entry that was to be added.
            *args: ignored (the arguments of ``TensorDict.make_memmap``).
            **kwargs: ignored.

        Raises:
            NotSupportedError: always; the message names the member method to call.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> try:
        ...     LazyStackedTensorDict(TensorDict(), TensorDict()).make_memmap("w", shape=(2,))
        ... except NotImplementedError as e:
        ...     print(type(e).__name__)
        NotSupportedError
        """
        raise NotSupportedError(
            f"make_memmap({key!r}) adds an entry to one level; call it on a member: ls.tensordicts[i].make_memmap()."
        )

    make_memmap_from_tensor = make_memmap
    make_memmap_from_storage = make_memmap
