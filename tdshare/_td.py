"""The module path ``tdshare._td``, kept only because pickles made by tdshare 0.1.0 name
``tdshare._td.TensorDict``.  The class lives in :mod:`tdshare._tensordict`."""

from ._tensordict import TensorDict

__all__ = ["TensorDict"]
