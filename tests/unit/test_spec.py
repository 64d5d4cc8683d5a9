"""Config strings and the scheme registry (hvd_gradq/spec.py)."""

from __future__ import annotations

import dataclasses
import enum

import pytest

import hvd_gradq
from hvd_gradq import spec
from hvd_gradq.errors import GradqError, SpecError
from hvd_gradq.policy import KEYS
from hvd_gradq.schemes.scheme import Scheme

# Non-default parameter sets: every parameter of every scheme is moved off its default at
# least once here (checked by test_examples_cover_every_parameter).
NON_DEFAULT = [
    "none:bucket=64,ef=true,nonfinite=skip",
    "fp16:overflow=saturate,bucket=1",
    "uniform:bits=4,clip=2.0,scales=fp16",
    "uniform:bits=1,nonfinite=raise",
    "uniform:bits=5,rounding=stochastic",
    "orq:levels=3,warmup=100",
    "fp16:overflow=raise",
    "qsgd:levels=2,norm=l2",
    "qsgd:levels=7,bucket=100,ef=true",
    "terngrad:clip=0",
    "terngrad:clip=3.25,scales=fp16",
    "sign:ef=true,bucket=1000",
    "topk:ratio=0.30000000000000004,values=orq",
    "topk:ratio=1,values=none",
    "bingrad:variant=pb,scales=fp16",
    "orq:levels=3,clip=1.5",
    "orq:levels=9,bucket=128",
    "orq:levels=256",
]


def _default(f: dataclasses.Field) -> object:
    return f.default


def test_names_lists_every_builtin_scheme():
    assert set(hvd_gradq.names()) >= {"none", "fp16", "uniform", "qsgd", "terngrad", "sign", "topk", "bingrad", "orq"}
    assert hvd_gradq.names() == sorted(hvd_gradq.names())


@pytest.mark.parametrize("name", spec.names())
def test_canonical_round_trip_defaults(name):
    s = spec.parse(name)
    assert s.name == name
    # every parameter at its default, the policy at the scheme's: the canonical text is the name
    assert s.spec == s.scheme.spec == name
    again = spec.parse(s.spec)
    assert again == s
    assert again.spec == s.spec
    # spelling out a default changes nothing
    first = next(f for f in dataclasses.fields(s.scheme) if f.init)
    value = first.default.value if isinstance(first.default, enum.Enum) else first.default
    assert spec.parse(f"{name}:{first.name}={value}") == s


@pytest.mark.parametrize("text", NON_DEFAULT)
def test_canonical_round_trip_non_default(text):
    s = spec.parse(text)
    assert spec.parse(s.spec) == s
    assert spec.parse(s.spec).spec == s.spec
    given = [item.split("=")[0] for item in text.split(":", 1)[1].split(",")]
    # every value here is off its default, so the canonical text names exactly these keys: the
    # scheme's in declaration order, then the policy's
    keys = [item.split("=")[0] for item in s.spec.split(":", 1)[1].split(",")]
    assert sorted(keys) == sorted(given)
    assert keys == [k for k in keys if k not in KEYS] + [k for k in KEYS if k in keys]
    assert not set(s.scheme.spec.partition(":")[2].split("=")) & set(KEYS)  # the header's text: no policy
    # every value given is what the object holds
    for item in text.split(":", 1)[1].split(","):
        key, val = item.split("=")
        got = getattr(s.policy, KEYS[key]) if key in KEYS else getattr(s.scheme, key)
        if key == "ef":
            got = s.policy.ef
        if isinstance(got, enum.Enum):
            got = got.value
        if isinstance(got, bool):
            assert got == (val == "true")
        elif isinstance(got, (int, float)):
            assert got == type(got)(val)
        else:
            assert got == val
    # and a different spec is a different object
    assert s != spec.parse(s.name)


def test_examples_cover_every_parameter():
    from hvd_gradq.schemes.level import LevelScheme

    shared = {f.name for f in dataclasses.fields(LevelScheme)}
    moved: dict[str, set[str]] = {}
    policies: set[str] = set()
    for text in NON_DEFAULT:
        s = spec.parse(text).scheme
        for f in dataclasses.fields(s):
            if f.init and getattr(s, f.name) != _default(f):
                moved.setdefault(s.name, set()).add(f.name)
        policies |= {key for key in KEYS if f"{key}=" in text}
    assert policies == set(KEYS)
    everything: set[str] = set().union(*moved.values())
    for name in spec.names():
        fields = {f.name for f in dataclasses.fields(spec.scheme_class(name)) if f.init}
        # each scheme's own parameters are exercised on that scheme, shared ones somewhere
        assert fields - shared <= moved.get(name, set()), name
        assert fields <= everything, name


def test_parse_is_lenient_about_case_and_spaces():
    assert spec.parse("  ORQ : Levels = 3 , EF = TRUE ") == spec.parse("orq:levels=3,ef=true")


def test_build_and_replace():
    s = spec.build("orq", levels=9, ef=True)
    assert s == spec.parse("orq:levels=9,ef=true")
    assert s.scheme.replace(levels=3) == spec.parse("orq:levels=3,ef=true").scheme
    assert s.policy.ef and s.policy.feedback == "classic"
    with pytest.raises(SpecError, match="levels"):
        s.scheme.replace(levels=1)


def test_duplicate_registration_refused():
    class Impostor(Scheme):
        pass

    with pytest.raises(SpecError, match=r"orq.*already registered"):
        spec.register("orq")(Impostor)
    # the registry is unchanged and the impostor was not renamed
    assert spec.scheme_class("orq").__name__ == "ORQ"
    assert Impostor.name != "orq"
    assert type(spec.parse("orq:levels=3").scheme).__name__ == "ORQ"


def test_errors_are_value_errors():
    assert issubclass(SpecError, GradqError)
    assert issubclass(SpecError, ValueError)


def test_unknown_scheme_lists_valid_names():
    with pytest.raises(SpecError) as e:
        spec.parse("orq5:levels=5")
    msg = str(e.value)
    assert "orq5" in msg
    for name in spec.names():
        assert name in msg


def test_empty_spec_lists_valid_names():
    with pytest.raises(SpecError) as e:
        spec.parse("   ")
    for name in spec.names():
        assert name in str(e.value)


@pytest.mark.parametrize("name", spec.names())
def test_unknown_key_lists_valid_keys(name):
    with pytest.raises(SpecError) as e:
        spec.parse(f"{name}:levls=5")
    msg = str(e.value)
    assert "levls" in msg
    for f in dataclasses.fields(spec.scheme_class(name)):
        if f.init:
            assert f.name in msg
    for key in KEYS:  # the policy's keys are valid in every spec
        assert key in msg


BAD = [
    # (spec, words the message must contain)
    ("orq:levels=1", ["levels", "2"]),
    ("orq:levels=0", ["levels"]),
    ("orq:levels=257", ["levels", "256"]),
    ("orq:levels=2.5", ["levels", "integer"]),
    ("orq:levels=3.0", ["levels", "integer"]),
    ("orq:levels=five", ["levels", "integer"]),
    ("qsgd:levels=0", ["levels", "1"]),
    ("uniform:bits=0", ["bits", "1 .. 8"]),
    ("uniform:bits=9", ["bits", "1 .. 8"]),
    ("uniform:bits=-1", ["bits"]),
    ("orq:bucket=0", ["bucket", "positive"]),
    ("sign:bucket=-512", ["bucket", "positive"]),
    ("none:bucket=0", ["bucket"]),
    ("orq:bucket=99999999999", ["bucket", "too large"]),
    ("topk:ratio=0", ["ratio", "0 < ratio <= 1"]),
    ("topk:ratio=-0.5", ["ratio"]),
    ("topk:ratio=1.5", ["ratio", "0 < ratio <= 1"]),
    ("topk:ratio=nan", ["ratio", "finite"]),
    ("topk:ratio=inf", ["ratio", "finite"]),
    ("topk:ratio=lots", ["ratio", "number"]),
    ("topk:values=topk", ["values", "fp16"]),
    ("topk:values=zip", ["values", "orq"]),
    ("orq:ef=maybe", ["ef", "boolean", "true or false"]),
    ("orq:ef=2", ["ef", "boolean"]),
    ("qsgd:norm=l3", ["norm", "max", "l2"]),
    ("bingrad:variant=x", ["variant", "b", "pb"]),
    ("orq:nonfinite=ignore", ["nonfinite", "raise", "skip", "propagate"]),
    ("orq:scales=fp8", ["scales", "fp32", "fp16"]),
    ("fp16:overflow=wrap", ["overflow", "raise", "saturate"]),
    ("terngrad:clip=-1", ["clip", ">= 0"]),
    ("orq:levels", ["levels", "key=value"]),
    ("orq:levels=", ["key=value"]),
    ("orq:=3", ["key=value"]),
    ("orq:levels=3,levels=5", ["levels", "twice"]),
]


@pytest.mark.parametrize("text,words", BAD)
def test_bad_values_raise_spec_error_naming_the_problem(text, words):
    with pytest.raises(SpecError) as e:
        spec.parse(text)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    for w in words:
        assert w in msg, (text, msg)


def test_bad_python_values_through_build():
    with pytest.raises(SpecError, match="integer"):
        spec.build("orq", levels=True)
    with pytest.raises(SpecError, match="integer"):
        spec.build("orq", levels=4.5)
    with pytest.raises(SpecError, match="number"):
        spec.build("topk", ratio=False)
    assert spec.build("orq", levels=4.0) == spec.parse("orq:levels=4")


def test_non_string_spec_refused():
    with pytest.raises(SpecError, match="string"):
        spec.parse(5)  # type: ignore[arg-type]


def test_quantize_rejects_a_bad_spec_with_spec_error():
    import numpy as np

    with pytest.raises(SpecError):
        hvd_gradq.quantize(np.zeros(4, np.float32), "orq:levels=1")


def test_defaults_in_canonical_strings():
    """The defaults as the canonical text spells them: not at all (only what differs is written)."""
    for name in spec.names():
        assert "nonfinite" not in spec.parse(name).spec, name
        assert spec.parse(name).policy.nonfinite.value == "propagate"
    assert spec.parse("fp16").spec == "fp16"
    # the old canonical spelling, every default written out, names the same scheme and policy
    assert spec.parse("fp16:bucket=512,ef=false,nonfinite=propagate,overflow=inf") == spec.parse("fp16")
    assert spec.parse("fp16:bucket=512,ef=false,nonfinite=propagate,warmup=0,overflow=inf") == spec.parse("fp16")
    with pytest.raises(SpecError, match="warmup=-1"):
        spec.parse("orq:warmup=-1")
    assert spec.parse("fp16:overflow=raise") != spec.parse("fp16")
    assert spec.parse("orq:nonfinite=raise").spec == "orq:nonfinite=raise"
    assert spec.parse("orq:nonfinite=raise").scheme == spec.parse("orq").scheme  # the maths: the same
    # error feedback: on by default for BinGrad only (the quality study's recipe), off elsewhere;
    # a spec that spells ef= keeps its meaning whatever the default
    assert spec.parse("bingrad").spec == "bingrad" and spec.parse("bingrad").policy.ef is True
    assert spec.parse("bingrad:ef=false").spec == "bingrad:ef=false"
    assert spec.parse("bingrad:ef=false").policy.ef is False
    assert [n for n in spec.names() if spec.parse(n).policy.ef] == ["bingrad"]
    assert spec.parse(spec.parse("bingrad:ef=false").spec) == spec.parse("bingrad:ef=false")


@pytest.mark.parametrize("text", ["orq:levels=5", "qsgd", "uniform:bits=4", "sign", "topk", "bingrad", "fp16"])
def test_policy_never_reaches_the_payload(text):
    """Payloads of finite gradients are the same bytes, header included, under every policy
    (nonfinite, ef, warmup): the header names the scheme alone, and decodes alike."""
    import numpy as np

    x = np.random.default_rng(1).standard_normal(1100).astype(np.float32)
    sep = "," if ":" in text else ":"
    new = hvd_gradq.quantize(x, text, seed=5)
    for policy in ("nonfinite=raise", "nonfinite=skip", "ef=true", "ef=false", "warmup=7"):
        old = hvd_gradq.quantize(x, f"{text}{sep}{policy}", seed=5)
        assert old.to_bytes() == new.to_bytes(), policy
        back = hvd_gradq.Payload.from_bytes(old.to_bytes())
        assert back.scheme == spec.parse(text).scheme
        assert hvd_gradq.dequantize(back).tobytes() == hvd_gradq.dequantize(new).tobytes()
