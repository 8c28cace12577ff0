"""The backend registry and the reference backend's side of the contract.

Fake plugins are registered the way a real backend is: a ``*.dist-info`` directory with
``METADATA`` and an ``entry_points.txt`` naming the group ``nvfp4.backends``, next to the
plugin's module, on ``sys.path``. :func:`importlib.metadata.entry_points` (which the
registry calls) finds them exactly as it finds an installed wheel.
"""

from __future__ import annotations

import re
import textwrap
import warnings
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import nvfp4
import pytest
from nvfp4 import reference
from nvfp4.backend import CAPABILITIES, Availability, Frontend
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.reference_backend import ReferenceKernels
from nvfp4.registry import (
    ENTRY_POINT_GROUP,
    KNOWN_PACKAGES,
    BackendUnavailable,
    discover,
    get_backend,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
FAKE = "fake"


# ------------------------------------------------------------------------------ set-up
@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No backend choice or version override leaks in from the caller's environment."""
    monkeypatch.delenv("NVFP4_BACKEND", raising=False)
    monkeypatch.delenv("NVFP4_SKIP_VERSION_CHECK", raising=False)


_PLUGIN_TEMPLATE = '''
"""A fake NVFP4 backend: the reference verbs under another name."""
from nvfp4.contract import Availability, BackendInfo
from nvfp4.reference_backend import ReferenceKernels


class FakeBackend(ReferenceKernels):
    def __init__(self) -> None:
        super().__init__()
        self.info = BackendInfo(
            name={name!r},
            spec_versions={spec_versions!r},
            priority={priority!r},
            capabilities=frozenset({{"qmm", "dequantize"}}),
            version="0.0.1",
            package="nvfp4-fake",
        )

    def availability(self) -> Availability:
{availability}


def backend() -> FakeBackend:
{factory}
'''


def install_plugin(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    ep_name: str = FAKE,
    spec_versions: tuple[str, ...] = ("1.0",),
    priority: int = 10**6,
    availability: str = "return Availability(True, device='fake device')",
    factory: str = "return FakeBackend()",
    module_prelude: str = "",
) -> str:
    """Write a module and a dist-info directory declaring it under ``nvfp4.backends``;
    put them on ``sys.path``. Returns the module name (unique per test)."""
    module = "nvfp4_fake_" + re.sub(r"\W", "_", tmp_path.name)
    source = module_prelude + _PLUGIN_TEMPLATE.format(
        name=ep_name,
        spec_versions=spec_versions,
        priority=priority,
        availability=textwrap.indent(availability, " " * 8),
        factory=textwrap.indent(factory, " " * 4),
    )
    (tmp_path / f"{module}.py").write_text(source)
    dist = tmp_path / f"{module}-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{ep_name} = {module}:backend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def auto() -> tuple[Any, list[str]]:
    """Automatic choice, with the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b = get_backend()
    return b, [str(w.message) for w in caught]


def assert_fell_back(b: Any) -> None:
    """Automatic choice skipped the fake plugin; with nothing else installed it is the
    reference backend."""
    assert isinstance(b, Frontend)
    assert b.info.name != FAKE
    assert b.availability().ok
    if set(discover()) <= {"reference", FAKE}:
        assert b.info.name == "reference"
        assert isinstance(b.kernels, ReferenceKernels)


# --------------------------------------------------------------------- plain lookups
def test_reference_is_always_discovered() -> None:
    entries = discover()
    assert "reference" in entries
    b = entries["reference"].load()
    assert isinstance(b.kernels, ReferenceKernels)
    assert entries["reference"].availability().ok


def test_no_installed_backend_claims_an_unreleased_spec_version() -> None:
    """A backend names the spec versions it is certified for (literals, never
    ``SUPPORTED_SPEC_VERSIONS``: ``tests/test_backend_spec_pins.py``); each of them must be a
    version this nvfp4-core has released. Every installed backend is loaded, available or not
    (a plugin that cannot load here claims nothing and is left out)."""
    claims = {}
    for name, entry in discover().items():
        b = entry.load()
        if b is not None:
            claims[name] = tuple(b.info.spec_versions)
    assert "reference" in claims
    released = set(nvfp4.SUPPORTED_SPEC_VERSIONS)
    for name, versions in claims.items():
        assert versions, f"backend {name!r} names no spec version"
        assert all(isinstance(v, str) for v in versions), f"{name!r}: {versions!r}"
        unreleased = sorted(set(versions) - released)
        assert not unreleased, (
            f"backend {name!r} claims spec {', '.join(unreleased)}, which this nvfp4-core has "
            f"not released (released: {', '.join(nvfp4.SUPPORTED_SPEC_VERSIONS)})"
        )


def test_get_backend_default_is_an_available_backend() -> None:
    b, _ = auto()
    assert isinstance(b, Frontend)
    assert b.availability().ok
    assert set(b.info.spec_versions) & set(nvfp4.SUPPORTED_SPEC_VERSIONS)
    if set(discover()) == {"reference"}:
        assert b.info.name == "reference"
        assert isinstance(b.kernels, ReferenceKernels)


def test_get_backend_reference_by_name() -> None:
    b = get_backend("reference")
    assert isinstance(b, nvfp4.Frontend)
    assert isinstance(b.kernels, ReferenceKernels)
    assert b.info.name == "reference"
    assert nvfp4.get_backend is get_backend


def test_env_var_selects_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4_BACKEND", "reference")
    assert get_backend().info.name == "reference"
    monkeypatch.setenv("NVFP4_BACKEND", "no-such-backend")
    with pytest.raises(BackendUnavailable, match="no-such-backend"):
        get_backend()


def test_env_var_selects_a_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_plugin(tmp_path, monkeypatch, priority=-5)
    monkeypatch.setenv("NVFP4_BACKEND", FAKE)
    assert get_backend().info.name == FAKE
    # an explicit argument wins over the environment
    assert get_backend("reference").info.name == "reference"


@pytest.mark.parametrize("name", sorted(set(KNOWN_PACKAGES) - {"reference"}))
def test_known_but_missing_backend_names_the_package(name: str) -> None:
    if name in discover():  # installed in this environment: it is not "missing"
        try:
            chosen = get_backend(name).info.name
        except BackendUnavailable as exc:  # installed but unable to run here
            chosen = str(exc)
            assert "not installed" not in chosen, chosen
        else:
            assert chosen == name
        return
    with pytest.raises(BackendUnavailable) as err:
        get_backend(name)
    msg = str(err.value)
    assert "not installed" in msg
    assert f"pip install {KNOWN_PACKAGES[name]}" in msg
    assert "reference" in msg  # the installed backends are listed
    assert err.value.name == name


def test_unknown_backend_has_no_pip_hint() -> None:
    with pytest.raises(BackendUnavailable) as err:
        get_backend("tpu-v9")
    msg = str(err.value)
    assert "'tpu-v9'" in msg
    assert "not installed" in msg
    assert "pip install" not in msg
    assert isinstance(err.value, RuntimeError)


def test_availability_false_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="reason"):
        Availability(ok=False)
    assert Availability(ok=False, reason="no GPU").reason == "no GPU"
    assert Availability(ok=True).ok


# -------------------------------------------------------------------- fake plugins
def test_plugin_is_discovered_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = install_plugin(tmp_path, monkeypatch)
    entries = discover()
    assert FAKE in entries
    assert "reference" in entries
    assert entries[FAKE].source == f"{module}:backend"
    assert entries[FAKE].availability().ok


def test_a_available_plugin_with_higher_priority_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(tmp_path, monkeypatch, priority=10**6)
    b, caught = auto()
    assert isinstance(b, Frontend)
    assert b.info.name == FAKE
    assert not [m for m in caught if FAKE in m]
    assert get_backend(FAKE).info.name == FAKE


def refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **plugin: Any) -> BackendUnavailable:
    """Install the fake plugin with ``plugin``'s overrides (:func:`install_plugin`);
    ``get_backend`` must refuse it: the error it raised."""
    install_plugin(tmp_path, monkeypatch, **plugin)
    with pytest.raises(BackendUnavailable) as err:
        get_backend(FAKE)
    return err.value


def test_a_available_plugin_with_lower_priority_is_not_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(tmp_path, monkeypatch, priority=-1)
    b, _ = auto()
    assert_fell_back(b)
    assert get_backend(FAKE).info.name == FAKE


def test_a_plugin_below_the_reference_is_never_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The automatic choice asks availability() in priority order and stops at the first
    available backend: a plugin ranked below the always-available reference (as the engine
    adapters are, whose probes import whole frameworks) is loaded but never probed."""
    probed = tmp_path / "probed"
    install_plugin(
        tmp_path,
        monkeypatch,
        priority=-100,
        availability=f"open({str(probed)!r}, 'w').close()\nreturn Availability(True)",
    )
    b, caught = auto()
    assert_fell_back(b)
    assert not [m for m in caught if FAKE in m]
    assert not probed.exists(), "the automatic choice probed a backend ranked below the reference"
    assert get_backend(FAKE).info.name == FAKE  # asked by name, it is probed
    assert probed.exists()


def test_b_unavailable_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    err = refusal(
        tmp_path,
        monkeypatch,
        availability="return Availability(False, 'no fake accelerator here; set FAKE_DEV=1')",
    )
    assert "no fake accelerator here; set FAKE_DEV=1" in str(err)
    assert err.reason == "no fake accelerator here; set FAKE_DEV=1"
    b, _ = auto()
    assert_fell_back(b)


def test_c_factory_raising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    msg = str(refusal(tmp_path, monkeypatch, factory="raise RuntimeError('fake driver exploded')"))
    assert "fake driver exploded" in msg
    assert "RuntimeError" in msg
    b, caught = auto()
    assert_fell_back(b)
    skipped = [m for m in caught if FAKE in m]
    assert skipped, f"no warning about the broken plugin among {caught}"
    assert "fake driver exploded" in skipped[0]


def test_c_import_error_in_plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    msg = str(
        refusal(
            tmp_path, monkeypatch, module_prelude="import nvfp4_no_such_dependency_xyz  # noqa\n"
        )
    )
    assert "nvfp4_no_such_dependency_xyz" in msg
    assert "ModuleNotFoundError" in msg
    b, caught = auto()
    assert_fell_back(b)
    assert any(FAKE in m and "nvfp4_no_such_dependency_xyz" in m for m in caught)


def test_d_spec_version_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    msg = str(refusal(tmp_path, monkeypatch, spec_versions=("9.9",)))
    assert "9.9" in msg
    assert nvfp4.SPEC_VERSION in msg
    assert "NVFP4_SKIP_VERSION_CHECK" in msg
    b, _ = auto()  # priority is the highest, but the version does not match
    assert_fell_back(b)

    monkeypatch.setenv("NVFP4_SKIP_VERSION_CHECK", "1")
    b = get_backend(FAKE)
    assert b.info.name == FAKE
    assert b.info.spec_versions == ("9.9",)


def test_e_availability_raising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_plugin(tmp_path, monkeypatch, availability="raise OSError('probe of /dev/fake failed')")
    entry = discover()[FAKE]
    a = entry.availability()  # never raises
    assert not a.ok
    assert "probe of /dev/fake failed" in a.reason
    assert "OSError" in a.reason
    with pytest.raises(BackendUnavailable) as err:
        get_backend(FAKE)
    assert "probe of /dev/fake failed" in str(err.value)
    b, _ = auto()
    assert_fell_back(b)


def test_availability_returning_the_wrong_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(tmp_path, monkeypatch, availability="return True")
    with pytest.raises(BackendUnavailable, match="not Availability"):
        get_backend(FAKE)
    b, _ = auto()
    assert_fell_back(b)


# ---------------------------------------------------- the reference backend's verbs
def _weights(rng: np.random.Generator, *lead: int, k: int = 64) -> NVFP4Planes:
    return nvfp4.quantize(rng.standard_normal((*lead, k)).astype(np.float32), name="w")


def _bits(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Raw bytes of an array, so NaN and -0.0 compare exactly."""
    return np.ascontiguousarray(a).view(np.uint8)


def assert_same(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_array_equal(_bits(a), _bits(b))


def test_reference_backend_info() -> None:
    b = get_backend("reference")
    assert isinstance(b, Frontend)
    assert b.info.name == "reference"
    assert nvfp4.SPEC_VERSION in b.info.spec_versions
    assert b.info.capabilities <= set(CAPABILITIES)
    assert {"qmm", "gather_qmm", "dequantize"} <= b.info.capabilities
    assert b.info.package == "nvfp4-core"
    assert b.info.version == nvfp4.__version__
    a = b.availability()
    assert a.ok
    assert a.reason == ""


def test_reference_backend_prepare_validates_content() -> None:
    b = get_backend("reference")
    w = _weights(np.random.default_rng(0), 4)
    pw = b.prepare(w)
    assert isinstance(pw, nvfp4.Prepared)
    assert (pw.name, pw.shape, pw.partitions) == (w.name, w.shape, w.partitions)
    assert b.to_planes(pw) is w
    bad = w.scales.copy()
    bad[1, 2] = 0x80
    with pytest.raises(PlaneError, match="scale byte"):
        b.prepare(w.replace(scales=bad))
    with pytest.raises(PlaneError, match="global_scale"):
        b.prepare(w.replace(global_scale=np.float32(np.inf)))


@pytest.mark.parametrize("x_dtype", [np.float32, np.float16, BF16])
def test_reference_backend_qmm_out_dtype_defaults_to_x(x_dtype: Any) -> None:
    rng = np.random.default_rng(1)
    b = get_backend("reference")
    p = _weights(rng, 6)
    w = b.prepare(p)
    x = rng.standard_normal((3, 64)).astype(x_dtype)
    y = b.qmm(x, w)
    assert y.dtype == np.dtype(x_dtype)
    assert_same(y, reference.qmm(x, p, out_dtype=x_dtype))
    y32 = b.qmm(x, w, out_dtype="float32")
    assert_same(y32, reference.qmm(x, p, out_dtype=np.float32))


def test_reference_backend_gather_qmm() -> None:
    rng = np.random.default_rng(2)
    b = get_backend("reference")
    p = _weights(rng, 3, 5)
    w = b.prepare(p)
    assert p.global_scale.shape == (3,)
    assert w.num_experts == 3
    x = rng.standard_normal((6, 64)).astype(np.float16)
    ids = np.array([2, -1, 0, 3, 1, 2], dtype=np.int64)
    y = b.gather_qmm(x, w, ids)
    assert y.dtype == np.float16
    assert y.shape == (6, 5)
    assert_same(y, reference.gather_qmm(x, p, ids, out_dtype=np.float16))
    assert not np.any(y[[1, 3]])  # out-of-range expert ids: exact zero rows
    assert np.all(np.abs(y[[0, 2, 4, 5]]).max(axis=1) > 0)
    y_sorted = b.gather_qmm(x[[1, 2, 4]], w, np.array([-1, 0, 1]), sorted_indices=True)
    assert_same(y_sorted, y[[1, 2, 4]])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_reference_backend_dequantize(dtype: str) -> None:
    b = get_backend("reference")
    p = _weights(np.random.default_rng(3), 4)
    w = b.prepare(p)
    assert_same(b.dequantize(w, dtype), reference.dequantize(p, dtype))
    # the default is float32
    assert_same(b.dequantize(w), reference.dequantize(p, np.float32))


def test_reference_backend_activations_and_w4a4() -> None:
    rng = np.random.default_rng(4)
    b = get_backend("reference")
    p = _weights(rng, 8)
    w = b.prepare(p)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[1, 7] = np.nan
    for input_scale in (None, np.float32(0.002)):
        got = b.quantize_activations(x, input_scale)
        want = reference.quantize_activations(x, input_scale)
        assert isinstance(got, NVFP4Planes)
        for plane in ("codes", "scales", "global_scale"):
            assert_same(getattr(got, plane), getattr(want, plane))
        y = b.qmm_w4a4(x.astype(BF16), w, input_scale=input_scale)
        assert y.dtype == BF16
        ref = reference.qmm_w4a4(x.astype(BF16), p, input_scale=input_scale, out_dtype=BF16)
        assert_same(y, ref)
        assert np.isnan(y[1].astype(np.float32)).all()
        assert np.isfinite(y[[0, 2]].astype(np.float32)).all()


def test_reference_backend_numpy_round_trip() -> None:
    b = get_backend("reference")
    for a in (
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([1.5, -0.0], dtype=BF16),
        np.array([[7]], dtype=np.uint8),
    ):
        native = b.from_numpy(a)
        back = b.to_numpy(native)
        assert_same(back, a)
