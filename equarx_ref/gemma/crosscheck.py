"""Cross-check against an independent implementation: Hugging Face transformers on the same GGUF.

    pip install torch==2.13.0 'equarx-ref[crosscheck]'    # torch first: the pin takes the CPU build
    python -m equarx_ref.gemma.crosscheck --out tests/fixtures/gemma/hf_reference.json

transformers dequantizes the GGUF itself, rebuilds the tokenizer from the vocabulary, and runs its
own PyTorch Gemma 3 in float32. The script stores what it got (token ids of `EVAL_TEXT` and of a
few awkward strings, per-token NLL and top-1 next-token ids) as a small JSON fixture, and prints
how far this project's forward is from it. The test suite compares against the fixture, so CI
needs neither torch nor transformers. Not run in CI (it takes a minute or two and ~3 GB).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .evaltext import EVAL_TEXT

#: Strings whose reference ids are stored besides the evaluation text.
TOKENIZER_PROBES = [
    "The capital of France is Paris. Quantized all-reduce saves bandwidth.",
    "  two leading spaces,   three inside,\ttab, trailing  ",
    "\n\nblank lines\n\n\n\nand more\r\nwindows line end",
    "digits 1234567890 3.14159 1e-6 0x1F and 2026-11-22",
    "naïve café Zürich — “quotes” ½ π ≈ 3.14 日本語のテキスト 🙂 👩‍💻",
    "<start_of_turn>user\nhi<end_of_turn>",
]


def hf_reference(gguf_path: Path, text: str = EVAL_TEXT) -> dict:
    """Run transformers on `gguf_path`: ids, per-token NLL and top-1 for `text`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = str(gguf_path.parent), gguf_path.name
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    print(f"transformers loaded the GGUF in {time.time() - t0:.0f} s")
    ids = tok(text)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()          # [S, V]
    lp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(ids[1:])
    nll = -lp[:-1].gather(1, target[:, None])[:, 0]
    top2 = torch.topk(logits[:-1], 2, dim=-1)
    return {
        "source": "Hugging Face transformers on the same GGUF, float32, eager attention",
        "transformers": transformers.__version__, "torch": torch.__version__,
        "text_chars": len(text),
        "ids": [int(i) for i in ids],
        "nll": [round(float(x), 7) for x in nll],
        "top1": [int(i) for i in top2.indices[:, 0]],
        "top2_margin": [round(float(a - b), 5) for a, b in top2.values.tolist()],
        "probes": {s: [int(i) for i in tok(s)["input_ids"]] for s in TOKENIZER_PROBES},
    }


def project_scores(ids: list[int], mesh=None) -> tuple[np.ndarray, np.ndarray]:
    """This project's per-token NLL and top-1 for `ids` (float32)."""
    import jax

    from .parallel import forward
    from .weights import load_gguf

    config, params = load_gguf()
    logits = forward(params, np.asarray([ids]), config, mesh=mesh)[0]
    lp = jax.nn.log_softmax(logits, axis=-1)
    nll = -np.take_along_axis(np.asarray(lp[:-1]), np.asarray(ids[1:])[:, None], 1)[:, 0]
    return nll, np.asarray(logits[:-1].argmax(-1))


def main(argv=None) -> int:
    """Write the fixture and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/gemma/hf_reference.json"))
    args = ap.parse_args(argv)
    from .gguf_file import default_gguf_path, sha256_file
    from .tokenizer import Tokenizer

    path = default_gguf_path()
    ref = hf_reference(path)
    ref["gguf_sha256"] = sha256_file(path)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(ref, ensure_ascii=False, indent=0) + "\n")
    print(f"wrote {args.out} ({len(ref['ids'])} tokens)")

    tok = Tokenizer.from_gguf()
    same = tok.encode(EVAL_TEXT) == ref["ids"]
    # transformers parses control tokens in text (the probes hold a chat turn): so do we, here
    probes = sum(tok.encode(s, parse_special=True) == v for s, v in ref["probes"].items())
    nll, top1 = project_scores(ref["ids"])
    d = np.abs(nll - np.asarray(ref["nll"]))
    print(f"ids identical: {same}; probes identical: {probes}/{len(ref['probes'])}")
    print(f"mean NLL: project {nll.mean():.6f}, transformers {np.mean(ref['nll']):.6f}; "
          f"mean |dNLL| {d.mean():.2e}, max {d.max():.2e}; "
          f"top-1 equal {np.mean(top1 == np.asarray(ref['top1'])) * 100:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
