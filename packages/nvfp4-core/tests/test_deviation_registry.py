"""``nvfp4.deviation_registry`` reads ``spec/1.2/deviations.toml`` and ``spec/1.5/``'s: the
committed registries parse and say what the spec requires of them (1.5's is 1.2's and one
more), each spec version uses its own, and a malformed file is refused with one line
naming the file, the entry, the key, the expected and the found."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from nvfp4 import deviation_registry as reg

REPO = Path(__file__).resolve().parents[3]

GOOD = """\
spec_version = "1.2"

[[deviation]]
id = "scale_times_global_first"
rule = "spec 1.0, Decoding"
differs = "scale x global first"
scope = "real"
severity = "benign"
bound = "ulps"
bound_value = 1.0
bound_text = "1 ulp"
why = "one more rounding"
tiers = ["T3"]
seen_in = ["modelopt"]
evidence = ["reports/engines/modelopt.json: 16 failed"]
emulated = true
"""


@pytest.mark.parametrize(("version", "count"), [("1.2", 21), ("1.5", 22)])
def test_the_committed_registry_parses_and_is_complete(version: str, count: int) -> None:
    devs = reg.deviations(version)
    assert len(devs) == count
    ids = [d.id for d in devs]
    assert len(set(ids)) == len(ids)
    for d in devs:
        assert d.scope in reg.SCOPES, d.id
        assert d.severity in reg.SEVERITIES, d.id
        assert (d.bound_value is not None) == reg.BOUNDS[d.bound], d.id
        assert d.tiers, d.id
        assert d.seen_in, d.id
        assert d.evidence, d.id
        for ev in d.evidence:  # evidence names a committed certificate
            path = ev.split(":", 1)[0]
            if (REPO / "reports").is_dir():
                assert (REPO / path).is_file(), (d.id, path)
    # decisions the spec text names: harmless 1 ulp; unsafe out-of-bounds ids and NaN zeros
    assert reg.deviation("scale_times_global_first").severity == "benign"
    assert reg.deviation("scale_times_global_first").bound_value == 1.0
    assert not reg.deviation("out_of_range_expert_id").admissible
    assert not reg.deviation("zero_amax_global").admissible
    assert reg.deviation("k_multiple_of_64").bound == "refuses"


def test_1_5_keeps_1_2_s_entries_and_adds_one() -> None:
    old, new = reg.deviations("1.2"), reg.deviations("1.5")
    assert new[: len(old)] == old
    assert [d.id for d in new[len(old) :]] == ["partials_in_activation_dtype"]


@pytest.mark.parametrize(
    ("spec", "registry"),
    [
        ("1.0", "1.2"),
        ("1.1", "1.2"),
        ("1.2", "1.2"),
        ("1.3", "1.2"),
        ("1.4", "1.2"),
        ("1.5", "1.5"),
        ("1.10", "1.5"),
        (None, "1.5"),
    ],
)
def test_each_spec_version_uses_the_newest_registry_released_by_then(
    spec: str | None, registry: str
) -> None:
    assert reg.registry_version(spec) == registry


def test_a_malformed_spec_version_is_refused() -> None:
    with pytest.raises(ValueError, match=r"expected a spec version X\.Y, found 'one'"):
        reg.registry_version("one")


def test_the_registry_is_read_from_the_checkout_or_the_package() -> None:
    assert reg.REGISTRY_SPEC_VERSION == "1.5"
    for version in reg.REGISTRY_VERSIONS:
        source = reg.data_file(version)
        assert source.name == "deviations.toml"
        if (REPO / "spec" / version).is_dir():  # a checkout: the released folder's file
            assert Path(str(source)) == REPO / "spec" / version / "deviations.toml"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'tiers = ["T3"]',
            'tiers = ["T7"]',
            "key 'tiers': expected tiers among T0, T1, T2, T3, T4, T5, T6, found 'T7'",
        ),
        ('bound = "ulps"', 'bound = "partials_relative"', "key 'bound': expected one of ulps"),
    ],
)
def test_a_1_2_file_may_not_use_what_1_5_added(old: str, new: str, message: str) -> None:
    text = GOOD.replace(old, new, 1)
    with pytest.raises(reg.DeviationRegistryError, match=re.escape(message)):
        reg.parse(text, "x.toml", "1.2")
    (d,) = reg.parse(text.replace('spec_version = "1.2"', 'spec_version = "1.5"'), "x.toml", "1.5")
    assert new.split(" = ")[1].strip('["]') in (d.bound, *d.tiers)


def test_unknown_id_is_a_key_error_naming_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"no deviation 'nope'; expected one of .*ct_encode_global"):
        reg.deviation("nope")


def test_a_good_file_parses() -> None:
    (d,) = reg.parse(GOOD, "x.toml", "1.2")
    assert d.id == "scale_times_global_first"
    assert d.bound_value == 1.0
    assert d.emulated
    assert d.impact is None
    assert d.admissible


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'spec_version = "1.2"',
            'spec_version = "1.1"',
            "key 'spec_version': expected '1.2', found '1.1'",
        ),
        (
            'id = "scale_times_global_first"',
            'id = "Bad Id"',
            "deviation 0: key 'id': expected a string matching",
        ),
        (
            'scope = "real"',
            'scope = "sometimes"',
            "deviation 'scale_times_global_first': key 'scope': expected one of real, malformed, found 'sometimes'",
        ),
        (
            'severity = "benign"',
            "severity = 3",
            "key 'severity': expected one of benign, lossy, unsafe, found 3",
        ),
        ('bound = "ulps"', 'bound = "vibes"', "key 'bound': expected one of ulps"),
        (
            "bound_value = 1.0",
            "bound_value = nan",
            "key 'bound_value': expected a finite number >= 0 for bound 'ulps', found nan",
        ),
        ("bound_value = 1.0", "bound_value = -1.0", "found -1"),
        ("bound_value = 1.0", "bound_value = true", "found True"),
        (
            'bound = "ulps"',
            'bound = "refuses"',
            "key 'bound_value': expected none for bound 'refuses', found 1.0",
        ),
        (
            'tiers = ["T3"]',
            'tiers = ["T9"]',
            "key 'tiers': expected tiers among T0, T1, T2, T3, T4, T5, T6, found 'T9'",
        ),
        (
            'tiers = ["T3"]',
            "tiers = []",
            "key 'tiers': expected a non-empty list of distinct strings, found []",
        ),
        (
            'seen_in = ["modelopt"]',
            'seen_in = ["../etc"]',
            "key 'seen_in': expected a non-empty list of distinct strings matching",
        ),
        ('seen_in = ["modelopt"]', 'seen_in = ["a", "a"]', "key 'seen_in'"),
        (
            "emulated = true",
            'emulated = "yes"',
            "key 'emulated': expected true or false, found 'yes'",
        ),
        ('why = "one more rounding"', 'why = ""', "key 'why': expected a non-empty string"),
        ('why = "one more rounding"', 'whyy = "x"', "unknown key 'whyy'"),
        (
            "emulated = true",
            "emulated = true\nimpact = {t6_tokens = -1}",
            "key 'impact.t6_tokens': expected a finite number >= 0, found -1",
        ),
        (
            "emulated = true",
            'emulated = true\nimpact = {t6_kl = "low"}',
            "key 'impact.t6_kl': expected a finite number, found 'low'",
        ),
        (
            'bound = "ulps"\nbound_value = 1.0',
            'bound = "unbounded"',
            "'unbounded' needs scope 'malformed' or severity",
        ),
        ("[[deviation]]", "junk = 1\n[[deviation]]", "unknown key 'junk'"),
    ],
)
def test_a_malformed_file_is_one_line_naming_what_and_where(
    old: str, new: str, message: str
) -> None:
    assert old in GOOD
    with pytest.raises(reg.DeviationRegistryError, match=re.escape(message)) as info:
        reg.parse(GOOD.replace(old, new, 1), "x.toml", "1.2")
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("x.toml: ")


def test_duplicate_ids_no_entries_and_bad_toml_are_refused() -> None:
    body = GOOD.split("\n", 2)[2]
    with pytest.raises(reg.DeviationRegistryError, match="id declared twice"):
        reg.parse(GOOD + "\n" + body, "x.toml", "1.2")
    with pytest.raises(reg.DeviationRegistryError, match="expected 1 to 1000"):
        reg.parse('spec_version = "1.2"\n', "x.toml", "1.2")
    with pytest.raises(reg.DeviationRegistryError, match=r"x\.toml: not TOML"):
        reg.parse("[[deviation", "x.toml", "1.2")
    with pytest.raises(reg.DeviationRegistryError, match="expected at most 1048576 bytes"):
        reg.parse("#" * (1 << 20 + 1), "x.toml", "1.2")
