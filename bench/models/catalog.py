"""What the model benchmark runs, framework-free: the models with their published sizes, and the
compressions it compares (Horovod's two baselines, or any hvd_gradq spec).

The sizes are the published architectures' trainable parameters, so that a gradient exchange
here moves the bytes and the tensor count a real job moves: torchvision's ``resnet18``,
``resnet50`` and ``mobilenet_v2`` (1,000 classes), and BERT-base (``BertModel`` with its pooler:
109,482,240 parameters, 199 tensors) plus a 2-way classification head (1,538 parameters, 2
tensors), the smallest head that gives BERT a loss to train on; and the MLP the issue on speed
inside a real process sets its step targets on (Linear 1024-1024-1024-10 with ReLUs, batch 64:
2,109,450 parameters in 6 tensors, a step that is mostly the exchange). ``tests/unit/test_bench_models.py``
builds every model in both frameworks and checks it against these figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: BERT-base's shape (Devlin et al. 2019): vocabulary, width, heads, feed-forward width, positions.
BERT_VOCAB, BERT_HIDDEN, BERT_HEADS, BERT_FFN, BERT_POSITIONS, BERT_TYPES = 30522, 768, 12, 3072, 512, 2
BERT_LAYERS = 12
BERT_LABELS = 2  # the classification head's outputs
CLASSES = 1000  # the CNNs' classifier, as published (ImageNet)
MLP_WIDTH, MLP_CLASSES = 1024, 10  # the MLP's inputs and hidden widths, its outputs
#: MobileNetV2's stages (Sandler et al. 2018, table 2): expansion t, channels c, repeats n, stride s.
MOBILENET_V2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1))


@dataclass(frozen=True)
class Model:
    """One benchmark model: its published size and the defaults of a step that takes ~0.2-1 s
    on a 2-core machine (``batch`` a rank; ``unit`` is what throughput counts)."""

    name: str
    title: str
    kind: str  # "cnn" (images, ``--image`` square), "text" (tokens, ``--seq``) or "vector" (MLP_WIDTH features)
    params: int  # published trainable parameters, head included
    tensors: int  # trainable tensors (weights, biases, norm scales and shifts)
    batch: int
    unit: str  # "img", "seq" or "sample"


def bert_layer_params() -> int:
    """Parameters of one encoder layer: Q, K, V, output projections, two LayerNorms, the FFN."""
    h, f = BERT_HIDDEN, BERT_FFN
    return 4 * (h * h + h) + 2 * 2 * h + (h * f + f) + (f * h + h)


def bert_params(layers: int = BERT_LAYERS, head: bool = True) -> tuple[int, int]:
    """(parameters, tensors) of the BERT-like model with ``layers`` encoder layers; ``head``
    adds the classifier. Embeddings: words, positions, token types and a LayerNorm (5 tensors);
    16 tensors a layer; the pooler 2; the head 2."""
    h = BERT_HIDDEN
    emb = (BERT_VOCAB + BERT_POSITIONS + BERT_TYPES) * h + 2 * h
    n = emb + layers * bert_layer_params() + (h * h + h)
    t = 5 + 16 * layers + 2
    if head:
        n, t = n + h * BERT_LABELS + BERT_LABELS, t + 2
    return n, t


MODELS: dict[str, Model] = {
    "resnet18": Model("resnet18", "ResNet-18-like", "cnn", 11_689_512, 62, 16, "img"),
    "resnet50": Model("resnet50", "ResNet-50-like", "cnn", 25_557_032, 161, 16, "img"),
    "mobilenet_v2": Model("mobilenet_v2", "MobileNetV2-like", "cnn", 3_504_872, 158, 16, "img"),
    "bert": Model("bert", "BERT-base-like encoder", "text", *bert_params(), 8, "seq"),
    "mlp": Model("mlp", "MLP 1024-1024-1024-10", "vector", 2 * (MLP_WIDTH * MLP_WIDTH + MLP_WIDTH)
                 + MLP_WIDTH * MLP_CLASSES + MLP_CLASSES, 6, 64, "sample"),
}


def classes(name: str) -> int:
    """The model's outputs (logits a sample)."""
    return {"bert": BERT_LABELS, "mlp": MLP_CLASSES}.get(name, CLASSES)


#: A launch's defaults, for the worker and the driver alike: timed steps a compression a round,
#: untimed steps first, rounds, CNN input size, BERT tokens and layers, seed, SGD's rate, the list.
RUN: dict[str, Any] = {"steps": 5, "warmup": 3, "rounds": 3, "image": 64, "seq": 128, "layers": BERT_LAYERS,
                       "seed": 0, "lr": 0.01, "compressions": "fp32,fp16,orq,bingrad"}


def expected(name: str, layers: int = BERT_LAYERS) -> tuple[int, int]:
    """(parameters, tensors) that ``name`` must have (BERT with ``layers`` encoder layers)."""
    if name == "bert":
        return bert_params(layers)
    m = MODELS[name]
    return m.params, m.tensors


# ------------------------------------------------------------------------------ compressions

#: Horovod's own compressions, by the names the benchmark's list uses; every other entry is an
#: hvd_gradq spec (so ``none`` and ``fp16:overflow=raise`` are hvd_gradq's pass-through schemes).
BASELINES = {"fp32": "none", "fp16": "fp16"}  # name -> attribute of ``hvd.Compression``
REFERENCE = "fp16"  # every throughput is also given as a ratio to this one's


def baseline(spec: str) -> str | None:
    """The ``hvd.Compression`` attribute for a baseline name, or None for an hvd_gradq spec."""
    return BASELINES.get(spec.strip())


def parse_compressions(text: str) -> list[str]:
    """The ``--compressions`` list: entries separated by ``;`` (a spec may hold commas, as
    ``orq:levels=3,ef=true`` does) or, when no ``;`` is given, by ``,`` before a word without
    ``=`` (``fp32,fp16,orq,uniform:bits=4,bingrad``). Duplicates are refused: each entry is a
    row and a set of collective names."""
    if ";" in text:
        items = [s.strip() for s in text.split(";")]
    else:
        items = []
        for part in text.split(","):
            part = part.strip()
            if items and "=" in part and ":" not in part:
                items[-1] += "," + part  # an option of the spec before it
            else:
                items.append(part)
    items = [s for s in items if s]
    if not items:
        raise ValueError("no compression given")
    dup = sorted({s for s in items if items.count(s) > 1})
    if dup:
        raise ValueError(f"compression(s) given twice: {dup}")
    return items


def check_compressions(specs: list[str]) -> None:
    """Fail before any launch on a scheme hvd_gradq refuses: the scheme part of each spec goes
    through ``hvd_gradq.parse`` (framework-free); compressor options after it (``pattern=``,
    ``link_gbps=``) are left to the worker's ``from_spec``, which needs the framework."""
    from hvd_gradq.spec import parse, split_options

    for s in specs:
        if baseline(s) is None:
            parse(split_options(s)[0])
