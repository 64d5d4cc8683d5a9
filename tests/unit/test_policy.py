"""The policy beside a scheme (hvd_gradq/policy.py) and error feedback's variant slot
(hvd_gradq/feedback.py, hvd_gradq/ef_rules.py): what a spec's ef/warmup/nonfinite become, and a variant plugged in by
registering one class."""

from __future__ import annotations

import numpy as np
import pytest
from stores import DictStore

import hvd_gradq
from hvd_gradq import ef_rules, spec
from hvd_gradq.errors import SpecError
from hvd_gradq.feedback import Memory, Rule, register_rule
from hvd_gradq.policy import KEYS, Policy
from hvd_gradq.schemes.options import NonFinite
from hvd_gradq.xp import NUMPY


def test_spec_keys_split_into_scheme_and_policy():
    c = spec.parse("orq:levels=3,ef=true,warmup=10,nonfinite=raise")
    assert c.scheme == spec.parse("orq:levels=3").scheme
    assert c.policy == Policy(feedback="classic", warmup=10, nonfinite=NonFinite.RAISE)
    assert c.spec == "orq:levels=3,ef=true,nonfinite=raise,warmup=10"
    assert c.scheme.spec == "orq:levels=3"  # what a header names
    assert not any(hasattr(c.scheme, key) for key in KEYS)  # the scheme holds the maths only
    assert spec.parse(c.spec) == c


def test_policy_defaults_and_bingrad_feedback_default():
    assert spec.parse("orq").policy == Policy()
    assert not Policy().ef and Policy().warmup == 0 and Policy().nonfinite is NonFinite.PROPAGATE
    assert spec.parse("bingrad").policy == Policy(feedback="classic")
    assert spec.parse("bingrad:ef=false").policy == Policy()
    # a bare scheme handed to quantize or a compressor gets its class's default policy
    assert spec.as_config(spec.parse("bingrad").scheme) == spec.parse("bingrad")


@pytest.mark.parametrize("text,words", [
    ("orq:ef=maybe", ["orq: ef='maybe' is not a boolean; valid: true or false"]),
    ("sign:warmup=-2", ["sign:", "warmup=-2", "must be 0 (none) or a number of steps"]),
    ("orq:warmup=1.5", ["orq: warmup='1.5' is not an integer"]),
    ("qsgd:nonfinite=nope", ["qsgd: nonfinite='nope' is not valid; valid: raise, skip, propagate"]),
])
def test_policy_values_are_checked_with_the_scheme_messages(text, words):
    with pytest.raises(SpecError) as e:
        spec.parse(text)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_parse_scheme_refuses_a_policy_rather_than_drop_it():
    assert spec.parse_scheme("orq:levels=3") == spec.parse("orq:levels=3").scheme
    with pytest.raises(SpecError, match="ef=true"):
        spec.parse_scheme("orq:ef=true")


def test_classic_rule_is_the_old_arithmetic():
    mem = Memory(NUMPY, DictStore())
    x = np.array([1.0, -2.0, 0.5], np.float32)
    decoded = np.array([0.75, -2.25, 0.0], np.float32)
    mem.update("w", x, decoded)
    np.testing.assert_array_equal(mem.store.read("w", x), x - decoded)
    g = np.array([0.1, 0.2, 0.3], np.float32)
    np.testing.assert_array_equal(mem.compensate("w", g), g + (x - decoded))


def test_a_registered_variant_is_valid_in_specs_and_factories_and_memory_runs_it(monkeypatch):
    # one class: a damped residual (e <- (p - decode(p)) / 2), the kind of variant EF21-style
    # schemes need; nothing else changes for it to work
    monkeypatch.setattr(ef_rules, "_RULES", dict(ef_rules._RULES))

    @register_rule("half")
    class Half(Rule):
        def compensate(self, x, e):
            return x + e

        def residual(self, sent, decoded):
            return (sent - decoded) * 0.5

    c = spec.parse("orq:levels=3,ef=half")
    assert c.policy.feedback == "half" and c.policy.ef
    assert c.spec == "orq:levels=3,ef=half" and spec.parse(c.spec) == c
    assert spec.build("qsgd", ef="half").policy.feedback == "half"
    mem = Memory(NUMPY, DictStore(), variant=c.policy.feedback)
    x, d = np.array([1.0, 3.0], np.float32), np.array([0.0, 1.0], np.float32)
    mem.update("w", x, d)
    np.testing.assert_array_equal(mem.store.read("w", x), np.array([0.5, 1.0], np.float32))
    # the header still names the maths only
    p = hvd_gradq.quantize(np.ones(64, np.float32), c)
    assert hvd_gradq.Payload.from_bytes(p.to_bytes()).scheme.spec == "orq:levels=3"
    # a name a spec reads as a boolean, or a duplicate, cannot be registered
    with pytest.raises(SpecError):
        register_rule("half")(Half)
    with pytest.raises(SpecError):
        register_rule("on")(Half)


def test_unregistered_variant_is_refused_with_the_boolean_message():
    with pytest.raises(SpecError, match=r"ef='ef21' is not a boolean; valid: true or false$"):
        spec.parse("orq:ef=ef21")
    with pytest.raises(SpecError, match="unknown error-feedback variant"):
        Policy(feedback="ef21")


@pytest.mark.parametrize("text,full", [
    ("orq", "orq:bucket=512,ef=false,nonfinite=propagate,warmup=0,clip=0.0,scales=fp32,levels=5"),
    ("bingrad", "bingrad:bucket=512,ef=true,nonfinite=propagate,warmup=0,clip=0.0,scales=fp32,variant=b"),
    ("qsgd:levels=4,ef=true,warmup=1", "qsgd:bucket=512,ef=true,nonfinite=propagate,warmup=1,clip=0.0,scales=fp32,"
                                       "levels=4,norm=max"),
    ("fp16:overflow=raise", "fp16:bucket=512,ef=false,nonfinite=propagate,warmup=0,overflow=raise"),
])
def test_the_configuration_ranks_compare_spells_every_default(text, full):
    """What ranks compare and checkpoints record (compressor.config()): every parameter, as the
    canonical text was spelled before the policy left the scheme, so a checkpoint written then
    still loads, and ranks whose defaults differ (two versions) disagree visibly."""
    c = spec.parse(text)
    assert c.full_spec == full
    assert spec.parse(c.full_spec) == c
