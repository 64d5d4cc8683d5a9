"""Say what a scheme spec means: canonical form, bits an element on the wire, patterns, refusals.

It takes what ``from_spec()`` and ``HVD_GRADQ`` take (a spec, then any compressor options:
``orq:levels=3,pattern=scatter``; the options are listed, not checked here), and the labels the
README, the quality study and ``advise`` print (``ORQ-5``, ``BinGrad+EF``, ``Top-K 1%+EF``:
:func:`hvd_gradq.spec.label_spec`), saying which spec a label stands for.

The bits are the payload's size for a 1-D float32 tensor of ``--elements`` values, from the wire
format (:func:`hvd_gradq.wire.payload.header_size`: header, dimensions and the canonical spec)
and the scheme's own sections (per-bucket levels or scales, packed codes): what
:func:`hvd_gradq.quantize` lays down, byte for byte, without compiling or running a kernel.
Patterns are asked of the library's own policy (:func:`hvd_gradq.plan.decide.choose`) at
``--ranks`` ranks: a pattern the scheme cannot use prints the error a compressor would raise.
"""
from __future__ import annotations

import argparse

from ..errors import SpecError
from ..plan.decide import choose, decide
from ..plan.pattern import REQUESTABLE, Pattern
from ..schemes.options import NonFinite
from ..spec import Config, label_spec, parse, split_options
from ..wire.payload import header_size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="a scheme spec such as 'orq:levels=3' or 'bingrad:bucket=256,ef=false' (compressor "
                                "options after it, as HVD_GRADQ takes them, are listed), or a label such as ORQ-5")
    p.add_argument("--elements", type=int, default=1 << 16,
                   help="size of the tensor the bits are measured on (default 65536)")
    p.add_argument("--ranks", type=int, default=4, help="world size the patterns are asked for (default 4)")
    p.add_argument("--link-gbps", type=float, default=1.0,
                   help="link rate for the pattern auto would pick (default 1 Gbit/s)")


def read(text: str) -> Config:
    """The config ``text`` names, saying what it was read as: a label (``ORQ-5``) and the spec
    it stands for, or a spec and the compressor options that follow it."""
    try:
        spec, options = split_options(text)
        config = parse(spec)
    except SpecError:
        label = label_spec(text)
        if label is None:
            raise
        print(f"label       {text.strip()}: {label}, as the README and `advise` name it")
        return parse(label)
    print(f"spec        {spec}")
    if options:
        listed = ", ".join(f"{k}={v}" for k, v in options.items())
        print(f"options     {listed}: the compressor's (from_spec() and HVD_GRADQ pass them on; not checked here)")
    return config


def run(args: argparse.Namespace) -> int:
    if args.elements < 1 or args.ranks < 2 or not args.link_gbps > 0:
        raise SpecError("--elements must be >= 1, --ranks >= 2 and --link-gbps > 0")
    config = read(args.spec)
    scheme, policy = config.scheme, config.policy
    n = args.elements
    body = scheme.nbytes(n)
    nbytes = header_size(scheme.spec, 1) + body
    bits = 8 * nbytes / n
    print(f"canonical   {config.spec}")
    print(f"header      names {scheme.spec!r}: the scheme alone (the policy, ef/warmup/nonfinite, stays on this rank)")
    print(f"unbiased    {'yes' if scheme.unbiased else 'no (use ef=true to carry the bias over steps)'}")
    print(f"wire        {bits:.4f} bits an element at {n:,} elements, header included ({nbytes:,} bytes; "
          f"{32 / bits:.2f}x fewer than fp32); {8 * body / n:.4f} without the header")
    limit = scheme.limit
    if limit != float("inf"):
        print(f"limit       finite |x| >= {limit:.3g} cannot be computed in float32: refused "
              f"(nonfinite=skip sends such a tensor uncompressed)")
    print(f"patterns at {args.ranks} ranks:")
    for p in REQUESTABLE:
        if p is Pattern.AUTO:
            continue
        local = 2 if p is Pattern.HIERARCHICAL and args.ranks % 2 == 0 else 1
        try:
            got = choose(scheme, n, 1, args.ranks, p, local=local, link_gbps=args.link_gbps)
        except SpecError as e:
            print(f"  {p.value:13s} refused: {e}")
            continue
        note = "" if got is p else f" (runs as {got.value})"
        where = " with 2 ranks a host" if local == 2 else ""
        print(f"  {p.value:13s} ok{where}{note}")
    choice = decide(config, n, 1, args.ranks, Pattern.AUTO, link_gbps=args.link_gbps)
    got, why = choice.pattern, choice.why
    print(f"  {'auto':13s} {got.value} at {args.link_gbps:g} Gbit/s for {n:,} elements ({why})")
    if policy.nonfinite is NonFinite.SKIP:
        print("frontends   nonfinite=skip is PyTorch only (hvd_gradq.tensorflow refuses it)")
    elif policy.nonfinite is NonFinite.RAISE:
        print("frontends   TensorFlow refuses nonfinite=raise with pattern=scatter and hierarchical "
              "(auto then uses gather or summable)")
    return 0
