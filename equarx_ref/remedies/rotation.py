"""Randomized Hadamard rotation: spread each block's outliers before quantizing.

A block-scaled format spends its grid on the block's largest magnitude: one outlier of 20 sigma
in a block of 32 leaves the other 31 values a few grid steps each. Rotating the block by an
orthogonal matrix that mixes every value into every other flattens it: after a randomized
Hadamard transform each output is a +-1 combination of all B inputs, close to Gaussian whatever
the input, so amax / rms drops from up to sqrt(B) to about sqrt(2 ln B).

    R = H D / sqrt(B)      H the B x B Sylvester-Hadamard matrix (entries +-1), D = diag(signs)

This is the rotation QuaRot applies to activations before 4-bit quantization (Ashkboos et al.,
"QuaRot: Outlier-Free 4-Bit Inference in Rotated LLMs", arXiv 2404.00456), and QuIP# to weights
(Tseng et al., arXiv 2402.04396): a random sign flip D, then a fast Walsh-Hadamard transform,
O(B log B) additions. Here it is applied per quantization block (B = the format's block size, a
power of two), with one sign per position of the padded message drawn from a fixed seed, so
every device uses the same D.

Why it fits an AllReduce: R is linear, so the sum of rotated inputs is the rotation of the sum.
`all_reduce(..., rotate=True)` rotates each device's input once, runs the schedule unchanged on
rotated data (every hop quantizes rotated blocks) and rotates the result back once at the end:

    sum_d x_d = R^T ( sum_d R x_d )

The bytes on the wire do not change; the result is exact up to f32 rounding of the transforms
(the 1 / sqrt(B) is split into powers of two, so scaling is exact and only the additions
round). The result is still bitwise the same on every device: every device un-rotates the same
decoded bytes. The trade-off: for i.i.d. Gaussian data nothing changes (a rotated Gaussian is
Gaussian), and each device pays two transforms (a few passes over the message); heavy-tailed
data, such as real activations with outlier features, is where the error drops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["ROTATION_SEED", "hadamard", "inverse_rotate", "rotate", "signs"]

#: The seed of the shared random sign vector D (the same on every device, every call).
ROTATION_SEED = 0x5EED


def _check_block(block: int) -> int:
    if block < 1 or block & (block - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two block size, got {block}")
    return block


def hadamard(x: jax.Array, block: int) -> jax.Array:
    """Unnormalised fast Walsh-Hadamard transform of each block of `block` values along the
    last axis (its length a multiple of `block`): H x, H the Sylvester matrix of +-1."""
    _check_block(block)
    *lead, n = x.shape
    y = x.reshape(*lead, n // block, block)
    h = 1
    while h < block:  # butterfly: pairs (i, i + h) inside groups of 2h
        y = y.reshape(*lead, n // block, block // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = jnp.stack([a + b, a - b], axis=-2)
        h *= 2
    return y.reshape(*lead, n)


def signs(n: int, seed: int = ROTATION_SEED) -> jax.Array:
    """The shared diagonal D: n values +-1.0 (f32) from `seed`."""
    return jax.random.rademacher(jax.random.key(seed), (n,), jnp.float32)


def _powers(block: int) -> tuple[float, float]:
    """(forward, inverse) power-of-two factors whose product is 1 / block: R = H D * forward is
    orthogonal up to a factor within sqrt(2) of 1, and R^-1 = D H * inverse."""
    half = (block.bit_length() - 1) // 2  # 2^half <= sqrt(block)
    return 2.0**-half, 2.0 ** (half - (block.bit_length() - 1))


def rotate(x: jax.Array, block: int, seed: int = ROTATION_SEED) -> jax.Array:
    """R x for the blocks of `x`'s last axis: H (D x), scaled by a power of two (f32)."""
    x = x.astype(jnp.float32)
    return hadamard(x * signs(x.shape[-1], seed), block) * _powers(block)[0]


def inverse_rotate(y: jax.Array, block: int, seed: int = ROTATION_SEED) -> jax.Array:
    """R^-1 y: D (H y), scaled by a power of two; `inverse_rotate(rotate(x)) == x` up to
    f32 rounding."""
    y = y.astype(jnp.float32)
    return hadamard(y, block) * _powers(block)[1] * signs(y.shape[-1], seed)
