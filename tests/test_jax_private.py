"""The private jax names the package uses are listed in one place (`_jax_private.PRIVATE_JAX`)
and exist in the installed jax: an upgrade that moves or removes one fails here, by name."""

import re
from pathlib import Path

import pytest

from equarx_ref import _jax_private
from equarx_ref._jax_private import PRIVATE_JAX, private, resolves

PACKAGE = Path(_jax_private.__file__).resolve().parent


def test_every_private_jax_name_the_package_uses_exists():
    missing = [f"{who}: none of {', '.join(names)}" for who, names in PRIVATE_JAX
               if not any(resolves(n) for n in names)]
    assert not missing, "the installed jax lacks private names the package uses: " + \
        "; ".join(missing)


def test_the_list_holds_every_private_name_in_the_package():
    """A `jax._src` reference anywhere else in the package names a module of a listed name."""
    listed = {n.partition(":")[0] for _, names in PRIVATE_JAX for n in names}
    unlisted = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_jax_private.py":
            continue
        for module in re.findall(r"jax\._src[\w.]*", path.read_text(encoding="utf-8")):
            if module.rstrip(".") not in listed:
                unlisted.append(f"{path.relative_to(PACKAGE)}: {module}")
    assert not unlisted, f"private jax names outside PRIVATE_JAX: {unlisted}"


def test_a_name_is_read_only_through_the_list():
    with pytest.raises(AssertionError, match="not listed in PRIVATE_JAX"):
        private("jax._src.core:Tracer")
    assert not resolves("jax._src.no_such_module:x")
    assert not resolves("jax._src.core:Tracer.no_such_attribute")
    assert resolves("jax._src.core:Tracer") and resolves("jax._src.core:Tracer._trace")
