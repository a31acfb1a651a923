"""Many small copies as one indexed copy: the packing and unpacking of :mod:`tdshare.distributed`.

Copying 1,000 small leaves into one flat buffer (or back) costs one ``copy_`` each, about
300 ns of dispatch apiece for a few hundred bytes of data: ``torch._foreach_copy_`` on the CPU
and ``torch.cat`` run that per-tensor loop too.  :class:`FusedCopy` does the same copies with
one or two indexed kernels: each side is seen as one *span*, a 1-D tensor over the address range
its tensors lie in (a view of memory that is already there, made with ``torch.frombuffer`` of a
``ctypes`` array at that address: nothing is allocated and nothing outside the tensors is ever
read or written), and an index of the words those tensors hold in it.  A gather reads rows of the
widest power of two bytes, up to 4 KiB, that every address and size allows (rows of 64 bytes, as
torch's allocator aligns, gather eight times faster than single bytes); a scatter writes words of
at most 16 bytes (``complex128`` elements, moved as bytes) with ``scatter_``, whose CPU kernel
measured 2.5-3x faster than ``index_copy_`` of rows for 1,000 leaves of 64-256 bytes (11.5 against
31 µs for 230 KB), for a larger index (8 bytes a word).  A side whose tensors lie back to back in
order (a packed buffer) needs no index: its span is that region.  The copy is then one
``index_select`` (into a packed buffer), one ``scatter_`` (out of one), or both.

Only CPU tensors that are contiguous qualify, destinations that do not overlap, and at most
:data:`SPAN_WORDS` words in all (the index costs 8 bytes a word); :func:`fused_copy` returns None
otherwise, and the caller copies tensor by tensor.  The copies are bit for bit (bools and every
other dtype alike: only bytes move); like ``torch.distributed.recv``, they do not move the version
counters of the tensors written.

>>> import torch
>>> leaves = [torch.zeros(3), torch.zeros(5)]
>>> flat = torch.arange(8.0)
>>> copy = fused_copy(leaves, list(flat.split([3, 5])))
>>> copy is not None
True
>>> copy()
>>> leaves[1].tolist()
[3.0, 4.0, 5.0, 6.0, 7.0]
"""

from __future__ import annotations

import ctypes
from itertools import pairwise

import torch

__all__ = ["SPAN_WORDS", "FusedCopy", "fused_copy"]

SPAN_WORDS = 1 << 22  # at most this many words (an int64 index each: 32 MiB) in one fused copy
_UNITS = [1 << k for k in range(12, -1, -1)]  # a word: 4 KiB down to one byte
_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}
_SCATTER_WORD = 16  # the widest word a scatter writes (see the module docstring)


class _Side:
    """One side of a fused copy: its span and, unless its tensors are one run in order, the
    index of their words in it (``scatter``: the side written, in words of at most 16 bytes)."""

    def __init__(self, ptrs: list[int], sizes: list[int], unit: int, scatter: bool = False) -> None:
        lo = min(ptrs)
        hi = max(p + n for p, n in zip(ptrs, sizes, strict=True))
        self.run = all(p == lo + at for p, at in zip(ptrs, _starts(sizes), strict=True))
        if scatter and not self.run and sum(sizes) // min(unit, _SCATTER_WORD) <= SPAN_WORDS:
            unit = min(unit, _SCATTER_WORD)  # written by scatter_ (see the module docstring)
        self.unit = unit
        self.buffer = (ctypes.c_char * (hi - lo)).from_address(lo)  # kept: the span's memory holder
        self.words = _words(torch.frombuffer(self.buffer, dtype=torch.uint8), unit)
        self.index: torch.Tensor | None = None
        if not self.run:
            starts = torch.tensor([(p - lo) // unit for p in ptrs], dtype=torch.int64)
            lengths = torch.tensor([n // unit for n in sizes], dtype=torch.int64)
            total = int(lengths.sum())
            firsts = torch.tensor(_starts([n // unit for n in sizes]), dtype=torch.int64)
            self.index = torch.repeat_interleave(starts - firsts, lengths, output_size=total) + torch.arange(total)


def _words(flat: torch.Tensor, unit: int) -> torch.Tensor:
    """The bytes ``flat`` as words of ``unit`` bytes: 1-D up to 16 bytes, else rows of int64."""
    return flat.view(_DTYPES[unit]) if unit in _DTYPES else flat.view(torch.int64).view(-1, unit // 8)


def _starts(sizes: list[int]) -> list[int]:
    """Where each of ``sizes`` starts when they are laid back to back."""
    out, at = [], 0
    for n in sizes:
        out.append(at)
        at += n
    return out


def _overlap(ptrs: list[int], sizes: list[int]) -> bool:
    ranges = sorted(zip(ptrs, sizes, strict=True))
    return any(p < q + m for (q, m), (p, _) in pairwise(ranges))


class FusedCopy:
    """Copies each of ``src`` into its ``dst`` (contiguous CPU tensors of equal byte sizes) with
    one or two indexed kernels; built by :func:`fused_copy`.  It holds the tensors, so their
    memory lives as long as it does.

    >>> import torch
    >>> a, b = torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    >>> packed = torch.zeros(5, dtype=torch.int64)
    >>> pack = fused_copy([packed[:2], packed[2:]], [a + 1, b + 2])
    >>> pack is not None and (pack(), packed.tolist())[1]
    [1, 1, 2, 2, 2]
    """

    def __init__(self, dst: list[torch.Tensor], src: list[torch.Tensor], unit: int) -> None:
        self._tensors = (dst, src)
        sizes = [t.numel() * t.element_size() for t in dst]
        self.unit = unit
        self.nbytes = sum(sizes)
        self.dst = _Side([t.data_ptr() for t in dst], sizes, unit, scatter=True)
        self.src = _Side([t.data_ptr() for t in src], sizes, unit)
        # a packed source scattered: seen once in the scatter's words
        packed = self.src.index is None and self.dst.index is not None
        self._packed = _words(torch.frombuffer(self.src.buffer, dtype=torch.uint8), self.dst.unit) if packed else None

    def words(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (a contiguous CPU tensor of this copy's byte size) as the words :meth:`__call__`
        writes with ``words=``: made once for a buffer used again and again."""
        return _words(out.view(torch.uint8).view(-1), self.dst.unit)

    def __call__(self, words: torch.Tensor | None = None) -> None:
        """Do the copies; ``words``: write the packed destination there instead, as :meth:`words`
        of another tensor of the same bytes (only where the destinations are one run)."""
        dst, src = self.dst, self.src
        target = dst.words if words is None else words
        with torch.no_grad():
            if dst.index is None:
                if src.index is None:
                    target.copy_(src.words)
                else:
                    torch.index_select(src.words, 0, src.index, out=target)
                return
            assert words is None, "words= only where the destinations are one run"
            if src.index is not None:  # gathered first, then seen as the same bytes in the scatter's words
                values = _words(src.words.index_select(0, src.index).view(torch.uint8).view(-1), dst.unit)
            else:
                assert self._packed is not None  # (made for a packed source)
                values = self._packed
            target.scatter_(0, dst.index, values)


def fused_copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> FusedCopy | None:
    """A :class:`FusedCopy` of every ``src`` into its ``dst``, or None where one does not qualify
    (see the module docstring); empty tensors are left out.

    Args:
        dst: the tensors to write (contiguous, on the CPU, not overlapping).
        src: as many tensors to read, each of its ``dst``'s byte size.

    Returns:
        the copy to call, or None (copy tensor by tensor then).
    """
    pairs = [(d, s) for d, s in zip(dst, src, strict=True) if d.numel()]
    if not pairs:
        return None
    ptrs: list[int] = []
    sizes: list[int] = []
    for d, s in pairs:
        n = d.numel() * d.element_size()
        if (
            d.device.type != "cpu"
            or s.device.type != "cpu"
            or not d.is_contiguous()
            or not s.is_contiguous()
            or s.numel() * s.element_size() != n
        ):
            return None
        ptrs.extend((d.data_ptr(), s.data_ptr()))
        sizes.append(n)
    unit = next(u for u in _UNITS if all(p % u == 0 for p in ptrs) and all(n % u == 0 for n in sizes))
    if sum(sizes) // unit > SPAN_WORDS or _overlap(ptrs[0::2], sizes):
        return None
    return FusedCopy([d for d, _ in pairs], [s for _, s in pairs], unit)
