"""The private jax names this package reaches for, listed in one place.

A few things have no public name in jax: which values `jax.linear_transpose` is tracing (to
refuse a collective that is not linear), whether forward-mode autodiff is (to refuse, in the
package's words, a rule that is reverse mode only), whether a backend has started (to compile
for a TPU without one), where TPU interpret mode keeps its race detector. The package reads
each through `private("module:attribute.path", default)`, which answers the default where the
installed jax lacks it (the caller then falls back, or says what it cannot do), and refuses a
name missing from `PRIVATE_JAX`, so the list below is every private name the package uses. The
tests resolve every entry against the installed jax (tests/test_jax_private.py), so an upgrade
that moves or removes one fails there, naming it, instead of quietly turning a refusal off.

An entry is (who uses it, alternatives): the names, newest jax first; the first that resolves
is the one used. A name is "module:attr.path"; a last attribute that a class only declares (an
annotated instance attribute, set in `__init__`) counts as present.
"""

from __future__ import annotations

import importlib

__all__ = ["PRIVATE_JAX", "private", "resolves"]

#: (who uses it, the private names it needs: alternatives, newest jax first)
PRIVATE_JAX = (
    ("autodiff._transposing: values jax.linear_transpose traces",
     ("jax._src.interpreters.partial_eval:JaxprTracer",)),
    ("autodiff._transposing: whether such a value is unknown",
     ("jax._src.interpreters.partial_eval:JaxprTracer.is_known",)),
    ("autodiff._forward_mode: values jax.jvp and jax.jacfwd trace",
     ("jax._src.interpreters.ad:JVPTracer",)),
    ("autodiff._forward_mode: values jax.linearize and jax.vjp trace",
     ("jax._src.interpreters.ad:LinearizeTracer",)),
    ("autodiff._forward_mode: a tracer's trace",
     ("jax._src.core:Tracer._trace",)),
    ("autodiff._forward_mode: linearize (False) or vjp (True)",
     ("jax._src.interpreters.ad:LinearizeTrace.is_vjp",)),
    ("runs.tpu_compile.prepare_environment: has a backend started",
     ("jax._src.xla_bridge:backends_are_initialized",)),
    ("kernels.gpu._lowering_rules: jax's lowering rules for Triton (two are added)",
     ("jax._src.pallas.triton.lowering:triton_lowering_rules",)),
    ("kernels.gpu._lowering_rules: a lowering rule from a jax function",
     ("jax._src.pallas.triton.lowering:lower_fun",)),
    ("kernels.backend.result_type: the abstract array a kernel's HBM result wraps",
     ("jax._src.core:ShapedArray",)),
    ("kernels.backend: TPU interpret mode's race detector state",
     ("jax._src.pallas.mosaic.interpret.interpret_pallas_call:races",
      "jax._src.pallas.mosaic.interpret:races")),
)

_LISTED = frozenset(name for _, names in PRIVATE_JAX for name in names)
_MISSING = object()


def _lookup(name: str):
    module_name, _, path = name.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError:
        return _MISSING
    parts = path.split(".") if path else []
    for i, part in enumerate(parts):
        found = getattr(obj, part, _MISSING)
        if found is _MISSING and i == len(parts) - 1 and isinstance(obj, type) and any(
                part in getattr(c, "__annotations__", {}) for c in obj.__mro__):
            return None  # declared, set per instance: present, no value to hand out
        if found is _MISSING:
            return _MISSING
        obj = found
    return obj


def resolves(name: str) -> bool:
    """Whether `name` ("module:attr.path") exists in the installed jax."""
    return _lookup(name) is not _MISSING


def private(name: str, default=_MISSING):
    """What `name`, listed in `PRIVATE_JAX`, is in the installed jax; `default` where it lacks
    it (no default: a LookupError naming it). An unlisted name is a bug here."""
    if name not in _LISTED:
        raise AssertionError(f"private jax name {name!r} is not listed in PRIVATE_JAX")
    obj = _lookup(name)
    if obj is _MISSING:
        if default is _MISSING:
            raise LookupError(f"jax {_jax_version()} has no {name} (a private name this "
                              f"package uses; see equarx_ref/_jax_private.py)")
        return default
    return obj


def _jax_version() -> str:
    import jax

    return jax.__version__
