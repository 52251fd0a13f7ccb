"""The derivative of a quantized AllReduce, and the AllReduce of a pytree (gradients, as DDP
buckets them).

Derivative. A quantized AllReduce computes y = Q(sum_i x_i): rounding is piecewise constant, so
its true derivative is zero almost everywhere, and differentiating through the uint8 wire gives
exactly that, a silent zero gradient. What training wants is the derivative of the sum it
approximates, the straight-through rule:

    dy = psum(dx)            (the tangent: psum's, exact, in the buffer's dtype)
    dx = psum^T(dy)          (the cotangent: whatever JAX does for psum)

With `backward="psum"` (the default) the rule is a `custom_jvp` whose tangent is `lax.psum`:
jvp, grad, vjp and value_and_grad then give exactly psum's derivative, under
`check_vma=True` (where psum^T of an invariant cotangent is a free cast to varying) and
`check_vma=False` (where it is a psum). With `backward="quantized"` the cotangent goes through
the same quantized collective as the forward (a `custom_vjp`; reverse mode only): that costs
the forward's error again, and it only matters where psum^T communicates, i.e. under
`check_vma=False`. Under `check_vma=True` the cotangent of an invariant result is the same on
every device and its transpose sends nothing, so there is nothing to quantize: the rule stays
psum's (and jvp keeps working).

Every order, every transformation: right or refused. The quantized backward's passes are
themselves straight-through (both call the `custom_jvp`), so forward over reverse
(`jax.hessian`, jvp of grad) and reverse over reverse differentiate psum, not the rounding
(which would be a silent zero); vmap of grad batches the rules. Forward mode of the quantized
backward (jvp, jacfwd, linearize under `check_vma=False`) is refused in one line naming
all_reduce (a `custom_vjp` has no jvp; jax's own TypeError stands where its private tracer
types are gone). `jax.linear_transpose` of an unquantized sum transposes it as psum; a
quantized one rounds, is not linear, and is refused in one line (`jax.vjp` gives its
straight-through transpose), and so is an unquantized sum sent in another dtype than a leaf's
(`dtype=`): the casts round, and psum's transpose in the leaf's dtype would silently skip them
(`jax.vjp` differentiates them, in the dtype sent). A rounding key is an argument of the rules,
never a closure: a key traced by an enclosing `jit` (an argument, or made in the trace by
`AllReduce(stochastic_seed=)`) would otherwise leak into the backward pass.

Pytrees. Leaves are flattened into one buffer in the dtype `dtype` (default: the leaves' common
dtype, `jnp.result_type`), cut into buckets at leaf boundaries (a leaf larger than
`bucket_bytes` is a bucket of its own, like PyTorch DDP's `bucket_cap_mb`; None: one bucket),
each bucket is one collective, and the sums are cut back into leaves in their own dtypes. The
bytes sent are those of the buckets: `eq.wire_bytes(bucket size, p, ..., dtype=dtype)` summed.

The trap. Under `check_vma=True`, `jax.grad` with respect to replicated (`P()`) parameters
inside `shard_map` returns gradients *already summed* over the axis in f32 (the transpose of the
implicit broadcast), typed invariant. Summing them again multiplies them by p; Adam hides the
scale, and a quantized collective then only adds its error to an exact sum. A leaf whose type
is invariant over the axis raises an `InvariantInputWarning` naming the fix:
`lax.pcast(params, axis, to="varying")` before `jax.grad`. (Under `check_vma=False` types
carry no such information, and `jax.grad` returns per-device gradients.)
"""

from __future__ import annotations

import os
import sys
import warnings

import jax
import jax.numpy as jnp
from jax import lax

from ._checks import count, dtype_alias
from ._jax_private import private

# What linear_transpose traces with (no public name; None in a jax without it: the check is
# skipped, and jax's own error stands): see _transposing.
_JAXPR_TRACER = private("jax._src.interpreters.partial_eval:JaxprTracer", None)
# What forward mode traces with (jvp, jacfwd; linearize's trace says it is not a vjp): see
# _forward_mode (None: jax's own TypeError stands).
_JVP_TRACER = private("jax._src.interpreters.ad:JVPTracer", None)
_LINEARIZE_TRACER = private("jax._src.interpreters.ad:LinearizeTracer", None)

__all__ = ["BACKWARDS", "InvariantInputWarning", "bucket_leaves", "check_tree_args",
           "checks_vma", "reduce_tree", "straight_through", "varying_axes"]

#: Values of `all_reduce(..., backward=)`: psum's exact cotangent, or the quantized collective.
BACKWARDS = ("psum", "quantized")


_HERE = os.path.dirname(os.path.abspath(__file__))
_INTERNAL = {os.path.abspath(__file__), os.path.join(_HERE, "collectives.py")}


class InvariantInputWarning(UserWarning):
    """all_reduce was given a value already the same on every device of the axis."""


def varying_axes(x) -> frozenset:
    """The mesh axes over which `x`'s type says it varies (empty outside `check_vma=True`)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)  # jax before the manual-axis-type rename
    if vma is None:
        mat = getattr(aval, "mat", None) or getattr(aval, "manual_axis_type", None)
        vma = getattr(mat, "varying", frozenset())
    return frozenset(vma)


def checks_vma(axes: tuple[str, ...]) -> bool:
    """True inside `shard_map(check_vma=True)` over `axes`: there `axis_index` is varying."""
    return set(axes) <= varying_axes(lax.axis_index(axes if len(axes) > 1 else axes[0]))


def bucket_leaves(sizes: list[int], itemsize: int, bucket_bytes: int | None) -> list[list[int]]:
    """Leaf indices per bucket, in order: leaves are added to a bucket while it stays within
    `bucket_bytes` (a larger leaf is a bucket alone); None: everything in one bucket."""
    if bucket_bytes is None:
        return [list(range(len(sizes)))]
    cap = count(bucket_bytes, "bucket_bytes")
    buckets, used = [[]], 0
    for i, size in enumerate(sizes):
        if buckets[-1] and used + size * itemsize > cap:
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += size * itemsize
    return buckets


def check_tree_args(backward: str, bucket_bytes: int | None, dtype):
    """The pytree keywords of `all_reduce`, checked: the buffer dtype (None: the leaves')."""
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    if bucket_bytes is not None:
        count(bucket_bytes, "bucket_bytes")
    if dtype is None:
        return None
    try:
        dtype = jnp.dtype(dtype_alias(dtype))
    except TypeError:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype!r}") from None
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    return dtype


def _leaf(path, value) -> jax.Array:
    where = jax.tree_util.keystr(path) or "x"
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        x = jnp.asarray(value)  # Python and NumPy scalars become (weakly typed) arrays
    except TypeError:
        raise TypeError(f"all_reduce needs floating-point arrays, got {type(value).__name__} "
                        f"at {where}") from None
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"all_reduce needs floating-point arrays, got dtype {x.dtype} at {where}; "
                        "quantized sums of integers are not defined here (cast to float first)")
    return x


def _buffer_dtype(leaves, dtype):
    if dtype is not None:
        return dtype
    try:
        return jnp.dtype(jnp.result_type(*leaves))
    except (TypeError, ValueError):  # e.g. float8 with float32: no implicit promotion
        kinds = sorted({str(v.dtype) for v in leaves})
        raise TypeError(f"the leaves' dtypes {kinds} have no common dtype; pass dtype= (the "
                        "dtype of the buffer sent, e.g. dtype='float32')") from None


def _differentiable(reduce, psum, quantized_backward: bool):
    """reduce(v, key) (flat -> flat, not differentiable) with psum's derivative
    (straight-through). The key is an argument, not a closure: a rule that closed over a key
    traced by an enclosing `jit` would leak it into the backward pass."""
    @jax.custom_jvp
    def f(v, key):
        return reduce(v, key)

    @f.defjvp
    def _(primals, tangents):
        return f(*primals), psum(tangents[0])

    if not quantized_backward:
        return f

    @jax.custom_vjp
    def g(v, key):
        return reduce(v, key)

    # Both passes call f, not reduce: a derivative of the gradient (forward over reverse:
    # jax.hessian, jvp of grad) then differentiates them straight-through too, as psum, instead
    # of through the rounding (a silent zero). psum^T = psum, here quantized.
    g.defvjp(lambda v, key: (f(v, key), key), lambda key, ct: (f(ct, key), None))
    return g


def straight_through(reduce, group, what: str):
    """`reduce(x, aux)` (a quantized sum over `group`, not differentiable) with psum's
    derivative, as `all_reduce` has it (backward "psum"); `aux` (an array, e.g. a traced site
    index) passes through the rule as an argument. `jax.linear_transpose` is refused, naming
    `what`: a quantized sum is not linear."""
    f = _differentiable(reduce, lambda t: lax.psum(t, group), False)

    def call(x, aux):
        if _transposing([x]):
            raise TypeError(f"jax.linear_transpose: {what} rounds, so it is not linear and has "
                            "no transpose; use jax.vjp (its derivative is psum's)")
        return f(x, aux)
    return call


def _transposing(leaves) -> bool:
    """True while `jax.linear_transpose` traces the collective: its inputs are then unknown
    values of a partial evaluation, which no other transformation hands to `all_reduce` (jvp,
    grad and linearize apply the custom rule first)."""
    return _JAXPR_TRACER is not None and any(isinstance(v, _JAXPR_TRACER) and not v.is_known()
                                             for v in leaves)


def _forward_mode(leaves) -> bool:
    """True while forward-mode autodiff traces the collective: `jax.jvp` and `jax.jacfwd` hand
    it JVP tracers, `jax.linearize` linearize tracers of a trace that is not a vjp's (`jax.grad`
    and `jax.vjp` linearize too, and then transpose)."""
    for v in leaves:
        if _JVP_TRACER is not None and isinstance(v, _JVP_TRACER):
            return True
        if _LINEARIZE_TRACER is not None and isinstance(v, _LINEARIZE_TRACER) and \
                getattr(getattr(v, "_trace", None), "is_vjp", True) is False:
            return True
    return False


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside this module and collectives.py: the line
    that called `all_reduce` or an `AllReduce`, however it entered."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _INTERNAL:
        frame, level = frame.f_back, level + 1
    return level


def reduce_tree(tree, axes: tuple[str, ...], reduce, *, backward: str = "psum",
                bucket_bytes: int | None = None, dtype=None, key=None, linear: bool = False):
    """Sum a pytree over `axes` with `reduce(flat, bucket, key) -> flat` per bucket,
    differentiably.

    `reduce` gets one bucket as a 1-D array of `dtype`, its index (to fold into a rounding
    key; None when there is one bucket) and `key` (passed through the custom rules as an
    argument, so a traced key never leaks), and returns the sum in the same dtype; it is the
    forward only. The tangent is `lax.psum`'s, the cotangent psum's transpose
    (`backward="psum"`) or `reduce` itself (`backward="quantized"`, where psum's transpose
    communicates). `linear`: the forward is an unquantized sum, which `jax.linear_transpose`
    transposes as psum; a quantized one rounds, so it is not linear and is refused there, as is
    an unquantized one whose leaves are cast to another dtype to be sent.
    """
    dtype = check_tree_args(backward, bucket_bytes, dtype)
    if tree is None:  # an empty pytree to jax, but here surely a mistake
        raise TypeError("all_reduce sums an array or a pytree of arrays x, got None")
    paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [_leaf(path, v) for path, v in paths]
    if not leaves:
        return tree
    buf_dtype = _buffer_dtype(leaves, dtype)
    group = axes if len(axes) > 1 else axes[0]
    psum = lambda t: lax.psum(t, group)  # noqa: E731
    if _transposing(leaves):
        if not linear:
            raise TypeError("jax.linear_transpose: all_reduce with a quantized fmt is not linear "
                            "(it rounds), so it has no transpose; use jax.vjp (its derivative "
                            "is psum's, straight-through) or fmt=None")
        cast = sorted({str(v.dtype) for v in leaves if v.dtype != buf_dtype})
        if cast:  # psum's transpose in the leaves' dtypes would silently skip the casts
            raise TypeError(f"jax.linear_transpose: all_reduce sends {'/'.join(cast)} values as "
                            f"{buf_dtype} (dtype=), a cast that rounds, so it is not linear and "
                            f"has no transpose; use jax.vjp (its derivative is psum's, in "
                            f"{buf_dtype}) or leaves of the dtype sent")
        return jax.tree.map(psum, tree)  # an unquantized sum: transposed as psum is
    vma = checks_vma(axes)
    invariant = vma and any(not set(axes) <= varying_axes(v) for v in leaves)
    if invariant and lax.axis_size(group) > 1:
        warnings.warn(InvariantInputWarning(
            f"all_reduce got a value already the same on every device of {group!r} (its type is "
            f"invariant over it: e.g. gradients jax.grad already summed because the params were "
            f"replicated); summing it multiplies it by {lax.axis_size(group)}. In a data-parallel "
            f"step call lax.pcast(params, {group!r}, to='varying') before jax.grad."),
            stacklevel=_caller_stacklevel())
    if backward == "quantized" and not vma and _forward_mode(leaves):
        raise TypeError("all_reduce: forward-mode autodiff (jax.jvp, jax.jacfwd, jax.linearize) "
                        "is not supported with backward='quantized' under check_vma=False, whose "
                        "quantized cotangent is a reverse-mode rule; use reverse mode (jax.grad, "
                        "jax.vjp) or backward='psum' (its tangent is psum's)")
    out = [None] * len(leaves)
    buckets = bucket_leaves([v.size for v in leaves], buf_dtype.itemsize, bucket_bytes)
    for b, members in enumerate(buckets):
        flat = jnp.concatenate([leaves[i].reshape(-1).astype(buf_dtype) for i in members]) \
            if len(members) > 1 else leaves[members[0]].reshape(-1).astype(buf_dtype)
        # under check_vma psum^T sends nothing: the quantized backward is psum's there
        index = b if len(buckets) > 1 else None
        fn = _differentiable(lambda v, k, i=index: reduce(v, i, k), psum,
                             backward == "quantized" and not vma)
        total = fn(flat, key)
        start = 0
        for i in members:
            v = leaves[i]
            out[i] = total[start:start + v.size].reshape(v.shape).astype(v.dtype)
            start += v.size
    return jax.tree_util.tree_unflatten(treedef, out)
