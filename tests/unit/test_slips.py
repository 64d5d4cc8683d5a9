"""Slips a new user makes, each a clear error (or warning) that says what to do; and factories
whose signatures and help() show every keyword (hvd_gradq/frontend/factory.py, guards.py).

Expected parameter lists are read from the scheme classes' dataclass fields and the compressors'
constructors directly (``dataclasses.fields``, ``inspect.signature``), not through the factory
code they check. What needs Horovod's own call path runs in one fresh interpreter at the end
(:func:`test_slips_through_horovod`): both frameworks' Horovod libraries, initialized or not as
each case needs, which a shared pytest process cannot undo.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import os
import pydoc
import re
import subprocess
import sys
import warnings

import pytest

import hvd_gradq
from hvd_gradq.errors import GradqError, SpecError
from hvd_gradq.frontend.factory import FRONTEND_ONLY
from hvd_gradq.plan.decide import choose
from hvd_gradq.plan.pattern import REQUESTABLE, Pattern
from hvd_gradq.schemes.registry import declarations
from hvd_gradq.spec import scheme_class

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")

import hvd_gradq.tensorflow as gq_tf  # noqa: E402
import hvd_gradq.torch as gq_torch  # noqa: E402

FRONTENDS = {"torch": gq_torch, "tensorflow": gq_tf}


@pytest.fixture(scope="module")
def hvd_tf():
    """horovod.tensorflow, initialized single-process (the TF compressor asks for its rank when
    built), as tests/unit/test_tf_ops.py does."""
    import horovod.tensorflow as hvd

    hvd.init()
    return hvd


def _expected_scheme_keywords(scheme: str) -> dict[str, object]:
    out = {}
    for f in dataclasses.fields(scheme_class(scheme)):
        if f.init:
            out[f.name] = f.default.value if isinstance(f.default, enum.Enum) else f.default
    # the policy's keywords (hvd_gradq.policy), the same in every factory; ef's default the class's
    return out | {"ef": scheme_class(scheme).default_ef, "nonfinite": "propagate", "warmup": 0}


def _compressor_keywords(module) -> dict[str, object]:
    params = list(inspect.signature(module.GradqCompressor.__init__).parameters.values())[2:]  # self, scheme
    return {p.name: p.default for p in params}


# -- factories with real signatures ----------------------------------------------------------------------
@pytest.mark.parametrize("frontend", sorted(FRONTENDS))
@pytest.mark.parametrize("export,scheme", [(d.export, d.name) for d in declarations() if d.export])
def test_factory_signature_is_every_scheme_parameter_and_compressor_option(frontend, export, scheme):
    factory = getattr(FRONTENDS[frontend], export)
    params = inspect.signature(factory).parameters
    want = _expected_scheme_keywords(scheme)
    for name, default in want.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, (export, name)
        assert params[name].default == default, (export, name, params[name].default, default)
    options = _compressor_keywords(FRONTENDS[frontend])
    for name, default in options.items():
        assert params[name].default == default, (export, name)
    assert set(params) == set(want) | set(options)
    assert "link_gbps" in params  # documented in the README; once missing from a hand-kept list
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())


def test_factory_signatures_put_the_schemes_own_parameters_first():
    first = {name: next(p.name for p in inspect.signature(f).parameters.values() if p.kind is p.KEYWORD_ONLY)
             for name, f in (("ORQ", gq_torch.ORQ), ("QSGD", gq_tf.QSGD), ("Uniform", gq_torch.Uniform),
                             ("TopK", gq_tf.TopK), ("BinGrad", gq_torch.BinGrad), ("FP16", gq_tf.FP16))}
    assert first == {"ORQ": "levels", "QSGD": "levels", "Uniform": "bits", "TopK": "ratio", "BinGrad": "variant",
                     "FP16": "overflow"}
    assert inspect.signature(gq_torch.BinGrad).parameters["ef"].default is True  # BinGrad's own default
    # PyTorch keeps named_parameters positional (the README's examples pass it either way)
    p0 = next(iter(inspect.signature(gq_torch.ORQ).parameters.values()))
    assert p0.name == "named_parameters" and p0.kind is p0.POSITIONAL_OR_KEYWORD
    assert "named_parameters" not in inspect.signature(gq_tf.ORQ).parameters


@pytest.mark.parametrize("frontend", sorted(FRONTENDS))
def test_help_shows_levels_defaults_and_options(frontend):
    text = pydoc.render_doc(FRONTENDS[frontend].ORQ, renderer=pydoc.plaintext)
    assert "ORQ(" in text and "levels: int = 5" in text, text[:800]  # the signature line
    assert "levels (int, default 5): number of levels" in text  # the scheme's own doc line
    assert "link_gbps" in text and "seed (default 0): base seed" in text  # compressor options, documented
    assert "compression=gq.ORQ(levels=5)" in text
    spec_text = pydoc.render_doc(FRONTENDS[frontend].from_spec, renderer=pydoc.plaintext)
    assert "link_gbps" in spec_text and "pattern" in spec_text


def test_factories_accept_link_gbps_in_both_frontends(hvd_tf):
    for gq in (gq_torch, gq_tf):
        comp = gq.ORQ(levels=5, link_gbps=1)
        assert comp.link_gbps == 1.0 and comp.scheme.spec == hvd_gradq.parse("orq:levels=5").spec
        assert gq.from_spec("orq:levels=3", link_gbps=2.5).link_gbps == 2.5


def test_frontend_only_table_matches_the_two_compressors():
    torch_keys, tf_keys = set(_compressor_keywords(gq_torch)), set(_compressor_keywords(gq_tf))
    want = {k: "hvd_gradq.torch" for k in torch_keys - tf_keys} | {k: "hvd_gradq.tensorflow" for k in tf_keys - torch_keys}
    assert FRONTEND_ONLY == want


# -- slips at the call --------------------------------------------------------------------------------------
@pytest.mark.parametrize("frontend", sorted(FRONTENDS))
def test_positional_scheme_values_are_refused_with_the_keyword_form(frontend):
    gq = FRONTENDS[frontend]
    with pytest.raises(SpecError, match=r"ORQ takes keyword arguments only.*: ORQ\(levels=5\)"):
        gq.ORQ(5)
    with pytest.raises(SpecError, match=r"Uniform takes keyword arguments only.*: Uniform\(bits=4\)"):
        gq.Uniform(4)
    with pytest.raises(SpecError, match=r"keyword arguments only"):
        gq.QSGD([("w", torch.nn.Parameter(torch.zeros(2)))], 4)


def test_torch_named_parameters_may_be_positional():
    model = torch.nn.Linear(3, 2)
    comp = gq_torch.ORQ(model.named_parameters(), levels=3)
    assert sorted(comp._params) == ["bias", "weight"] and comp.scheme.levels == 3
    with pytest.raises(SpecError, match=r"keyword arguments only, besides named_parameters: ORQ\(levels=3\)"):
        gq_torch.ORQ(3)


def test_threads_is_an_option_of_both_frontends_and_sets_the_codec_threads(hvd_tf, monkeypatch):
    from hvd_gradq.kernels import parallel

    monkeypatch.setattr(parallel, "_configured", None)  # what the compressors set, undone after the test
    for gq in (gq_torch, gq_tf):
        for k, call in enumerate((gq.ORQ, lambda threads: gq.from_spec("orq", threads=threads),  # noqa: B023
                                  lambda threads: gq.from_env(default="orq", threads=threads)), start=2):  # noqa: B023
            call(threads=k)
            assert parallel.configured() == k and parallel.resolve() == k
        gq.ORQ(threads=0)  # inline: one codec thread
        assert parallel.resolve() == 1
        with pytest.raises(GradqError, match=r"threads=: 65 is not a number of threads; use 0 \(inline\) \.\. 64"):
            gq.ORQ(threads=65)


def test_options_of_the_other_frontend_name_the_frontend_that_has_them():
    for call in (lambda: gq_tf.BinGrad(codec="host"), lambda: gq_tf.from_spec("orq", codec="host"),
                 lambda: gq_tf.from_env(default="orq", codec="host")):
        with pytest.raises(SpecError, match=r"^codec= is PyTorch only \(hvd_gradq.torch\)"):
            call()
    with pytest.raises(SpecError, match=r"^named_parameters= is PyTorch only"):
        gq_tf.ORQ(named_parameters=[])
    for call in (lambda: gq_torch.ORQ(name="x"), lambda: gq_torch.from_spec("orq", name="x")):
        with pytest.raises(SpecError, match=r"^name= is TensorFlow only \(hvd_gradq.tensorflow\)"):
            call()


def test_unknown_keywords_name_the_closest_valid_one():
    with pytest.raises(SpecError, match=r"ORQ: unknown keyword levls= \(did you mean levels=\?\); valid: .*link_gbps"):
        gq_torch.ORQ(levls=3)
    with pytest.raises(SpecError, match=r"from_spec\(\): unknown keyword sed= \(did you mean seed=\?\)"):
        gq_tf.from_spec("orq", sed=1)


@pytest.mark.parametrize("frontend", sorted(FRONTENDS))
def test_uncalled_factory_and_the_class_say_how_to_build_a_compressor(frontend):
    gq = FRONTENDS[frontend]
    t = torch.ones(3) if frontend == "torch" else tf.ones(3)
    fix = rf"hvd_gradq.{frontend}.ORQ is a factory, not a compressor: pass it called, compression=gq.ORQ\(\)"
    with pytest.raises(GradqError, match=fix):
        gq.ORQ.compress(t)  # what Horovod calls on compression=gq.ORQ
    with pytest.raises(GradqError, match=fix):
        gq.ORQ.decompress(t, None)
    assert "gq.ORQ(levels=5)" in repr(gq.ORQ)
    with pytest.raises(GradqError, match=rf"hvd_gradq.{frontend}.GradqCompressor is the compressor class, not a "
                                         r"compressor: pass an instance"):
        gq.GradqCompressor.compress(t)  # compression=gq.GradqCompressor


def test_the_torch_compressor_refuses_a_tensorflow_tensor_before_horovod():
    comp = gq_torch.ORQ()  # built without hvd.init(): the refusal must come before any Horovod call
    with pytest.raises(GradqError, match=r"this is hvd_gradq.torch's compressor, and Horovod handed it a TensorFlow "
                                         r"tensor .*import hvd_gradq.tensorflow as gq"):
        comp.compress(tf.ones((4,)))


def test_the_tensorflow_compressor_refuses_a_torch_tensor(hvd_tf):
    comp = gq_tf.ORQ()
    with pytest.raises(GradqError, match=r"this is hvd_gradq.tensorflow's compressor, and Horovod handed it a "
                                         r"PyTorch tensor .*import hvd_gradq.torch as gq"):
        comp.compress(torch.ones(4))


# -- HVD_GRADQ ----------------------------------------------------------------------------------------------
def test_a_bad_hvd_gradq_names_the_variable_and_its_value(monkeypatch, hvd_tf):
    monkeypatch.setenv("HVD_GRADQ", "orq:levls=5")
    for gq in (gq_torch, gq_tf):
        with pytest.raises(SpecError, match=r"^HVD_GRADQ='orq:levls=5' \(read by from_env\(\)\) is not a valid "
                                            r"spec: orq: unknown parameter\(s\) levls"):
            gq.from_env()


def test_from_env_warns_when_hvd_gradq_is_unset_or_empty(monkeypatch, hvd_tf):
    for value in (None, "", "  "):
        if value is None:
            monkeypatch.delenv("HVD_GRADQ", raising=False)
        else:
            monkeypatch.setenv("HVD_GRADQ", value)
        for gq in (gq_torch, gq_tf):
            with pytest.warns(UserWarning, match=r"HVD_GRADQ is not set \(or empty\): from_env\(\) builds 'none'"):
                comp = gq.from_env()
            assert comp.scheme.name == "none"
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a default the caller chose: no warning
                assert gq.from_env(default="orq:levels=3").scheme.levels == 3
    monkeypatch.setenv("HVD_GRADQ", "qsgd:levels=2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gq_torch.from_env().scheme.spec == hvd_gradq.parse("qsgd:levels=2").spec


LINE = "orq:levels=3,pattern=scatter,link_gbps=1,seed=5,fallback=true,threads=0,log_every=7"


@pytest.mark.parametrize("via", ["env", "spec"])
def test_one_line_carries_every_compressor_option(monkeypatch, hvd_tf, via):
    """HVD_GRADQ (and from_spec's text) take the compressor's options after the scheme's: a launch
    script sets everything gq.ORQ(levels=3, pattern="scatter", ...) would, without code."""
    monkeypatch.setenv("HVD_GRADQ", LINE)
    for gq, extra in ((gq_torch, ",codec=host"), (gq_tf, ",name=tm")):
        comp = gq.from_env() if via == "env" else gq.from_spec(LINE + extra)
        assert (comp.scheme.levels, comp.pattern.value, comp.link_gbps, comp.seed) == (3, "scatter", 1.0, 5)
        assert (comp.fallback, comp.threads, comp.log_every) == (True, 0, 7)
        assert comp.settings == hvd_gradq.parse("orq:levels=3")
    assert gq_torch.from_spec(LINE + ",codec=host")._reducer.codec == "host"
    assert gq_tf.from_spec(LINE + ",name=tm").cid == "tm"
    # the same option from the line and the call: agreed, or refused naming both places
    assert gq_torch.from_env(pattern="scatter", seed=5).pattern.value == "scatter"
    with pytest.raises(SpecError, match=r"^pattern is set twice: pattern='scatter' by HVD_GRADQ and "
                                        r"pattern='gather' by from_env\(\); set it in one place"):
        gq_torch.from_env(pattern="gather")
    with pytest.raises(SpecError, match=r"seed is set twice: seed=5 by the spec .* and seed=6 by from_spec"):
        gq_tf.from_spec(LINE, seed=6)


def test_a_bad_option_in_the_line_says_what_to_write(monkeypatch, hvd_tf):
    cases = [
        ("orq:levels=3,paterns=scatter", r"orq: unknown parameter\(s\) paterns \(did you mean pattern\?\); valid: the "
                                         r"scheme's .*levels.*, then the compressor's seed, pattern, .*link_gbps.* "
                                         r"\(.*link_gbps: HVD_GRADQ_LINK_GBPS, .*threads: HVD_GRADQ_THREADS"),
        ("orq:link_gbps=fast", r"link_gbps='fast' is not a number"),
        ("orq:threads=1.5", r"threads='1.5' is not an integer"),
        ("orq:fallback=maybe", r"fallback='maybe' is not true or false"),
        ("orq:loss_scale=2", r"loss_scale= cannot be given as text: pass it in code, from_env\(loss_scale=...\)"),
    ]
    for line, message in cases:
        monkeypatch.setenv("HVD_GRADQ", line)
        for gq in (gq_torch, gq_tf):
            with pytest.raises(SpecError, match=rf"^HVD_GRADQ='{re.escape(line)}' \(read by from_env\(\)\) is not a "
                                                rf"valid spec: {message}"):
                gq.from_env()
    monkeypatch.setenv("HVD_GRADQ", "orq:codec=host")
    with pytest.raises(SpecError, match=r"codec= is PyTorch only \(hvd_gradq.torch\)"):
        gq_tf.from_env()
    with pytest.raises(SpecError, match=r"a spec is the scheme's name, a colon, then key=value pairs, e.g. "
                                        r"'orq:levels=3'"):
        hvd_gradq.parse("orq,levels=3")
    with pytest.raises(SpecError, match=r"name= is TensorFlow only"):
        gq_torch.from_spec("orq:name=x")


def test_parse_says_where_a_compressor_option_belongs():
    with pytest.raises(SpecError, match=r"pattern= is an option of the compressor, not of the scheme .*"
                                        r"gq.ORQ\(\.\.\., pattern=\.\.\.\).*HVD_GRADQ.*'orq:\.\.\.,pattern=scatter'"):
        hvd_gradq.parse("orq:levels=3,pattern=scatter,link_gbps=1")
    with pytest.raises(SpecError, match=r"did you mean orq:levels=5\? 'ORQ-5' is how the README and `advise` label it"):
        hvd_gradq.parse("ORQ-5")
    with pytest.raises(SpecError, match=r"unknown scheme 'orqq' \(did you mean orq\?\)"):
        hvd_gradq.parse("orqq:levels=3")


def test_the_parser_knows_every_compressor_option_and_no_scheme_shares_a_name():
    from hvd_gradq.spec import COMPRESSOR_OPTIONS

    assert set(COMPRESSOR_OPTIONS) == set(_compressor_keywords(gq_torch)) | set(_compressor_keywords(gq_tf))
    for d in declarations():
        assert not set(_expected_scheme_keywords(d.name)) & set(COMPRESSOR_OPTIONS), d.name


def test_the_option_variables_are_the_ones_the_compressors_read():
    from hvd_gradq.frontend.settings import OPTION_VARIABLES
    from hvd_gradq.torch import device

    assert OPTION_VARIABLES["codec"] == device.ENV
    for key, var in OPTION_VARIABLES.items():  # each compressor's docstring names its variable
        for gq in (gq_torch, gq_tf):
            if key in _compressor_keywords(gq):
                assert var in gq.GradqCompressor.__doc__, (key, var)


# -- patterns -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["orq:levels=5", "bingrad", "topk", "none", "fp16"])
def test_summable_refusal_lists_every_pattern_that_runs(spec):
    scheme = hvd_gradq.parse(spec).scheme
    assert choose(hvd_gradq.parse("qsgd").scheme, 1 << 16, 1, 4, Pattern.SUMMABLE) is Pattern.SUMMABLE  # where it runs
    with pytest.raises(SpecError, match="Valid here: ") as info:
        choose(scheme, 1 << 16, 1, 4, Pattern.SUMMABLE)
    listed = str(info.value).split("Valid here: ")[1].split(", ")
    assert set(listed) == {p.value for p in REQUESTABLE} - {"summable"}
    for value in listed:  # everything it offers runs for this scheme (here 2 hosts of 2 ranks)
        choose(scheme, 1 << 16, 1, 4, Pattern(value), local=2)


def test_forced_hierarchical_that_cannot_run_warns_what_runs_instead():
    orq = hvd_gradq.parse("orq:levels=5").scheme
    with pytest.warns(UserWarning, match=r"pattern=hierarchical needs several hosts with several ranks each.*"
                                         r"runs as hierarchical's cross-host part alone: gather or scatter"):
        got = choose(orq, 123457, 1, 4, Pattern.HIERARCHICAL, local=1)
    assert got in (Pattern.GATHER, Pattern.SCATTER)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # two hosts of two ranks: it runs as asked, silently
        assert choose(orq, 123457, 1, 4, Pattern.HIERARCHICAL, local=2) is Pattern.HIERARCHICAL


# -- through Horovod, in a fresh interpreter ----------------------------------------------------------------
_SCRIPT = r"""
import json, torch, tensorflow as tf
import horovod.torch as hvd, horovod.tensorflow as hvd_tf
import hvd_gradq.torch as gq, hvd_gradq.tensorflow as gq_tf
from hvd_gradq.errors import GradqError

out = {}
def err(f):
    try:
        f()
        return "no error"
    except Exception as e:
        return f"{type(e).__name__}: {e}"

hvd.init()  # a PyTorch script: horovod.tensorflow is imported but never initialized
out["uncalled"] = err(lambda: hvd.allreduce(torch.ones(3), name="u", compression=gq.ORQ))
out["class"] = err(lambda: hvd.allreduce(torch.ones(3), name="c", compression=gq.GradqCompressor))
out["tf_in_torch"] = err(lambda: gq_tf.ORQ())
# checkpoints: all_ranks at one rank, and another scheme's state
comp = gq.ORQ(levels=5, ef=True)
comp._store.residuals = {"w": torch.arange(4.0)}
comp._steps = {"w": 7}
state = comp.state_dict(all_ranks=True, timeout=30)
out["ranks"] = {str(r): {k: v.tolist() for k, v in d.items()} for r, d in state["ranks"].items()}
other = gq.QSGD(ef=True)
out["other_scheme"] = err(lambda: other.load_state_dict(state))
other.load_state_dict(state, strict=False)
out["switched"] = [other._steps, len(other._residuals)]
same = gq.ORQ(levels=5, ef=True)
same.load_state_dict(state)
out["same"] = [same._steps, same._residuals["w"].tolist()]
out["bad_timeout"] = err(lambda: comp.state_dict(all_ranks=True, timeout=0))
hvd_tf.init()
out["tf_uncalled"] = err(lambda: hvd_tf.allreduce(tf.ones(3), name="tu", compression=gq_tf.ORQ))
out["tf_traced"] = err(lambda: tf.function(lambda: hvd_tf.allreduce(tf.ones(3), name="tt", compression=gq_tf.ORQ))())
print("RESULT" + json.dumps(out))
"""


def test_slips_through_horovod():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    import json

    out = json.loads(lines[-1][len("RESULT"):])
    assert out["uncalled"].startswith("GradqError: hvd_gradq.torch.ORQ is a factory, not a compressor: pass it "
                                      "called, compression=gq.ORQ()"), out["uncalled"]
    assert out["class"].startswith("GradqError: hvd_gradq.torch.GradqCompressor is the compressor class"), out["class"]
    assert out["tf_in_torch"].startswith("GradqError: this is hvd_gradq.tensorflow's compressor, and this process "
                                         "initialized horovod.torch"), out["tf_in_torch"]
    assert "import hvd_gradq.torch as gq" in out["tf_in_torch"]
    assert out["ranks"] == {"0": {"w": [0.0, 1.0, 2.0, 3.0]}}
    assert "load_state_dict(state, strict=False)" in out["other_scheme"], out["other_scheme"]
    assert out["switched"] == [{"w": 7}, 0]  # steps kept, another scheme's residuals dropped
    assert out["same"] == [{"w": 7}, [0.0, 1.0, 2.0, 3.0]]  # the same scheme resumes its residuals
    assert out["bad_timeout"].startswith("GradqError: timeout=0 must be a positive number"), out["bad_timeout"]
    for key in ("tf_uncalled", "tf_traced"):  # eager, and inside a tf.function trace
        assert "hvd_gradq.tensorflow.ORQ is a factory, not a compressor: pass it called" in out[key], out[key]
