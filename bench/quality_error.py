"""Part 2 of the quality study, the error study: captured gradients quantized offline by every scheme,
bias and variance against bits, ORQ against the exact optimum, BinGrad-b against exact 2-means."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from quality_config import DUMP_NAME, ERROR_DRAWS
from quality_plots import plot_error
from quality_tables import write_error_report


def exact_orq_variance(x: np.ndarray, s: int, bucket: int) -> np.ndarray:
    """Per bucket, the minimum over level sets (s levels, l_0 = min, l_{s-1} = max) of the stochastic-
    rounding variance sum (l_{j+1}-x)(x-l_j): the library's exact level search
    (``hvd_gradq.kernels.search``, checked against an O(s w^2) program in tests/unit/test_orq.py)."""
    from hvd_gradq.kernels.search import levels

    x = np.asarray(x, np.float32)
    full = len(x) // bucket * bucket
    parts = [x[:full].reshape(-1, bucket)] if full else []
    if full < len(x):
        parts.append(x[full:].reshape(1, -1))
    out = []
    for rows in parts:
        out.append(levels_variance(rows.reshape(-1), levels(rows, s), rows.shape[1]))
    return np.concatenate(out) if out else np.zeros(0)


def levels_variance(x: np.ndarray, table: np.ndarray, bucket: int) -> np.ndarray:
    """Per bucket, sum (hi-x)(x-lo) for stochastic rounding onto the bucket's sorted ``table`` row."""
    out = []
    for b, b0 in enumerate(range(0, len(x), bucket)):
        xb = x[b0 : b0 + bucket].astype(np.float64)
        t = np.sort(table[b].astype(np.float64))
        j = np.clip(np.searchsorted(t, xb, side="right") - 1, 0, len(t) - 2)
        lo, hi = t[j], t[j + 1]
        out.append(float(np.sum(np.clip((hi - xb) * (xb - lo), 0.0, None))))
    return np.array(out)


def exact_two_means_sse(x: np.ndarray, bucket: int) -> np.ndarray:
    """Per bucket, the minimum squared error of any 2-level quantizer (exact 1-D 2-means)."""
    out = []
    for b0 in range(0, len(x), bucket):
        y = np.sort(x[b0 : b0 + bucket].astype(np.float64))
        w = len(y)
        if w < 2:
            out.append(0.0)
            continue
        p = np.cumsum(y)
        k = np.arange(1, w)
        tot = p[-1]
        sse = np.sum(y * y) - p[:-1] ** 2 / k - (tot - p[:-1]) ** 2 / (w - k)
        out.append(max(0.0, float(sse.min())))
    return np.array(out)


def error_part(a: argparse.Namespace, raw: Path, out: Path, train_rows: list[dict[str, Any]] | None) -> None:
    from tqdm import tqdm

    import hvd_gradq

    dump = raw / DUMP_NAME
    if not dump.exists():
        raise SystemExit(f"{dump} is missing: run the training part first (it dumps the gradients)")
    with np.load(dump) as z:
        keys = sorted(z.files)
        grads: dict[str, list[tuple[str, np.ndarray]]] = {}
        for k in keys:
            step, name = k.split("/", 1)
            grads.setdefault(step, []).append((name, z[k].astype(np.float32).reshape(-1)))
    steps = sorted(grads)
    n_elems = sum(g.size for _, g in grads[steps[0]])
    specs = [s.replace(",ef=true", "").replace(":ef=true", "") for s in a.schemes]
    specs = list(dict.fromkeys(specs))
    extra = ["orq:levels=3,bucket=128", "orq:levels=5,bucket=128", "orq:levels=9,bucket=128", "bingrad:bucket=128",
             "bingrad:variant=pb,bucket=128"]
    rows = []
    bar = tqdm(total=len(specs) + len(extra), desc="error analysis", unit="scheme", dynamic_ncols=True)
    for spec in specs + extra:
        scheme = hvd_gradq.parse(spec)
        draws = ERROR_DRAWS if scheme.stochastic else 1
        err = bias2 = norm2 = 0.0
        wire = body = 0
        for step in steps:
            for name, x in grads[step]:
                qs = []
                for d in range(draws):
                    p = hvd_gradq.quantize(x, spec, seed=1000 * d + 17, name=name)
                    if d == 0:
                        wire += p.nbytes
                        body += p.body_nbytes
                    qs.append(hvd_gradq.dequantize(p).astype(np.float64).reshape(-1))
                q = np.stack(qs)
                xd = x.astype(np.float64)
                err += float(np.mean(np.sum((q - xd) ** 2, axis=1)))
                if draws > 1:  # unbiased estimate of ||E Q - x||^2: remove the mean's sampling noise
                    b = float(np.sum((q.mean(0) - xd) ** 2)) - float(np.sum(q.var(0, ddof=1))) / draws
                else:
                    b = float(np.sum((q[0] - xd) ** 2))
                bias2 += b
                norm2 += float(np.sum(xd * xd))
        rows.append({"spec": spec, "unbiased": bool(scheme.unbiased), "stochastic": bool(scheme.stochastic),
                     "bits": 8 * wire / (n_elems * len(steps)), "body_bits": 8 * body / (n_elems * len(steps)),
                     "err": err / norm2, "bias2": max(bias2 / norm2, 0.0), "draws": draws})
        bar.update(1)
    bar.close()

    # optimum comparisons at buckets of 128
    opt_rows = []
    for s in (3, 5, 9):
        spec = f"orq:levels={s},bucket=128"
        v_orq = v_opt = v_even = 0.0
        worst = 1.0
        for step in steps:
            for name, x in grads[step]:
                p = hvd_gradq.quantize(x, spec, seed=1, name=name)
                table = np.asarray(p.parts["meta"], np.float32).reshape(-1, s)
                vo = levels_variance(x, table, 128)
                ve = exact_orq_variance(x, s, 128)
                mins = np.array([x[b : b + 128].min() for b in range(0, len(x), 128)], np.float64)
                maxs = np.array([x[b : b + 128].max() for b in range(0, len(x), 128)], np.float64)
                even = mins[:, None] + (maxs - mins)[:, None] * np.linspace(0, 1, s)[None, :]
                v_orq += vo.sum()
                v_opt += ve.sum()
                v_even += levels_variance(x, even, 128).sum()
                nz = ve > 1e-30
                if nz.any():
                    worst = max(worst, float(np.max(vo[nz] / ve[nz])))
        norm2 = sum(float(np.sum(x.astype(np.float64) ** 2)) for st in steps for _, x in grads[st])
        opt_rows.append({"what": f"ORQ-{s} variance", "scheme": v_orq / norm2, "optimum": v_opt / norm2,
                         "ratio": v_orq / v_opt if v_opt else float("nan"), "worst": worst,
                         "even": v_even / norm2})
    sse_b = sse_opt = 0.0
    worst = 1.0
    for step in steps:
        for name, x in grads[step]:
            q = hvd_gradq.dequantize(hvd_gradq.quantize(x, "bingrad:bucket=128", name=name)).reshape(-1)
            per = np.array([np.sum((q[b : b + 128].astype(np.float64) - x[b : b + 128]) ** 2)
                            for b in range(0, len(x), 128)])
            opt = exact_two_means_sse(x, 128)
            sse_b += per.sum()
            sse_opt += opt.sum()
            nz = opt > 1e-30
            if nz.any():
                worst = max(worst, float(np.max(per[nz] / opt[nz])))
    norm2 = sum(float(np.sum(x.astype(np.float64) ** 2)) for st in steps for _, x in grads[st])
    opt_rows.append({"what": "BinGrad-b squared error", "scheme": sse_b / norm2, "optimum": sse_opt / norm2,
                     "ratio": sse_b / sse_opt if sse_opt else float("nan"), "worst": worst, "even": float("nan")})

    write_error_report(a, rows, opt_rows, steps, n_elems, len(grads[steps[0]]), out, dump)
    plot_error(rows, opt_rows, out / "error_vs_bits.png")


