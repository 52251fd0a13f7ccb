"""The time model: its phases follow the bytes of the schedules, its limits are the byte ratios,
pipelining helps only where compute and links can overlap, and bad input is refused."""

import dataclasses
import math

import pytest

import equarx_ref as eq
from equarx_ref.models import cost

INT8, INT4 = eq.Format.int8(), eq.Format.int4()


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring", "two_shot", "one_shot"])
def test_large_messages_approach_the_byte_ratio(algorithm):
    """Bandwidth-bound: the speedup nears 16 / bits (1.88x int8, 3.56x int4) from below; the
    memory passes of (de)quantizing, at the kernels' stored cycles, keep it some way under
    (the rings least; two-shot and one-shot, whose reduce kernel reads p messages and is
    compute bound in int4, most)."""
    n = 1 << 29
    for fmt in (INT8, INT4):
        base, t = (eq.predicted_time(n, 8, fmt=f, algorithm=algorithm, chip="v5e",
                                     num_chunks=eq.best_num_chunks(n, 8, fmt=f,
                                                                   algorithm=algorithm,
                                                                   chip="v5e"))
                   for f in (None, fmt))
        floor = 0.75 if algorithm in ("ring", "bidir_ring") else 0.65  # one reduce pass of p
        assert floor * 16 / fmt.bits_per_element < base / t < 16 / fmt.bits_per_element


def test_ring_link_time_is_the_textbook_formula():
    """Without compute (infinite HBM), a bf16 ring is 2 (p - 1) alpha-ish + 2 (p-1)/p n / W."""
    chip = eq.Chip("ideal", link_bandwidth=1e9, hop_latency=0.0, hbm_bandwidth=1e30,
                   peak_flops=1.0)
    n, p = 1 << 20, 8
    t = eq.predicted_time(n, p, fmt=None, algorithm="ring", chip=chip)
    # reduce-scatter one way: (p-1) n/p values; all-gather over both directions: half that
    expected = ((p - 1) * n / p * 2 + (p - 1) * n / p * 2 / 2) / 1e9
    assert t == pytest.approx(expected, rel=1e-6)


def test_pipelining_overlaps_compute_with_links():
    n = 1 << 26
    one = eq.predicted_time(n, 8, fmt=INT8, algorithm="bidir_ring", chip="v5e", num_chunks=1)
    best = eq.best_num_chunks(n, 8, fmt=INT8, algorithm="bidir_ring", chip="v5e")
    t = eq.predicted_time(n, 8, fmt=INT8, algorithm="bidir_ring", chip="v5e", num_chunks=best)
    assert best > 1 and t < one
    # tiny messages: every piece pays a hop latency, so one piece is best
    assert eq.best_num_chunks(1024, 8, fmt=INT8, algorithm="bidir_ring", chip="v5e") == 1


def test_phases_carry_the_schedule_bytes():
    """Reduce-scatter hops x link bytes = the reduce part of wire_bytes (one direction)."""
    n, p = 1 << 20, 8
    for fmt in (None, INT8):
        ph = cost.phases(n, p, fmt=fmt, algorithm="ring")
        rs = ph[0]
        sent = eq.wire_bytes(n, p, fmt=fmt, algorithm="ring")
        assert rs.hops * rs.link_bytes == sent / 2  # the other half is the gather's


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring", "two_shot", "one_shot"])
@pytest.mark.parametrize("p", [2, 3, 4, 8, (2, 4)])
def test_hosts_on_a_switch_pay_every_byte_they_send(algorithm, p):
    """With one link per host (`links=1`), the link term is wire_bytes / W plus a latency per
    hop, for every algorithm: the phases' sent bytes add up to what the device sends."""
    if isinstance(p, tuple) and algorithm not in ("ring", "bidir_ring"):
        return
    chip = eq.Chip("switch", link_bandwidth=1e8, hop_latency=1e-4, hbm_bandwidth=1e30,
                   peak_flops=1.0, links=1)
    n = 100_003
    for fmt in (None, INT8, INT4):
        ph = cost.phases(n, p, fmt=fmt, algorithm=algorithm)
        hops = sum(x.hops for x in ph)
        sent = eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm)
        assert sum(x.hops * x.sent_bytes for x in ph) == pytest.approx(sent, rel=1e-12)
        t = eq.predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=chip)
        assert t == pytest.approx(hops * 1e-4 + sent / 1e8, rel=1e-9)


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring", "two_shot", "one_shot"])
@pytest.mark.parametrize("p", [2, 3, 8, (2, 4), (1, 8), (8, 1)])
def test_memory_passes_are_the_specs(algorithm, p):
    """Phase by phase, the HBM bytes the model prices are the spec's passes (`spec.sums`), each
    array read or written once. A ring's lanes each encode their first message (priced with
    the first reduce-scatter's hops), run q - 1 hops per axis (read a message and a bf16 chunk,
    write a message), and every chunk, the owner's own included, is decoded once (the owner's
    priced with the first gather's hops); unquantized, a hop reads two raw chunks and writes
    one and nothing is decoded. Two-shot encodes every chunk, each owner sums the p messages of
    its chunk as sent (its own too, not its bf16 chunk) and encodes the sum, and everyone
    decodes p chunks. An axis of one device adds nothing. (On a torus the model prices every
    hop as a fused bf16 one; the executor's first hop along the second axis reads f32 sums.)"""
    shape = p if isinstance(p, tuple) else (p,)
    total = math.prod(shape)
    if len(shape) == 2 and algorithm not in ("ring", "bidir_ring"):
        return
    n = 100_003
    for fmt in (INT8, INT4, None):
        def enc(m, fmt=fmt):  # a message of m values: encoded, or raw bf16
            return fmt.nbytes(m) if fmt else 2 * m

        def dec(m, fmt=fmt):  # decoding it: read the message, write bf16 (none if raw)
            return fmt.nbytes(m) + 2 * m if fmt else 0

        priced = [(ph.hops, ph.hbm_bytes)
                  for ph in cost.phases(n, p, fmt=fmt, algorithm=algorithm)]
        block = fmt.row if fmt else 1  # chunks are whole rows of a message
        if algorithm in ("ring", "bidir_ring"):
            d = 2 if algorithm == "bidir_ring" else 1
            L = -(-n // (total * d * block)) * block  # a lane's chunk
            axes = [q for q in shape if q > 1]
            first = L * total // axes[0]  # the first message's values
            spec, lead = [], total
            for i, q in enumerate(axes):
                lead //= q
                hop = d * (2 * enc(L * lead) + 2 * L * lead)
                spec.append((q - 1, hop + (i == 0 and fmt is not None) * d * dec(first) / (q - 1)))
            for i, q in enumerate(reversed(axes)):
                hops = math.ceil((q - 1) / 2)
                spec.append((hops, d * ((q - 1) * dec(L * lead) + (i == 0) * dec(L)) / hops))
                lead *= q
        elif algorithm == "two_shot":
            L = -(-n // (total * block)) * block
            spec = [(0, 2 * n + total * enc(L)), (total // 2, 0.0),
                    (0, total * enc(L) + enc(L)), (math.ceil((total - 1) / 2), 0.0),
                    (0, total * enc(L) + 2 * n)]
        else:
            L = -(-n // block) * block  # the one message, whole rows
            spec = [(0, 2 * n + enc(L)), (math.ceil((total - 1) / 2), 0.0),
                    (0, total * enc(L) + 2 * n)]
        assert [h for h, _ in priced] == [h for h, _ in spec], (fmt, priced, spec)
        assert [b for _, b in priced] == pytest.approx([b for _, b in spec], rel=1e-12), \
            (fmt, priced, spec)
    if shape in ((1, 8), (8, 1)):
        assert eq.predicted_time(n, p, fmt=INT8, algorithm=algorithm, chip="v5e") == \
            eq.predicted_time(n, 8, fmt=INT8, algorithm=algorithm, chip="v5e")


@pytest.mark.parametrize("algorithm, p", [
    *((a, p) for a in ("ring", "bidir_ring") for p in (2, 8, (2, 4), (1, 8))),
    *((a, p) for a in ("two_shot", "one_shot") for p in (2, 8))])
def test_fixed_cost_counts_every_quantizing_pass(algorithm, p):
    """`quantize_overhead` is paid once per (de)quantizing pass the executor runs: a ring's
    lanes each encode their first message and run two passes per reduce hop (decode what
    arrived, encode the sum); a gather hop decodes what arrived, both lanes' in one pass, and
    the owner's own sums once more; two-shot encodes, sums and re-encodes (two), decodes;
    one-shot encodes and decodes. A pass run once is spread over its phase's hops, as its
    bytes are."""
    shape = p if isinstance(p, tuple) else (p,)
    n = 100_003
    priced = sum(max(ph.hops, 1) * ph.quantizes
                 for ph in cost.phases(n, p, fmt=INT8, algorithm=algorithm))
    if algorithm in ("ring", "bidir_ring"):
        d = 2 if algorithm == "bidir_ring" else 1
        axes = [q for q in shape if q > 1]
        passes = d + sum(2 * d * (q - 1) + math.ceil((q - 1) / 2) for q in axes) + 1
    else:
        passes = 4 if algorithm == "two_shot" else 2
    assert priced == pytest.approx(passes, rel=1e-12)
    assert sum(ph.quantizes for ph in cost.phases(n, p, fmt=None, algorithm=algorithm)) == 0
    chip = dataclasses.replace(eq.CHIPS["v5e"], quantize_overhead=1e-6)
    added = eq.predicted_time(n, p, fmt=INT8, algorithm=algorithm, chip=chip) \
        - eq.predicted_time(n, p, fmt=INT8, algorithm=algorithm, chip="v5e")
    assert added == pytest.approx(passes * 1e-6, rel=1e-9)  # at k = 1 nothing overlaps


def test_codec_bandwidth_prices_the_quantizing_passes_only():
    """A slower (de)quantizing pass (a CPU's exact rounding) slows the quantized AllReduce, not
    the unquantized one; None prices it as a memory pass."""
    fast = eq.Chip("c", link_bandwidth=1e9, hop_latency=1e-5, hbm_bandwidth=1e10, peak_flops=1.0)
    slow = dataclasses.replace(fast, codec_bandwidth=1e9)
    n = 1 << 24
    for algorithm in ("ring", "two_shot"):
        t = {c.codec_bandwidth: eq.predicted_time(n, 4, fmt=INT8, algorithm=algorithm, chip=c)
             for c in (fast, slow)}
        assert t[1e9] > t[None]
        assert eq.predicted_time(n, 4, fmt=None, algorithm=algorithm, chip=slow) == \
            eq.predicted_time(n, 4, fmt=None, algorithm=algorithm, chip=fast)
    with pytest.raises(ValueError, match="codec_bandwidth"):
        dataclasses.replace(fast, codec_bandwidth=0.0)


def test_the_tpu_presets_price_the_codec_at_its_stored_cycles():
    """v5e and v6e price each kernel's pass at max(bytes' HBM time, stored static compute):
    the record's ratio where it is above 1, else 1; bytes alone without a record."""
    from equarx_ref import data
    rows = data.load("tpu-schedule")["schedule"]["codec"]
    assert {r["topology"].split(":")[0] for r in rows} == {"v5e", "v6e"}
    for r in rows:
        chip = cost.CHIPS[r["topology"].split(":")[0]]
        assert chip.codec_price(eq.Format.parse(r["format"]), r["kernel"]) == max(1.0, r["ratio"])
    assert cost.CHIPS["v5e"].codec_price(None, "hop") == 1.0
    assert cost.CHIPS["v5e"].codec_price(eq.Format("int6", 32), "hop") == 1.0  # not stored
    assert cost.CHIPS["v4"].codec_price(INT8, "hop") == 1.0  # no schedule
    # the price lands on the pass: a bytes-only copy of the chip is never slower
    n = 1 << 23
    for algorithm in ("ring", "bidir_ring", "two_shot", "one_shot"):
        for name in ("v5e", "v6e"):
            chip = cost.CHIPS[name]
            priced, by_bytes = (eq.predicted_time(n, 8, fmt=eq.Format.parse("mxfp4"),
                                                  algorithm=algorithm, chip=c)
                                for c in (chip, dataclasses.replace(chip, schedule="")))
            assert priced > by_bytes, (algorithm, name)  # mxfp4's hop is above its bytes
            assert eq.predicted_time(n, 8, fmt=None, algorithm=algorithm, chip=chip) == \
                eq.predicted_time(n, 8, fmt=None, algorithm=algorithm,
                                  chip=dataclasses.replace(chip, schedule=""))


def test_every_byte_of_a_pass_has_its_kernel():
    """A phase's kernels split its bytes exactly: nothing priced twice or left unpriced."""
    for algorithm in ("ring", "bidir_ring", "two_shot", "one_shot"):
        for p in (8, (2, 4)) if algorithm in ("ring", "bidir_ring") else (8,):
            for ph in cost.phases(1 << 20, p, fmt=INT8, algorithm=algorithm):
                if ph.quantizes:
                    assert sum(b for _, b in ph.kernels) == pytest.approx(ph.hbm_bytes), ph
                    assert {k for k, _ in ph.kernels} <= {"encode", "hop", "decode", "reduce"}


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring", "two_shot", "one_shot"])
@pytest.mark.parametrize("fmt", [INT8, None], ids=["int8", "bf16"])
def test_each_phase_runs_at_its_own_primitives_rate(algorithm, fmt):
    """On hosts behind a switch the link term is, per primitive, its hops' latency plus the
    bytes it sends at that primitive's rate: halving one primitive's rate adds exactly the
    bytes its phases send, once more, and leaves the others alone."""
    n, p, alpha = 3 << 20, 4, 1e-4
    chip = eq.Chip("hosts", link_bandwidth=1e8, hop_latency=alpha, hbm_bandwidth=1e30,
                   peak_flops=1.0, links=1)
    ph = cost.phases(n, p, fmt=fmt, algorithm=algorithm)
    base = eq.predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=chip)
    for primitive in cost.PRIMITIVES:
        sent = sum(x.hops * x.sent_bytes for x in ph if x.primitive == primitive)
        slower = dataclasses.replace(chip, primitive_bandwidth={primitive: 5e7})
        t = eq.predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=slower)
        assert t == pytest.approx(base + sent / 1e8, rel=1e-9), primitive
        assert all(x.hops == cost.primitive_hops(x.primitive, p) or x.pipelined
                   for x in ph if x.primitive == primitive and x.hops)
    used = {x.primitive for x in ph if x.hops}
    assert used == {"ring": {"permute", "all_gather"}, "bidir_ring": {"two_way_permute",
                    "all_gather"}, "two_shot": {"all_to_all", "all_gather"},
                    "one_shot": {"all_gather"}}[algorithm]


def test_primitive_rates_are_named_and_kept_in_one_order():
    a = eq.Chip("c", 1e9, 1e-6, 1e10, 1.0, primitive_bandwidth={"all_gather": 2e9, "permute": 1})
    b = eq.Chip("c", 1e9, 1e-6, 1e10, 1.0, primitive_bandwidth=[("permute", 1.0),
                                                               ("all_gather", 2e9)])
    assert a == b and hash(a) == hash(b) and a.bandwidth("all_to_all") == 1e9
    with pytest.raises(ValueError, match="unknown primitive 'psum'"):
        eq.Chip("c", 1e9, 1e-6, 1e10, 1.0, primitive_bandwidth={"psum": 1e9})


@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_a_result_of_fresh_pages_costs_its_first_touch_once(algorithm):
    """With `fresh_bandwidth`, a result of `FRESH_BYTES` or more (malloc maps it anew on every
    call) adds its bytes at that rate, once per AllReduce, whatever the format or depth; a
    smaller one, one device, or a chip without the rate adds nothing."""
    chip = eq.Chip("hosts", link_bandwidth=1e8, hop_latency=1e-4, hbm_bandwidth=1e9,
                   peak_flops=1.0, links=1)
    fresh = dataclasses.replace(chip, fresh_bandwidth=2e9)
    for n, p in [(cost.FRESH_BYTES // 2, 4), (3 << 24, 4), (cost.FRESH_BYTES // 2 - 1, 4),
                 (3 << 24, 1)]:
        for fmt, k in [(INT8, 1), (None, 4)]:
            k = k if algorithm == "ring" else 1
            base, t = (eq.predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=c,
                                         num_chunks=k) for c in (chip, fresh))
            touched = 2 * n >= cost.FRESH_BYTES and p > 1
            assert t == pytest.approx(base + 2 * n / 2e9 * touched, rel=1e-12), (n, p, fmt)
    with pytest.raises(ValueError, match="fresh_bandwidth"):
        dataclasses.replace(chip, fresh_bandwidth=0.0)


def test_one_device_or_empty_costs_nothing_and_bad_input_is_refused():
    assert eq.predicted_time(0, 8, fmt=INT8, algorithm="ring", chip="v5e") == 0.0
    assert eq.predicted_time(100, 1, fmt=INT8, algorithm="ring", chip="v5e") == 0.0
    with pytest.raises(ValueError, match="unknown chip"):
        eq.predicted_time(100, 8, fmt=INT8, algorithm="ring", chip="v99")
    with pytest.raises(ValueError, match="psum"):
        eq.predicted_time(100, 8, fmt=INT8, algorithm="psum", chip="v5e")
    with pytest.raises(ValueError, match="link_bandwidth"):
        eq.Chip("bad", 0.0, 1e-6, 1e12, 1e14)
    assert set(eq.CHIPS) >= {"v4", "v5e", "v5p", "v6e"}
    assert all(c.source for c in eq.CHIPS.values())


def test_gemma_prefill_model():
    """Matmul FLOPs ~ 2 x parameters x tokens; int8 speeds the prefill up by less than the
    AllReduce share allows; at TP=8 on v5e the model lands near the paper's 1.1x-1.25x."""
    from equarx_ref.gemma.config import PRESETS
    from equarx_ref.models.prefill import _flops, prefill_time

    cfg = PRESETS["27b"]
    assert 2 * cfg.num_params() * 2048 < _flops(cfg, 2048) < 2.6 * cfg.num_params() * 2048
    base = prefill_time(cfg, 2048, 8, chip="v5e", fmt=None)
    int8 = prefill_time(cfg, 2048, 8, chip="v5e", fmt=INT8)
    assert int8.compute_s == base.compute_s and int8.allreduce_s < base.allreduce_s
    speedup = base.total_s / int8.total_s
    assert 1.0 < speedup < base.total_s / base.compute_s
    assert 1.05 < speedup < 1.3
    with pytest.raises(ValueError, match="efficiency"):
        prefill_time(cfg, 2048, 8, chip="v5e", fmt=None, efficiency=0)


def test_crossover_grows_with_the_fixed_cost_of_quantizing():
    import dataclasses

    def crossover(overhead):
        chip = dataclasses.replace(eq.CHIPS["v5e"], quantize_overhead=overhead)
        return cost.crossover_bytes(8, fmt=INT8, algorithm="bidir_ring", chip=chip)

    free, cheap, dear = crossover(0.0), crossover(1e-6), crossover(1e-5)
    assert free < 1 << 14 < cheap < dear  # without a fixed cost only block padding loses
    n = dear // 2  # bf16 values at the crossover: int8 wins just above, loses just below
    chip = dataclasses.replace(eq.CHIPS["v5e"], quantize_overhead=1e-5)

    def best(f, m):
        k = eq.best_num_chunks(m, 8, fmt=f, algorithm="bidir_ring", chip=chip)
        return eq.predicted_time(m, 8, fmt=f, algorithm="bidir_ring", chip=chip, num_chunks=k)

    assert best(INT8, int(n * 1.1)) < best(None, int(n * 1.1))
    assert best(INT8, int(n * 0.9)) > best(None, int(n * 0.9))


def test_model_command_json(tmp_path, capsys):
    import json

    from equarx_ref import cli

    out = tmp_path / "model.json"
    assert cli.main(["model", "--chip", "v6e", "--json", str(out),
                     "--plot", str(tmp_path / "model.png")]) == 0
    assert (tmp_path / "model.png").stat().st_size > 10_000
    report = json.loads(out.read_text())
    assert report["modelled"] is True and report["chip"] == "v6e"
    sizes = [r["message_bytes"] for r in report["rows"]]
    assert sizes[0] == 1 << 10 and sizes[-1] == 1 << 30
    speedups = [r["int8_speedup"] for r in report["rows"]]
    assert speedups == sorted(speedups) and speedups[-1] < 16 / 8.5
    assert {p["model"] for p in report["prefill"]} == {"Gemma 3 12B", "Gemma 3 27B"}
    assert "modelled" in capsys.readouterr().out


@pytest.mark.slow
def test_size_gate_at_the_edge():
    """min_bytes: a message of exactly min_bytes is quantized, one byte more of gate is not;
    the bytes in the compiled program follow, and so does wire_bytes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from conftest import DEVICES

    mesh = eq.make_mesh(DEVICES[:4])
    n = 1000
    x = jax.random.normal(jax.random.key(0), (4, n), jnp.float32)

    def run(fmt, min_bytes):
        f = jax.jit(jax.shard_map(
            lambda v: eq.all_reduce(v[0], "tp", fmt=fmt, min_bytes=min_bytes),
            mesh=mesh, in_specs=P("tp"), out_specs=P()))
        hlo = f.lower(x).compile().as_text()
        return np.asarray(f(x)), sum(eq.hlo_wire_bytes(hlo, 4).values())

    exact, exact_bytes = run(None, 0)
    at, at_bytes = run(INT8, 4 * n)  # x.nbytes == min_bytes: quantized
    above, above_bytes = run(INT8, 4 * n + 1)  # gated: unquantized, bitwise
    default, _ = run(INT8, None)  # the default: int8 sends fewer bytes, so quantized
    auto, _ = run(INT8, "auto")   # the chip's crossover: 0 on CPU devices, so quantized
    assert not np.array_equal(at, exact) and np.array_equal(above, exact)
    assert np.array_equal(default, at) and np.array_equal(auto, at)
    assert at_bytes == eq.wire_bytes(n, 4, fmt=INT8, algorithm="ring", dtype="float32",
                                     min_bytes=4 * n)
    assert above_bytes == exact_bytes == eq.wire_bytes(
        n, 4, fmt=INT8, algorithm="ring", dtype="float32", min_bytes=4 * n + 1)
    assert cost.default_min_bytes((8,), fmt=INT8, algorithm="bidir_ring", device_kind="cpu") == 0
    assert cost.default_min_bytes((8,), fmt=INT8, algorithm="bidir_ring",
                                  device_kind="TPU v5 lite") == cost.crossover_bytes(
        8, fmt=INT8, algorithm="bidir_ring", chip="v5e")
    with pytest.raises(ValueError, match="min_bytes"):
        eq.AllReduce(min_bytes=-1)


@pytest.mark.parametrize("q,m,k,hops", [(1, 1, 1, 7), (1, 1, 4, 7), (0.25, 1, 4, 7),
                                        (1, 0.25, 8, 7), (0.5, 0.5, 8, 3), (2, 0.1, 3, 5)])
def test_the_pipeline_formula_is_the_timeline_makespan(q, m, k, hops):
    events = cost.timeline(hops, k, q / k, m / k)
    makespan = max(end for *_, end in events)
    qk, mk = q / k, m / k
    assert makespan == pytest.approx(max(hops * k * max(qk, mk) + min(qk, mk),
                                         hops * (qk + mk)))
    per_resource = {}
    for resource, _, _, start, end in sorted(events, key=lambda e: e[3]):
        assert start >= per_resource.get(resource, 0.0) - 1e-12  # one thing at a time
        per_resource[resource] = end


def test_timeline_figure(tmp_path):
    from equarx_ref.viz import draw_timeline

    ax = draw_timeline(cost.timeline(3, 4, 0.1, 0.25), title="k = 4")
    ax.figure.savefig(tmp_path / "t.png")
    assert len(ax.patches) == 2 * 3 * 4
