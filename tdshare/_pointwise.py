"""Pointwise functions of tensordicts: ``exp``, ``log``, ``sqrt``, ``sigmoid``, ``isnan``... (the
reference's single-argument functions), each with its in-place ``_`` twin.

A mixin of :class:`tdshare._tensordict_base.TensorDictBase`.  The methods are generated from one
table (``UNARY``) by :func:`_unary` and :func:`_unary_`, each a class attribute, so ``help()``,
``dir()`` and type checkers see them.  The out-of-place forms give a new tree (names and lock
kept, non-tensor values kept); the in-place forms write into the stored leaves, memory-mapped
files included, and return ``self``.  A plain tree gets one ``torch._foreach_*`` call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._errors import ArgumentTypeError
from ._key_ops import tensor_entries
from ._tree_walk import foreach_leaves, walk

__all__ = ["LIKE_FUNCTIONS", "LOSS_FUNCTIONS", "PointwiseOps", "TORCH_FUNCTIONS", "UNARY"]

# the single-argument functions: name -> what the result holds (for the generated docstring)
UNARY: dict[str, str] = {
    "abs": "absolute values",
    "acos": "arc cosines",
    "asin": "arc sines",
    "atan": "arc tangents",
    "ceil": "values rounded up",
    "cos": "cosines",
    "cosh": "hyperbolic cosines",
    "erf": "error function values",
    "erfc": "complementary error function values",
    "exp": "exponentials",
    "expm1": "``exp(x) - 1`` values",
    "floor": "values rounded down",
    "frac": "fractional parts",
    "lgamma": "log-gamma values",
    "log": "natural logarithms",
    "log10": "base-10 logarithms",
    "log1p": "``log(1 + x)`` values",
    "log2": "base-2 logarithms",
    "neg": "negated values",
    "reciprocal": "reciprocals",
    "round": "values rounded to the nearest integer",
    "sigmoid": "logistic sigmoids",
    "sign": "signs (-1, 0 or 1)",
    "sin": "sines",
    "sinh": "hyperbolic sines",
    "sqrt": "square roots",
    "tan": "tangents",
    "tanh": "hyperbolic tangents",
    "trunc": "values rounded toward zero",
}


def _unary(name: str, what: str) -> Callable[[Any], Any]:
    fn = getattr(torch, name)

    def method(self: Any) -> Any:
        done = foreach_leaves(self, name, (), inplace=False)
        return walk(self, fn, (), inplace=False) if done is None else done

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"A new tensordict whose tensor leaves are the {what} of this one's (``torch.{name}`` leaf by leaf).\n\n"
        "Non-tensor values are kept; the result keeps the names and the lock.  The in-place form is\n"
        f"``{name}_()``.\n\n"
        ">>> import torch\n>>> from tdshare import TensorDict\n"
        f">>> TensorDict(a=torch.tensor([0.5, 4.0]), batch_size=[2]).{name}()['a'].shape\n"
        "torch.Size([2])\n"
    )
    return method


def _unary_(name: str, what: str) -> Callable[[Any], Any]:
    def method(self: Any) -> Any:
        if foreach_leaves(self, name, (), inplace=True) is None:
            for leaf in self._stored_tensors():
                getattr(leaf, name + "_")()
        return self

    method.__name__ = method.__qualname__ = name + "_"
    method.__doc__ = (
        f"Replace every tensor leaf by its {what} (``Tensor.{name}_``), in place; return ``self``.\n\n"
        "Memory-mapped leaves are written in their files (allowed while locked).\n\n"
        ">>> import torch\n>>> from tdshare import TensorDict\n"
        f">>> td = TensorDict(a=torch.tensor([0.5, 4.0]), batch_size=[2])\n>>> td.{name}_() is td\nTrue\n"
    )
    return method


def _predicate(name: str) -> Callable[[Any], Any]:
    fn = getattr(torch, name)

    def method(self: Any) -> Any:
        return walk(self, fn, (), inplace=False)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"A new tensordict of boolean leaves: ``torch.{name}`` of every tensor leaf.\n\n"
        ">>> import torch\n>>> from tdshare import TensorDict\n"
        f">>> TensorDict(a=torch.tensor([1.0, float('nan')]), batch_size=[2]).{name}()['a'].dtype\n"
        "torch.bool\n"
    )
    return method


class PointwiseOps:
    """The single-argument functions (see the module); the host class provides the tree."""

    def _stored_tensors(self) -> Any:
        raise NotImplementedError

    abs = _unary("abs", UNARY["abs"])
    abs_ = _unary_("abs", UNARY["abs"])
    acos = _unary("acos", UNARY["acos"])
    acos_ = _unary_("acos", UNARY["acos"])
    asin = _unary("asin", UNARY["asin"])
    asin_ = _unary_("asin", UNARY["asin"])
    atan = _unary("atan", UNARY["atan"])
    atan_ = _unary_("atan", UNARY["atan"])
    ceil = _unary("ceil", UNARY["ceil"])
    ceil_ = _unary_("ceil", UNARY["ceil"])
    cos = _unary("cos", UNARY["cos"])
    cos_ = _unary_("cos", UNARY["cos"])
    cosh = _unary("cosh", UNARY["cosh"])
    cosh_ = _unary_("cosh", UNARY["cosh"])
    erf = _unary("erf", UNARY["erf"])
    erf_ = _unary_("erf", UNARY["erf"])
    erfc = _unary("erfc", UNARY["erfc"])
    erfc_ = _unary_("erfc", UNARY["erfc"])
    exp = _unary("exp", UNARY["exp"])
    exp_ = _unary_("exp", UNARY["exp"])
    expm1 = _unary("expm1", UNARY["expm1"])
    expm1_ = _unary_("expm1", UNARY["expm1"])
    floor = _unary("floor", UNARY["floor"])
    floor_ = _unary_("floor", UNARY["floor"])
    frac = _unary("frac", UNARY["frac"])
    frac_ = _unary_("frac", UNARY["frac"])
    lgamma = _unary("lgamma", UNARY["lgamma"])
    lgamma_ = _unary_("lgamma", UNARY["lgamma"])
    log = _unary("log", UNARY["log"])
    log_ = _unary_("log", UNARY["log"])
    log10 = _unary("log10", UNARY["log10"])
    log10_ = _unary_("log10", UNARY["log10"])
    log1p = _unary("log1p", UNARY["log1p"])
    log1p_ = _unary_("log1p", UNARY["log1p"])
    log2 = _unary("log2", UNARY["log2"])
    log2_ = _unary_("log2", UNARY["log2"])
    neg = _unary("neg", UNARY["neg"])
    neg_ = _unary_("neg", UNARY["neg"])
    reciprocal = _unary("reciprocal", UNARY["reciprocal"])
    reciprocal_ = _unary_("reciprocal", UNARY["reciprocal"])
    round = _unary("round", UNARY["round"])
    round_ = _unary_("round", UNARY["round"])
    sigmoid = _unary("sigmoid", UNARY["sigmoid"])
    sigmoid_ = _unary_("sigmoid", UNARY["sigmoid"])
    sign = _unary("sign", UNARY["sign"])
    sign_ = _unary_("sign", UNARY["sign"])
    sin = _unary("sin", UNARY["sin"])
    sin_ = _unary_("sin", UNARY["sin"])
    sinh = _unary("sinh", UNARY["sinh"])
    sinh_ = _unary_("sinh", UNARY["sinh"])
    sqrt = _unary("sqrt", UNARY["sqrt"])
    sqrt_ = _unary_("sqrt", UNARY["sqrt"])
    tan = _unary("tan", UNARY["tan"])
    tan_ = _unary_("tan", UNARY["tan"])
    tanh = _unary("tanh", UNARY["tanh"])
    tanh_ = _unary_("tanh", UNARY["tanh"])
    trunc = _unary("trunc", UNARY["trunc"])
    trunc_ = _unary_("trunc", UNARY["trunc"])
    isfinite = _predicate("isfinite")
    isnan = _predicate("isnan")
    isinf = _predicate("isinf")
    isneginf = _predicate("isneginf")
    isposinf = _predicate("isposinf")
    isreal = _predicate("isreal")

    # -- torch functions ------------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """``torch.exp(td)``, ``torch.sum(td, 0)``...: the method of that name (``torch.where``: the shape ops')."""
        kwargs = kwargs or {}
        if func in LIKE_FUNCTIONS and args and isinstance(args[0], PointwiseOps):
            return _like(func, args[0], args[1:], kwargs)
        if func in LOSS_FUNCTIONS and args and isinstance(args[0], PointwiseOps):
            return _loss(func, args[0], args[1:], kwargs)
        if func is torch.autograd.grad and args:  # torch passes the outputs and inputs as tuples
            outputs = args[0][0] if isinstance(args[0], tuple) and len(args[0]) == 1 else args[0]
            if isinstance(outputs, PointwiseOps):
                return _grad(outputs, *args[1:], **kwargs)
        name = TORCH_FUNCTIONS.get(func)
        if name is not None:
            if not args or not isinstance(args[0], PointwiseOps):
                raise ArgumentTypeError(f"torch.{name} takes the tensordict as its first argument.")
            return getattr(args[0], name)(*args[1:], **kwargs)
        nxt = getattr(super(), "__torch_function__", None)  # the next mixin's (stack, cat...)
        return NotImplemented if nxt is None else nxt(func, types, args, kwargs)


# the torch functions a tensordict answers with its method of the same name (the reference's list)
TORCH_FUNCTIONS: dict[Any, str] = {
    getattr(torch, name): name
    for name in (
        *UNARY,
        *(n + "_" for n in UNARY if hasattr(torch, n + "_")),
        *("isfinite", "isnan", "isneginf", "isposinf", "isreal", "add", "addcdiv", "addcmul", "bitwise_and"),
        *("clamp", "clamp_max", "clamp_min", "clamp_max_", "clamp_min_", "div", "lerp", "logical_and"),
        *("maximum", "minimum", "mul", "pow", "rsub", "sub", "sum", "mean", "std", "var", "clone"),
    )
    if hasattr(torch, name)
}


# ``torch.zeros_like(td)``...: a tensordict of the same kind whose every tensor leaf is the function's
# result on that leaf (``dtype``/``device`` apply to every leaf; ``device`` also to the result)
LIKE_FUNCTIONS = frozenset(
    {torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like}
)


# ``F.mse_loss(td, target)``...: the loss of every leaf against the target's leaf of the same key (or
# against one tensor); reduced ("mean", "sum") the result has the batch size [], as the reference's
LOSS_FUNCTIONS = frozenset(
    {torch.nn.functional.l1_loss, torch.nn.functional.mse_loss, torch.nn.functional.smooth_l1_loss}
)


def _loss(func: Any, td: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``func(td, target, **kwargs)`` leaf by leaf (a tensordict target pairs leaves by key)."""
    kwargs = dict(kwargs)
    target = args[0] if args else kwargs.pop("target")
    if kwargs.get("size_average") is not None or kwargs.get("reduce") is not None:
        kwargs["reduction"] = torch.nn._reduction.legacy_get_string(kwargs.pop("size_average"), kwargs.pop("reduce"))
    reduced = kwargs.get("reduction", "mean") != "none"
    source = td.to_tensordict() if reduced and td._lazy_members() is not None else td  # a new batch size
    batch: list[int] | None = [] if reduced else None
    if isinstance(target, PointwiseOps):
        return source.apply(lambda x, y: func(x, y, **kwargs), target, batch_size=batch)
    return source.apply(lambda x: func(x, target, **kwargs), batch_size=batch)


def _grad(outputs: Any, inputs: Any, grad_outputs: Any = None, **kwargs: Any) -> Any:
    """``torch.autograd.grad(outputs_td, inputs_td, grad_outputs_td)``: one autograd call over the
    tensor leaves; the gradients come back as a tensordict shaped like ``inputs`` (a lazy stack's
    are its members' own tensors, as a stacked read is a new tensor)."""
    if isinstance(inputs, tuple) and len(inputs) == 1:
        inputs = inputs[0]
    if isinstance(grad_outputs, tuple) and len(grad_outputs) == 1:
        grad_outputs = grad_outputs[0]
    outs = tensor_entries(outputs)
    levels = inputs._lazy_members() or [inputs]
    wanted = [(level, tensor_entries(level)) for level in levels]
    grads = iter(
        torch.autograd.grad(
            list(outs.values()),
            [leaf for _, leaves in wanted for leaf in leaves.values()],
            None if grad_outputs is None else [grad_outputs.get(k) for k in outs],
            **kwargs,
        )
    )
    results = []
    for level, leaves in wanted:
        result = level.select(*leaves).copy()
        for key in leaves:
            result.set(key, next(grads))
        results.append(result)
    return results[0] if inputs._lazy_members() is None else inputs._restack(results)


def _like(func: Any, td: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    if "device" in kwargs:
        device = kwargs["device"]
        return td._map(lambda t: func(t, *args, **kwargs), None, None if device is None else torch.device(device))
    return td._map(lambda t: func(t, *args, **kwargs))
