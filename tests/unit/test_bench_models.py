"""bench/models/: the benchmark's models have the published architectures' sizes in both frameworks
(built on CPU, no Horovod), and the driver's list, arithmetic and report do what they say.

The published figures are written out here, not read from bench/models/catalog.py, so a slip in
the catalog fails too: torchvision's parameter counts (resnet18 11,689,512; resnet50 25,557,032;
mobilenet_v2 3,504,872; tensors counted from its ``named_parameters``), BERT-base's
``BertModel`` with its pooler, 109,482,240 parameters in 199 tensors, and the issue's MLP
1024-1024-1024-10 (two 1024x1024 layers and a 1024x10 one with biases: 2,109,450 in 6)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.models import catalog, models_report  # noqa: E402

PUBLISHED = {"resnet18": (11_689_512, 62), "resnet50": (25_557_032, 161), "mobilenet_v2": (3_504_872, 158),
             "mlp": (2_109_450, 6)}
OUTPUTS = {"bert": 2, "mlp": 10}  # logits a sample; the CNNs: 1000
BERT_BASE = (109_482_240, 199)  # BertModel, pooler included, no head
HEAD = (768 * 2 + 2, 2)  # the benchmark's 2-way classifier on the pooled [CLS]


def published(name: str) -> tuple[int, int]:
    if name == "bert":
        return BERT_BASE[0] + HEAD[0], BERT_BASE[1] + HEAD[1]
    return PUBLISHED[name]


def test_the_catalog_holds_the_published_sizes() -> None:
    for name in catalog.MODELS:
        assert catalog.expected(name) == published(name), name
    assert catalog.bert_params(head=False) == BERT_BASE
    # one encoder layer of BERT-base: 7,087,872 parameters (12 of them: 85.05M of the 109.5M)
    assert catalog.bert_layer_params() == 7_087_872
    assert catalog.expected("bert", layers=2) == (BERT_BASE[0] - 10 * 7_087_872 + HEAD[0], 199 - 10 * 16 + 2)


@pytest.mark.parametrize("name", sorted(catalog.MODELS))
def test_torch_model_has_the_published_size_and_runs(name: str) -> None:
    torch = pytest.importorskip("torch")
    from bench.models import torch_models

    torch.manual_seed(0)
    model = torch_models.build(name)
    assert torch_models.counts(model) == published(name)
    if name == "bert":  # a forward on a smaller stack of the same layers: the shapes, cheaply
        model = torch_models.build(name, layers=1)
    x, y = torch_models.batch(name, 2, 32, 16, torch.Generator().manual_seed(0))
    out = model(x)
    assert out.shape == (2, OUTPUTS.get(name, 1000)) and y.shape == (2,)
    assert int(y.max()) < OUTPUTS.get(name, 1000)


@pytest.mark.parametrize("name", sorted(catalog.MODELS))
def test_keras_model_has_the_published_size_and_the_torch_tensors(name: str) -> None:
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("torch")
    from bench.models import keras_models, torch_models

    tf.keras.utils.set_random_seed(0)
    model = keras_models.build(name, image=32, seq=16)
    assert keras_models.counts(model) == published(name)
    # the same tensors, up to layout: PyTorch's conv (out, in, kh, kw) / linear (out, in) against
    # Keras's (kh, kw, in, out) / (in, out). Not in the same order: a functional Keras model lists
    # its layers by depth in the graph, so a block's shortcut conv comes before its second conv,
    # as in Keras's own ResNets; Horovod then meets the same tensors in another order.
    keras_sizes = sorted(int(v.shape.num_elements()) for v in model.trainable_variables)
    assert keras_sizes == sorted(p.numel() for p in torch_models.build(name).parameters())
    x, _ = keras_models.batch(name, 2, 32, 16, seed=0)
    assert model(x, training=True).shape == (2, OUTPUTS.get(name, 1000))
    tf.keras.backend.clear_session()


def test_compression_lists_split_specs_with_commas_and_refuse_duplicates() -> None:
    assert catalog.parse_compressions("fp32,fp16,orq,bingrad") == ["fp32", "fp16", "orq", "bingrad"]
    # an option of a spec (a word with '=') stays with the spec before it
    assert catalog.parse_compressions("fp16,orq:levels=3,ef=true,uniform:bits=4") == [
        "fp16", "orq:levels=3,ef=true", "uniform:bits=4"]
    assert catalog.parse_compressions("fp16; orq:levels=3,ef=true ;") == ["fp16", "orq:levels=3,ef=true"]
    with pytest.raises(ValueError, match="twice"):
        catalog.parse_compressions("fp16,orq,fp16")
    with pytest.raises(ValueError, match="no compression"):
        catalog.parse_compressions(" , ")
    assert [catalog.baseline(s) for s in ("fp32", "fp16", "none", "orq")] == ["none", "fp16", None, None]
    catalog.check_compressions(["fp32", "orq:levels=3,pattern=scatter", "uniform:bits=4"])
    with pytest.raises(ValueError, match="orq:levels=5"):
        catalog.check_compressions(["ORQ-5"])


def _result(blocks: dict[str, list[float]], equal: bool = True) -> dict[str, Any]:
    return {"framework": "torch", "model": "resnet18", "size": 2, "batch": 16, "image": 64, "seq": 128,
            "layers": 12, "steps": 5, "warmup": 3, "rounds": len(next(iter(blocks.values()))), "unit": "img",
            "params": 11_689_512, "tensors": 62, "omp_num_threads": None, "threads": {"torch_threads": 2},
            "setup_s": 10.0,
            "compressions": {s: {"block_s": b, "ranks_equal": equal or s != "orq",
                                 "bytes_vs_fp32": None if s in ("fp32", "fp16") else 12.0,
                                 "compressor_s_a_step": None if s in ("fp32", "fp16") else 0.0425}
                             for s, b in blocks.items()}}


def test_throughput_is_all_samples_over_all_time_and_ratios_are_to_the_same_launch() -> None:
    # 2 ranks x 16 x 5 steps = 160 images a block
    rows = models_report.throughput(_result({"fp32": [4.0, 4.0], "fp16": [2.0, 2.0], "orq": [1.0, 3.0]}))
    assert rows["fp16"]["per_s"] == pytest.approx(80.0)
    assert rows["orq"]["per_s"] == pytest.approx(80.0)  # 320 images in 4 s, not the mean of 160 and 53.3
    assert (rows["orq"]["min"], rows["orq"]["max"]) == pytest.approx((160 / 3, 160.0))
    assert rows["fp32"]["vs_fp16"] == pytest.approx(0.5) and rows["fp16"]["vs_fp32"] == pytest.approx(2.0)
    no_ref = models_report.throughput(_result({"orq": [1.0]}))
    assert no_ref["orq"]["vs_fp16"] is None


def test_report_has_the_summary_each_run_and_says_when_ranks_differ_or_a_run_failed() -> None:
    ok = {"link": "loopback", "threads": "default", "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 1.0, 1.0],
          "seconds": 30.0, "result": _result({"fp16": [2.0], "orq": [1.0]}, equal=False)}
    bad = {"link": "1gbit", "threads": "1", "load_before": [1.0] * 3, "load_after": [1.0] * 3, "seconds": 5.0,
           "error": "timeout after 5 s"}
    doc = {"model": "resnet18", "framework": "torch", "note": "Smoke run", "command": "bench_models.py --quick",
           "date": "today", "machine": "2 cores", "load_before": [1.0] * 3, "load_after": [2.0] * 3, "runs": [ok, bad]}
    text = models_report.markdown(doc)
    assert "**Smoke run**" in text and "11,689,512 parameters in 62 tensors" in text
    assert "| orq | 2.00x |" in text  # the summary: ratio to fp16 per run
    assert "| orq | 160.0 (160.0-160.0) | 2.00x | - | 12.00x | 42 | **NO** |" in text  # 42 ms a step inside it
    assert "| fp16 | 80.0 (80.0-80.0) | 1.00x | - | - | - | yes |" in text  # Horovod's own: no compressor time
    assert "## 1gbit, OMP_NUM_THREADS=1" in text and "Failed: timeout after 5 s" in text
    assert "RANKS DIFFER" in models_report.progress_line(ok) and "FAILED" in models_report.progress_line(bad)
    assert "`HVD_GRADQ_LINK_GBPS` set to the rate" in text  # a report from before the rate was measured
    # the rate measured on emulated links (the default): the report says so, and what each compressor priced with
    ok["result"]["compressions"]["orq"]["link"] = "0.941 Gbit/s, measured: 0.941 Gbit/s (allgather ...)"
    text = models_report.markdown({**doc, "link_rate": "measured"})
    assert "the link rate measured by `auto` at its first step" in text and "HVD_GRADQ_LINK_GBPS" not in text
    assert "priced with (`stats()['world']`): orq: 0.941 Gbit/s, measured: 0.941 Gbit/s (allgather ...)." in text


def test_driver_flags_quick_defaults_fp16_added_and_bad_input_refused(tmp_path: Path) -> None:
    from bench.models import bench_models

    args = bench_models.parse_args(["--quick", "--compressions", "orq"])
    assert args.compressions == ["fp16", "orq"] and args.links == ["loopback"] and args.threads == ["default"]
    assert (args.steps, args.rounds, args.image) == (1, 1, 32)
    assert args.out == ROOT / "results" / "raw" / "models_resnet18_torch_quick.md"
    full = bench_models.parse_args(["--model", "bert", "--framework", "tf"])
    assert full.links == ["100mbit", "1gbit", "loopback"] and full.threads == ["default", "1"]
    assert full.batch == 8 and full.compressions == ["fp32", "fp16", "orq", "bingrad"]
    assert full.link_rate == "measured" and bench_models.parse_args(["--link-rate", "given"]).link_rate == "given"
    assert full.out == ROOT / "results" / "models" / "bert_tf.md"
    argv = bench_models.worker_argv(args, "default", tmp_path / "r.json")
    assert argv[:3] == ["env", "-u", "OMP_NUM_THREADS"] and "fp16;orq" in argv
    assert bench_models.worker_argv(args, "1", tmp_path / "r.json")[:2] == ["env", "OMP_NUM_THREADS=1"]
    for bad in (["--links", "10gbit"], ["--threads", "zero"], ["--compressions", "ORQ-5"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            bench_models.parse_args(bad)
