"""The PyTorch frontend under horovodrun: every scheme with and without EF, bitwise-equal
weights on all ranks, the loss curve against the uncompressed run's, the NumPy oracle (also for
op=Sum and num_groups, through DistributedOptimizer), identity, stats."""
import pytest
from harness import LaunchError, launch

pytestmark = pytest.mark.parallel

# Measured eval losses (start ln 4 = 1.39; worker --seed 0..2 at 2 ranks x 100 steps, 0..1 at 4
# ranks x 40 steps): the task is easy, so the uncompressed run is at ~0 by step 20-30 and every
# scheme's final loss is ~0 too; a ratio to the uncompressed final loss (0.0) says nothing.
# What separates a working scheme from a broken one is (1) the first eval, after 10 steps, for
# the schemes that are unbiased at fine resolution: they follow the uncompressed run while a
# scale error shows at once, and (2) for every scheme, that it has learned by the end.
#
# (1) |loss10 / none10 - 1|: at most 0.19% measured for these (EF or not) at 2 ranks, 0.29% at
# 4; a decode scaled by 0.5 gives +12.6%, by 2 -69%, zeros +19%, the wrong sign +43% (seed 0,
# 2 ranks, decompress() output sabotaged). The bound, 2%, is 7x the worst correct run and 6x
# below the smallest sabotage. The biased schemes (sign, topk, bingrad) and terngrad (clipped)
# are 0.3-16% off here by design: the oracle below checks their values exactly instead.
TRACKED = {"fp16", "uniform:bits=8", "uniform:bits=4", "qsgd:levels=4", "orq:levels=3", "orq:levels=5", "orq:levels=9"}
TRACK_10 = 0.02
# (2) the final eval loss of every scheme, by world size. Worst measured: 3.4e-4 at 2 ranks after
# 100 steps (sign, seed 2), 6.3e-3 at 4 ranks after 40 (bingrad:variant=pb,ef=true, seed 1:
# momentum overshoots after the loss first reaches ~0, up to 0.41 mid-run at 2 ranks, so a
# 40-step run gets a wider bound). Broken schemes end at 1.39 (zeros) or NaN (the wrong sign).
FINAL = {2: 0.01, 4: 0.1}


def _fails(spec: str, r: dict, none: dict, size: int) -> list[str]:
    if "error" in r:
        return [f"{spec}: {r['error']}"]
    out = []
    base = spec.replace(",ef=true", "").replace(":ef=true", "")
    if base in TRACKED:
        dev = r["curve"][0] / none["curve"][0] - 1
        if not abs(dev) <= TRACK_10:  # NaN fails too
            out.append(f"{spec}: loss after 10 steps {r['curve'][0]:.4f} is {dev:+.1%} off the uncompressed "
                       f"run's {none['curve'][0]:.4f} (allowed {TRACK_10:.0%})")
    if not r["loss"] <= FINAL[size]:
        out.append(f"{spec}: final loss {r['loss']:.3g} > {FINAL[size]} (start {r['loss0']:.3f}; curve "
                   f"{[round(v, 3) for v in r['curve']]})")
    return out


def check(reports: dict) -> None:
    size = reports[0]["size"]
    res = {r: reports[r]["results"] for r in reports}
    for spec in res[0]:
        digests = {r: res[r][spec]["digest"] for r in res}
        if len(set(digests.values())) != 1:
            raise LaunchError(f"{spec}: weights differ across ranks: {digests}")
    none = res[0]["none"]
    assert res[0]["stock"]["digest"] == none["digest"] or abs(res[0]["stock"]["loss"] - none["loss"]) < 1e-4
    failures = []
    for spec, r in res[0].items():
        if "|" in spec or spec in ("stock", "none"):
            continue
        failures += _fails(spec, r, none, size)
    assert not failures, "\n".join(failures)
    # op=Sum and num_groups: every step's reduced gradient of every parameter is the oracle's
    # (sum for Sum, sum / N for Average), and the probes saw compressed patterns, not only fp32
    for spec in ("orq:levels=5|num_groups=2", "qsgd|op=Sum"):
        pr = res[0][spec]["probe"]
        assert pr["steps"] == 10 and not pr["bad"], f"{spec}: reduced gradients differ from the oracle: {pr['bad'][:5]}"
        assert set(pr["patterns"]) - {"fp32"}, (spec, pr)
    # the oracle decodes with the NumPy reference; it is independent only if the frontend ran the kernels
    assert reports[0]["kernels"], "numba kernels unavailable on the workers: the oracle would check the reference twice"
    for key, (ok, used) in reports[0]["oracle"].items():
        assert ok, f"oracle mismatch for {key} (pattern {used}) at {size} ranks"
        want = key.split("|")[1] if "|" in key else "gather"  # every oracle case names its pattern
        assert used == want, (key, used)
    assert {k for k in reports[0]["oracle"] if k.endswith("|Sum")} == {
        f"qsgd:levels=4|{p}|Sum" for p in ("gather", "summable", "scatter")
    }
    for r in reports:
        for case, ok in reports[r]["identity"].items():
            assert all(ok.values()), f"rank {r} identity {case}: {ok}"
    # small tensors' gathers fused into the round's one collective: the bits of each alone
    # (HVD_GRADQ_FUSE_BELOW=0), and fused indeed (the model's tensors are below the threshold)
    for r in reports:
        for spec, f in reports[r]["fusion"].items():
            assert f["same"] and f["fused_gathers"] >= 10 and f["fused_off"] == 0, (r, spec, f)
    # error feedback inside the encode: the bits of the unfused rule over the NumPy reference, and
    # fused indeed (every tensor a step: the model's are finite and in range)
    for r in reports:
        for spec, f in reports[r]["fed"].items():
            assert f["same"] and f["fed"] == f["calls"] >= 10 and f["fed_off"] == 0, (r, spec, f)
    check_telemetry({r: reports[r]["results"]["orq:levels=5"] for r in reports}, size)
    # stats: gather payloads are the schemes' wire size; bytes below fp32 for compressing schemes
    for spec in [s for s in ("orq:levels=3", "orq:levels=5", "bingrad:ef=false", "uniform:bits=8", "sign") if s in res[0]]:
        st = res[0][spec]["stats"]["last_step"]["all"]
        assert st["sent"] > 0 and st["fp32"] / st["sent"] > (1.5 if size == 2 else 1.0), (spec, st)


def check_telemetry(runs: dict, size: int) -> None:
    """One run's stats() and metrics() on every rank, and its first-step log line on rank 0 only."""
    ring = lambda n, item: round(2 * (size - 1) * item * n / size)  # noqa: E731 (Horovod's ring allreduce a rank)
    for r, run in runs.items():
        st, t = run["stats"], run["telemetry"]
        # each tensor's pattern and why are the shared policy's (decide), the same on every rank
        assert {k: [v["pattern"], v["why"]] for k, v in st["tensors"].items()} == t["decided"], (r, st["tensors"])
        # every rank decides alike; a gather payload is the same size on every rank, a scatter
        # rank's bytes depend on the size of the chunk it owns (the cheap second phase makes ORQ-5
        # take scatter for the largest tensor at 4 ranks)
        decided = ("pattern", "why", "elements", "fp32", "fp16", "ranks")
        assert ({k: [v[f] for f in decided] for k, v in st["tensors"].items()}
                == {k: [v[f] for f in decided] for k, v in runs[0]["stats"]["tensors"].items()}), (r, st["tensors"])
        assert all(v["sent"] == runs[0]["stats"]["tensors"][k]["sent"] for k, v in st["tensors"].items()
                   if v["pattern"] == "gather"), f"rank {r}: gather payloads differ in size from rank 0's"
        assert "gather" in {v["pattern"] for v in st["tensors"].values()} <= {"gather", "scatter", "fp32"}, st["tensors"]
        for v in st["tensors"].values():
            assert (v["fp32"], v["fp16"], v["ranks"]) == (ring(v["elements"], 4), ring(v["elements"], 2), size), v
        last, total = st["last_step"]["all"], st["total"]["all"]
        assert last["fp32"] == sum(v["fp32"] for v in st["tensors"].values()) == 2 * last["fp16"], last
        assert last["sent"] == sum(v["sent"] for v in st["tensors"].values()) and total["sent"] == st["steps"] * last["sent"]
        assert last["vs_fp32_allreduce"] == last["fp32"] / last["sent"] > 1.5 and st["world"]["ranks"] == size
        for when in ("last_step", "total"):  # encode, wait, decode and the calls themselves took time
            assert all(v > 0 for v in st["time"][when].values()), (when, st["time"])
        m = t["metrics"]
        assert all(k.startswith("hvd_gradq/") and type(v) in (int, float) for k, v in m.items()), m
        assert m["hvd_gradq/bytes_sent"] == last["sent"] and m["hvd_gradq/encode_ms"] > 0, m
        assert m["hvd_gradq/step"] == st["steps"] and m["hvd_gradq/tensors_gather"] > 0, m
    # the default handler: INFO on rank 0, WARNING elsewhere; log_every=10: a line at steps 10, 20, ...
    where = f"{size} ranks on 1 host; cost model: 10 Gbit/s, 1 rank a host; "  # horovodrun -H localhost:N
    lines = runs[0]["telemetry"]["stderr"].splitlines()
    assert lines[0].startswith(f"hvd_gradq INFO: first step: orq (pattern=auto), {where}"), lines
    steps = runs[0]["stats"]["steps"]
    assert [ln.split(":")[1] for ln in lines[1:]] == [f" step {k}" for k in range(10, steps + 1, 10)], lines
    assert all(ln.startswith("hvd_gradq INFO: step ") and where in ln for ln in lines[1:]), lines
    assert all("hvd_gradq" not in runs[r]["telemetry"]["stderr"] for r in runs if r), runs[1]["telemetry"]["stderr"]
    # summary(): the same figures as a short table
    text = runs[0]["telemetry"]["summary"]
    assert text.startswith(f"hvd_gradq: orq (pattern=auto), {where.rstrip('; ')}; {steps} steps"), text
    assert "  gather " in text and "in compress/decompress" in text and len(text.splitlines()) <= 12, text


def test_every_scheme_two_ranks() -> None:
    check(launch("worker_torch_schemes.py", np=2, controller="gloo", timeout=900))


def test_schemes_of_every_pattern_under_mpi() -> None:
    # the controller changes Horovod's negotiation and transport, not a scheme's arithmetic: one
    # scheme of each pattern (gather, summable's uniform, the probes' scatter and Sum) under MPI,
    # with and without error feedback; the rest run under Gloo above and at 4 ranks
    check(launch("worker_torch_schemes.py", np=2, controller="mpi", timeout=900,
                 args=["--schemes", "none;orq:levels=5;bingrad:ef=false;uniform:bits=4;sign"]))


def test_every_scheme_four_ranks() -> None:
    check(launch("worker_torch_schemes.py", np=4, controller="gloo", args=["--steps", "40"], timeout=900))
