"""The data-parallel training experiment (runs/train.py), small: paired seeds, bytes, metrics."""

import json

import numpy as np
import pytest

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import cli, data
from equarx_ref.runs import hopstats
from equarx_ref.runs import train as tr

SMALL = tr.TrainConfig(steps=20, seeds=2, batch=64, eval_every=10)


@pytest.mark.slow
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


@pytest.mark.slow
def test_hop_table_shapes_and_sqrt_growth_on_independent_data():
    """(As many values as the model has parameters: the shapes of the gradients the --hops
    run of test_hop_steps_are_those_of_the_run tabulates, whose quantizations, run op by op,
    are then compiled once for both.)"""
    n = tr.experiment_data(tr.TrainConfig())["parameters"]
    g = np.random.default_rng(0).standard_normal((8, n))
    rows = hopstats.hop_table(g, eq.Format.int4())
    assert [x["k"] for x in rows] == list(range(1, 9))
    growth = np.array([x["rms_growth"] for x in rows])
    np.testing.assert_allclose(growth, np.sqrt(np.arange(1, 9)), rtol=0.03)
    # int4 flushes |x| < amax / 14: about 12% of Gaussian values (gradients: 36-45%)
    assert all(0.08 < x["uniform_flushed"] < 0.16 for x in rows), rows


@pytest.mark.slow
def test_train_command_writes_its_run_and_the_stored_runs_are_complete(tmp_path, capsys):
    """`equarx-ref train` prints the table and writes the report; the two stored results (the
    run and the hop table, package data) hold every variant, its bytes equal to the HLO's."""
    out = tmp_path / "train.json"
    assert cli.main(["train", "--variants", "int8 ring", "--steps", "25", "--seeds", "1",
                     "--no-progress", "--json", str(out)]) == 0
    made = json.loads(out.read_text(encoding="utf-8"), parse_constant=pytest.fail)  # no NaN
    assert list(made["variants"]) == ["f32 psum", "int8 ring"]
    assert made["variants"]["int8 ring"]["delta_val_loss_se"] is None  # one seed: no SE
    assert "± n/a" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:  # refused before any work: 25 steps an evaluation
        cli.main(["train", "--steps", "30", "--seeds", "1"])
    assert bad.value.code == 2
    assert "multiple of 25" in capsys.readouterr().err
    run, hops = data.load("train"), data.load("train-hops")
    assert list(run["variants"]) == list(tr.VARIANTS)
    assert all(r["wire_bytes"] == r["hlo_wire_bytes"] for r in run["variants"].values())
    assert len(hops["steps"]["300"]) == run["config"]["devices"]
    assert data.command("train").startswith("equarx-ref train")


@pytest.mark.slow
def test_hop_steps_are_those_of_the_run(tmp_path, capsys):
    """#wrong, --hops: with --steps 25 the table said "at": [0, 100, 300] and held step 0 only.
    The steps are those within the run and its last; a step beyond it is refused up front."""
    cfg = tr.TrainConfig(steps=25)
    assert tr.hop_steps(cfg) == [0, 25] and tr.hop_steps(tr.TrainConfig()) == [0, 100, 300]
    with pytest.raises(ValueError, match=r"within \[0, 25\].*\[100\]"):
        tr.hop_statistics(cfg, at=(0, 100), devices=DEVICES)
    out = tmp_path / "hops.json"
    assert cli.main(["train", "--hops", "--steps", "25", "--json", str(out)]) == 0
    made = json.loads(out.read_text(encoding="utf-8"))
    assert made["at"] == [0, 25] and list(made["steps"]) == ["0", "25"]
    assert "step 25:" in capsys.readouterr().out
