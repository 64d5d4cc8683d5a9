"""A new scheme is one file (issue 32, part 3): its module declares it (``@register(name,
export=..., doc=..., speed=..., calibrate=...)``) and everything above reads that declaration.

The toy below lives in a module this test writes to a temporary folder and imports: nothing else
is written or edited, yet the scheme is reached by spec strings (``hvd_gradq.parse``), both
frontends' factories and ``from_spec``, the CPU cost model's table key and the calibration's
list. What adding a scheme touches, then:

* ``hvd_gradq/schemes/<name>.py``: the class and its ``@register(...)`` (found by the schemes
  package without an import list);
* its kernel in ``hvd_gradq/kernels/``, if it has one (without, the NumPy reference runs);
* ``hvd_gradq/plan/cpu_table.py``: its figures, written by ``bench/scale/calibrate_cpu.py`` (without,
  the cost model takes it as slow, ``cpu_cost.UNKNOWN``).

Constructing the frontends' compressors is enough here (no step runs); the TensorFlow one asks
Horovod for its rank, so horovod.tensorflow is initialized single-process, as in test_slips.py.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

import hvd_gradq
from hvd_gradq import spec
from hvd_gradq.cli import calibrate
from hvd_gradq.errors import SpecError
from hvd_gradq.plan import cpu_cost
from hvd_gradq.schemes import registry

PKG = Path(hvd_gradq.__file__).resolve().parent

TOY = '''\
"""A toy scheme: each value rounded to the nearest multiple of ``step``, sent as float32."""
from __future__ import annotations

from dataclasses import dataclass

from hvd_gradq.errors import SpecError
from hvd_gradq.schemes.options import param
from hvd_gradq.schemes.registry import register
from hvd_gradq.schemes.scheme import Scheme, Section


@register("toy", export="Toy", doc="A toy: values rounded to multiples of ``step``.", speed="step",
          calibrate=["toy:step=0.5", "toy:step=0.25"])
@dataclass(frozen=True, kw_only=True)
class Toy(Scheme):
    step: float = param(0.5, float, "the rounding step, > 0")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.step > 0:
            raise SpecError(f"toy: step={self.step} must be > 0")

    def sections(self, n):
        return [Section("values", "float32", n)]

    def code_bits(self, n):
        return 32.0 * n

    def encode(self, ops, x, seed):
        return {"values": ops.f32(ops.floor(ops.f32(x) / self.step + 0.5) * self.step)}

    def decode(self, ops, parts, n):
        return ops.f32(parts["values"])
'''


def _package_files() -> dict[str, str]:
    return {str(p.relative_to(PKG)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(PKG.rglob("*.py"))}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy scheme, registered by importing its module (and nothing else); taken out of the
    registry and the caches that saw it afterwards, since the registry refuses a name twice. The
    frontends are imported first, as a plugin meets them in a running program: the toy reaches
    them through their module ``__getattr__`` and leaves their exports as they were (a frontend
    imported while the toy is registered would export it for the rest of the process)."""
    import hvd_gradq.tensorflow
    import hvd_gradq.torch  # noqa: F401

    before = _package_files()
    (tmp_path / "gradq_toy_scheme.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("gradq_toy_scheme")
    try:
        yield module.Toy
    finally:
        registry.unregister("toy")
        sys.modules.pop("gradq_toy_scheme", None)
        spec.parse.cache_clear()
        cpu_cost.ns_per_element.cache_clear()
    assert _package_files() == before  # the package itself was not touched
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["gradq_toy_scheme.py"]


@pytest.fixture(scope="module")
def hvd_tf():
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd


def test_the_toy_is_a_scheme_by_its_own_file_alone(toy):
    config = hvd_gradq.parse("toy:step=0.25,ef=true")
    assert type(config.scheme) is toy and config.scheme.step == 0.25 and config.policy.ef
    assert config.spec == "toy:step=0.25,ef=true" and hvd_gradq.parse(config.spec) == config
    assert "toy" in spec.names()
    x = np.array([0.1, 0.2, -0.9, 1.3], np.float32)
    back = hvd_gradq.dequantize(hvd_gradq.quantize(x, "toy:step=0.25"))
    np.testing.assert_array_equal(back, np.array([0.0, 0.25, -1.0, 1.25], np.float32))
    with pytest.raises(SpecError, match=r"toy: unknown parameter\(s\) stp; valid: .*step"):
        hvd_gradq.parse("toy:stp=1")
    # the cost model's key and the calibration's list come from the declaration
    assert cpu_cost.table_key(config.scheme) == "toy:0.25"
    assert cpu_cost.ns_per_element(config.scheme) == cpu_cost.UNKNOWN  # not measured yet: on the slow side
    assert calibrate.every()[-2:] == ["toy:step=0.5", "toy:step=0.25"]


def test_both_frontends_build_the_toy_through_their_factories(toy, hvd_tf):
    pytest.importorskip("torch")
    import hvd_gradq.tensorflow as gq_tf
    import hvd_gradq.torch as gq_torch

    for gq in (gq_torch, gq_tf):
        factory = gq.Toy  # a scheme registered after the frontend loaded: the module's __getattr__
        assert factory is gq.Toy and factory.__module__ == gq.__name__
        params = inspect.signature(factory).parameters
        assert params["step"].default == 0.5 and params["step"].kind is inspect.Parameter.KEYWORD_ONLY
        assert "A toy: values rounded" in factory.__doc__ and "step (float, default 0.5)" in factory.__doc__
        comp = factory(step=0.125, seed=3)
        assert isinstance(comp, gq.GradqCompressor) and comp.scheme == toy(step=0.125)
        assert gq.from_spec("toy:step=2").scheme == toy(step=2.0)
        with pytest.raises(SpecError, match=r"Toy takes keyword arguments only.*Toy\(step=0.5\)"):
            factory(0.5)
    with pytest.raises(AttributeError, match="has no attribute 'Toyy'"):
        gq_torch.Toyy  # noqa: B018


def test_declarations_refuse_a_taken_name_or_export_and_say_which():
    orq = spec.scheme_class("orq")
    with pytest.raises(SpecError, match=r"scheme 'orq2': export name 'ORQ' is already declared by scheme 'orq' \(ORQ\)"):
        registry.register("orq2", export="ORQ")(orq)
    with pytest.raises(SpecError, match=r"scheme 'orq3': export='not a name' is not a public Python name"):
        registry.register("orq3", export="not a name")
    with pytest.raises(SpecError, match=r"scheme 'orq4': speed='level' is not one of its parameters"):
        registry.register("orq4", speed="level")(orq)
    assert "orq2" not in spec.names() and "orq4" not in spec.names() and orq.name == "orq"
    with pytest.raises(SpecError, match=r"unknown scheme 'nosuch'"):
        registry.unregister("nosuch")


def test_every_export_and_speed_key_is_declared_by_its_scheme():
    # the factories both frontends export, and the table's keys: nothing but the declarations
    declared = {d.export: d.name for d in registry.declarations() if d.export}
    assert declared == {"NoCompression": "none", "FP16": "fp16", "Uniform": "uniform", "QSGD": "qsgd",
                        "TernGrad": "terngrad", "Sign": "sign", "TopK": "topk", "BinGrad": "bingrad", "ORQ": "orq"}
    pytest.importorskip("torch")
    import hvd_gradq.tensorflow as gq_tf
    import hvd_gradq.torch as gq_torch

    for gq, own in ((gq_torch, {"ENV", "GradqCompressor", "from_env", "from_spec"}),
                    (gq_tf, {"ENV", "GradqCompressor", "from_env", "from_spec", "TF", "TFOps"})):
        assert sorted(gq.__all__) == sorted(own | set(declared)), gq.__name__
        for name in declared:  # real module attributes (help(gq), dir(gq), star imports), not __getattr__'s
            assert vars(gq)[name].scheme == declared[name] and vars(gq)[name].__module__ == gq.__name__
    from hvd_gradq.plan.cpu_table import NS_PER_ELEMENT

    keys = [cpu_cost.table_key(spec.parse(s).scheme) for s in calibrate.every()]
    assert len(keys) == len(set(keys)) and set(keys) == set(NS_PER_ELEMENT)  # the table is what they declare
    for s in calibrate.DEFAULT:
        assert s in calibrate.every(), s


#: files a scheme once had to be added to: they must name no scheme now
NAME_FREE = ["schemes/__init__.py", "torch/__init__.py", "tensorflow/__init__.py", "plan/cpu_cost.py"]


@pytest.mark.parametrize("rel", NAME_FREE)
def test_the_files_a_scheme_once_touched_name_none(rel):
    words = {w for d in registry.declarations() for w in (d.name, d.export, d.cls.__module__.rpartition(".")[2])}
    tree = ast.parse((PKG / rel).read_text())
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.name.rpartition(".")[2] for n in ast.walk(tree) if isinstance(n, ast.alias)}
    used |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not used & words, f"{rel} names schemes: {sorted(used & words)}"
