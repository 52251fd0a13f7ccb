"""The data-parallel training experiment (runs/train.py), small: paired seeds, bytes, metrics."""

import json

import numpy as np

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref.runs import hopstats
from equarx_ref.runs import train as tr

SMALL = tr.TrainConfig(steps=20, seeds=2, batch=64, eval_every=10)


def test_small_run_pairs_seeds_and_counts_the_bytes_sent():
    r = tr.train(["int4 ring", "bf16 ring"], config=SMALL, devices=DEVICES)
    rows = r["variants"]
    assert list(rows) == ["f32 psum", "int4 ring", "bf16 ring"]
    base = rows["f32 psum"]
    assert base["delta_val_loss"] == 0 and base["grad_rel_error"] == 0
    assert base["flushed_share"] == 0
    for row in rows.values():
        assert row["wire_bytes"] == row["hlo_wire_bytes"], row
    n = r["config"]["parameters"]
    assert rows["bf16 ring"]["wire_bytes"] == 2 * 7 * (-(-n // 8)) * 2  # 2 (p-1) chunks, bf16
    q = rows["int4 ring"]
    assert 0.05 < q["grad_rel_error"] < 0.5 and 0.05 < q["flushed_share"] < 0.9, q
    assert rows["bf16 ring"]["grad_rel_error"] < 0.01
    assert len(q["runs"]) == 2 and len(q["runs"][0]["val_curve"]) == 2
    # the same seeds start from the same parameters and batches: the first step's loss agrees
    assert np.isclose(q["runs"][0]["train_curve"][0], base["runs"][0]["train_curve"][0],
                      rtol=1e-2)
    assert r["source_digest"] == tr.source_digest()


def test_hop_table_shapes_and_sqrt_growth_on_independent_data():
    g = np.random.default_rng(0).standard_normal((8, 4096))
    rows = hopstats.hop_table(g, eq.Format.int4())
    assert [x["k"] for x in rows] == list(range(1, 9))
    growth = np.array([x["rms_growth"] for x in rows])
    np.testing.assert_allclose(growth, np.sqrt(np.arange(1, 9)), rtol=0.03)
    # int4 flushes |x| < amax / 14: about 12% of Gaussian values (gradients: 36-45%)
    assert all(0.08 < x["uniform_flushed"] < 0.16 for x in rows), rows


def test_write_makes_both_files_and_the_stored_run_is_complete(tmp_path):
    """write() makes the two files stored() reads, each with its command and digest; the
    shipped run holds every variant, its bytes equal to the HLO's."""
    made = tr.write(tmp_path, variants=["int8 ring"], progress=None, devices=DEVICES,
                    config=tr.TrainConfig(steps=10, seeds=1, batch=64, eval_every=10))
    for name in tr.FILES:
        on_disk = json.loads((tmp_path / name).read_text(encoding="utf-8"))
        assert on_disk == json.loads(json.dumps(made[name]))
        assert on_disk["command"] == tr.COMMAND
        assert on_disk["source_digest"] == tr.source_digest()
    assert list(made["train.json"]["variants"]) == ["f32 psum", "int8 ring"]
    assert list(made["train-hops.json"]["steps"]) == ["0"]
    run, hops = tr.stored(), tr.stored("train-hops.json")
    assert run["command"] == hops["command"] == tr.COMMAND
    assert list(run["variants"]) == list(tr.VARIANTS)
    assert all(r["wire_bytes"] == r["hlo_wire_bytes"] for r in run["variants"].values())
    assert len(hops["steps"]["300"]) == run["config"]["devices"]
