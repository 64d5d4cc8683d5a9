"""The scatter pattern's second phase: what a reduced chunk (the sum of N first-phase payloads)
is re-quantized with before the allgather spreads it (the reduction core's ``scatter`` and
``hierarchical`` patterns, :mod:`hvd_gradq.reduce`; the cost model, :mod:`.decide`, prices it;
all take it from :func:`reduced_scheme`, so they agree bit for bit)."""

from __future__ import annotations

import functools
import math

from ..schemes.level import LevelScheme
from ..schemes.options import Rounding
from ..schemes.scheme import Scheme
from ..schemes.uniform import Uniform

#: The second phase's evenly spaced intervals a bucket, per interval of the first phase's levels
#: (:func:`reduced_scheme`): 2**b - 1 >= SECOND_PHASE_FINER * (s - 1).
SECOND_PHASE_FINER = 1.85


def second_phase_bits(symbols: int) -> int:
    """Bits of the stochastic uniform second phase after a first phase of ``symbols`` levels: the
    fewest b with 2**b - 1 >= :data:`SECOND_PHASE_FINER` * (symbols - 1), at most 8 (uniform's
    limit; a first phase of more than ~138 levels gets fewer intervals than the rule asks)."""
    need = SECOND_PHASE_FINER * (symbols - 1) + 1
    return min(8, max(1, math.ceil(math.log2(need) - 1e-9)))


@functools.lru_cache(maxsize=1024)
def reduced_scheme(scheme: Scheme, nranks: int) -> Scheme:
    """The scheme the scatter pattern (and hierarchical's cross-host scatter) re-quantizes a
    reduced chunk with, the sum S' of N first-phase payloads: for a level scheme with a finer
    form (ORQ, QSGD, uniform), stochastic rounding on 2**b evenly spaced levels of each bucket's
    [min, max] (``uniform:rounding=stochastic``, b = :func:`second_phase_bits` of the first
    phase's levels), with the scheme's bucket, clip and scales (the policy is the rank's). It is unbiased,
    needs no sort and no per-bucket table (two floats a bucket) and costs 1-2 ns an element,
    where ``scheme.refined(sqrt(N))`` (ORQ-5 -> ORQ-9 at 4 ranks) was the slowest search and a
    table of sqrt(N)·s floats a bucket, so that at 1 Gbit/s the model preferred gather.

    The bound. The N ranks round independently (their own seeds), so the first phase adds
    Var(S' - S) = N·V1 an element, V1 one rank's rounding variance. Stochastic rounding of S' on
    a step D = R / (2**b - 1), R the bucket's range of S', adds p(1-p)·D^2 <= D^2/4 (D^2/6 on
    average over values spread across a step). Model the ranks' gradients as a common part plus
    rank-independent noise, the noise dominating (small per-rank batches): then R ~ sqrt(N)·r,
    r one rank's range (for Gaussian noise the extremes of a sum of N grow exactly so), and a
    first phase of s levels on r has V1 = (r / (s-1))^2 / (6·g), g >= 1 what its level placement
    gains over s evenly spaced levels (1 for uniform and QSGD; ORQ's optimized levels, measured
    here: 1.6-2.6 on Gaussian buckets, up to 4.4 on Student-t(3)). The ratio is then

        second / first = D^2/6 / (N·V1) = g·((s-1) / (2**b - 1))^2,

    the same at every N, so b depends on the first phase's levels only and the second phase's
    bytes stay flat in N (:func:`cost`). With 2**b - 1 >= 1.85·(s-1) the ratio is at most g/3.4:
    ORQ-3 -> 3 bits (ratio g/12), ORQ-5 -> 4 (g/14), ORQ-9 and QSGD-4 -> 4 (g/3.5), uniform-4 ->
    5. Measured at N = 4, 8, 64 on Gaussian and Laplace buckets (tests/unit/test_patterns.py):
    ORQ-3 <= 0.25, ORQ-5 <= 0.15, QSGD-4 <= 0.3, ORQ-9 <= 0.5. The bound's weak spot is the
    heaviest tails: on Student-t(3) buckets ORQ-9's levels gain g ~ 3.8 and its 4-bit second
    phase adds 1.0-1.1 times the first phase's variance (the others stay <= 0.4); 5 bits would
    keep it below, at 11% more bytes than 1/4 of fp16's ring. What the model leaves out:
    gradients that agree across ranks more than they differ widen R towards N·r, and the ratio
    grows with them (at N = 4 and gradients 10:1 signal to noise, ORQ-3's total error is 1.4x
    gather's). The old sqrt(N)-finer ORQ covered that worst case at log2 sqrt(N) more bits at
    every N; here the owner's error feedback (``ef``), where on, carries the rest, and the quality
    study measures it (results/quality/quality_second_phase.md). Schemes without a finer form
    (two-level, sign, Top-K, TernGrad) keep their own, as before: their error feedback carries
    the rest. One rank (N = 1) has no sum to re-quantize: the scheme itself."""
    if nranks <= 1 or not isinstance(scheme, LevelScheme) or scheme.refined(2.0) == scheme:
        return scheme
    return Uniform(bits=second_phase_bits(scheme.symbols), rounding=Rounding.STOCHASTIC, bucket=scheme.bucket,
                   clip=scheme.clip, scales=scheme.scales)
