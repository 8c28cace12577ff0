"""T1 planes: every malformed plane is refused with a clear :class:`nvfp4.PlaneError`.

Hypothesis builds valid planes (with and without experts and fused partitions), then
mutates one thing: a dtype, a rank, a shape, a zero-size axis, the global's shape, a
non-array plane, the partitions, or the content (a bad scale byte, a bad global). Every
mutation must raise ``PlaneError`` naming the tensor, what was expected and what was found,
never an ``IndexError``, ``TypeError`` or a crash.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import nvfp4
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from nvfp4 import NVFP4Planes, PlaneError, validate


def _settings(max_examples: int) -> settings:
    """Deterministic, database-free hypothesis settings (the whole file runs in seconds)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )


NAMES = ["w", "model.layers.0.self_attn.q_proj.weight", "experts.w13"]
BAD_DTYPES = [np.int8, np.uint16, np.float16, np.float64, np.bool_, object]

Spec = dict[str, Any]


class FakeTensor:
    """Looks like a torch tensor (shape, dtype, ``__array__``) but is not a numpy array."""

    def __init__(self, a: npt.NDArray[Any]) -> None:
        self._a = a
        self.shape = a.shape
        self.dtype = a.dtype
        self.ndim = a.ndim

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        return self._a if dtype is None else self._a.astype(dtype)


# ------------------------------------------------------------------------ strategies
def _allowed_global_shapes(e: int | None, parts: tuple[int, ...] | None) -> list[tuple[int, ...]]:
    full = ((e,) if e is not None else ()) + ((len(parts) - 1,) if parts is not None else ())
    return [(), full] if full else [()]


@st.composite
def valid_specs(draw: st.DrawFn) -> Spec:
    """Keyword arguments of a valid :class:`NVFP4Planes`."""
    e = draw(st.one_of(st.none(), st.integers(1, 3)))
    n = draw(st.integers(1, 8))
    k_blocks = draw(st.integers(1, 4))
    parts: tuple[int, ...] | None = None
    if draw(st.booleans()):
        cuts = draw(st.lists(st.integers(1, n - 1), max_size=3, unique=True)) if n > 1 else []
        parts = (0, *sorted(cuts), n)
    gshape = draw(st.sampled_from(_allowed_global_shapes(e, parts)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lead = (e, n) if e is not None else (n,)
    return {
        "codes": rng.integers(0, 256, size=(*lead, k_blocks * 8), dtype=np.uint8),
        "scales": rng.integers(0, 0x7F, size=(*lead, k_blocks), dtype=np.uint8),
        "global_scale": rng.uniform(1e-6, 10.0, size=gshape).astype(np.float32),
        "partitions": parts,
        "name": draw(st.sampled_from(NAMES)),
    }


def _reshape_to_rank(a: npt.NDArray[Any], rank: int) -> npt.NDArray[Any]:
    if rank == 0:
        return np.asarray(a.reshape(-1)[0])
    if rank == 1:
        return a.reshape(-1)
    return a.reshape(1, 1, *a.shape) if a.ndim == 2 else a.reshape(1, *a.shape)


def _with_last_dim(a: npt.NDArray[Any], size: int) -> npt.NDArray[Any]:
    out = np.zeros((*a.shape[:-1], size), dtype=a.dtype)
    m = min(size, a.shape[-1])
    out[..., :m] = a[..., :m]
    return out


def _bad_partitions(n: int) -> list[Any]:
    return [
        (1, n),  # does not start at 0
        (0, n + 1),  # does not end at N
        (0, n - 1) if n > 1 else (0, 2),
        (0, 0, n),  # not increasing
        (0, n, n),
        (0, n, 0, n),
        (0.0, float(n)),  # floats
        (0, n / 2 + 0.25, n),
        np.array([0.0, n]),
        (False, True) if n == 1 else (0, True, n),  # bools
        (0,),  # too short
        (),
        (n,),
        5,  # not iterable
        3.5,
        "0,4",  # a string
        (0, None, n),
        ((0, n),),
    ]


STRUCTURAL_KINDS = [
    "dtype",
    "rank",
    "rows",
    "k_not_multiple",
    "scales_k",
    "zero_axis",
    "global_shape",
    "non_array",
    "partitions",
]


@st.composite
def structural_mutations(draw: st.DrawFn, kind: str) -> tuple[Spec, str]:
    """A valid spec with one structural defect of the given kind, and a label of it."""
    spec = draw(valid_specs())
    codes, scales = spec["codes"], spec["scales"]
    e = codes.shape[0] if codes.ndim == 3 else None
    n, half_k = codes.shape[-2], codes.shape[-1]
    plane = draw(st.sampled_from(["codes", "scales", "global_scale"]))
    if kind == "dtype":
        extra = [np.uint8] if plane == "global_scale" else [np.float32]
        dt = draw(st.sampled_from(BAD_DTYPES + extra))
        spec[plane] = spec[plane].astype(dt)
        kind = f"{plane} dtype {np.dtype(dt)}"
    elif kind == "rank":
        if plane == "global_scale":
            plane = draw(st.sampled_from(["codes", "scales"]))
        rank = draw(st.sampled_from([0, 1, 4]))
        both = draw(st.booleans())  # the same wrong rank for codes and scales
        for p in ("codes", "scales") if both else (plane,):
            spec[p] = _reshape_to_rank(spec[p], rank)
        kind = f"{'both' if both else plane} rank {rank}"
    elif kind == "rows":
        axis = draw(st.sampled_from([0, 1] if e is not None else [0]))
        delta = draw(st.sampled_from([1, -1] if scales.shape[axis] > 1 else [1]))
        shape = list(scales.shape)
        shape[axis] += delta
        spec["scales"] = np.zeros(shape, np.uint8)
        kind = f"scales axis {axis} {delta:+d}"
    elif kind == "k_not_multiple":
        r = draw(st.integers(1, 7))
        new_half = r if draw(st.booleans()) else half_k + r
        spec["codes"] = _with_last_dim(codes, new_half)
        kind = f"codes last dim {new_half}"
    elif kind == "scales_k":
        k_blocks = scales.shape[-1]
        size = draw(st.sampled_from([k_blocks + 1, k_blocks - 1, 2 * k_blocks + 1]))
        spec["scales"] = _with_last_dim(scales, size)
        kind = f"scales last dim {size}"
    elif kind == "zero_axis":
        which = draw(st.sampled_from(["n", "k"] + (["e"] if e is not None else [])))
        for p in ("codes", "scales"):
            a = spec[p]
            if which == "k":
                spec[p] = a[..., :0]
            elif which == "n":
                spec[p] = a[..., :0, :]
            else:
                spec[p] = a[:0]
        kind = f"zero {which}"
    elif kind == "global_shape":
        allowed = _allowed_global_shapes(e, spec["partitions"])
        gshape: tuple[int, ...] = draw(
            st.lists(st.integers(0, 5), max_size=4).map(tuple).filter(lambda s: s not in allowed)
        )
        spec["global_scale"] = np.ones(gshape, np.float32)
        kind = f"global shape {gshape} (allowed {allowed})"
    elif kind == "non_array":
        a = spec[plane]
        choice = draw(st.sampled_from(["list", "none", "fake", "str", "memoryview", "bool"]))
        values: dict[str, Any] = {
            "list": np.atleast_1d(a).tolist(),
            "none": None,
            "fake": FakeTensor(a),
            "str": "abc",
            "memoryview": memoryview(np.ascontiguousarray(a).tobytes()),
            "bool": True,
        }
        spec[plane] = values[choice]
        kind = f"{plane} as {type(spec[plane]).__name__}"
    else:
        spec["partitions"] = draw(st.sampled_from(_bad_partitions(n)))
        kind = f"partitions {spec['partitions']!r} for N = {n}"
    return spec, kind


@st.composite
def content_mutations(draw: st.DrawFn) -> tuple[Spec, str]:
    """A structurally valid spec with one bad scale byte or one bad global."""
    spec = draw(valid_specs())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        scales = spec["scales"].copy()
        byte = draw(st.sampled_from([0x7F, 0x80, 0xFF, 0xB8, *range(0x80, 0x100, 7)]))
        idx = tuple(int(rng.integers(0, d)) for d in scales.shape)
        scales[idx] = byte
        spec["scales"] = scales
        return spec, f"scale byte 0x{byte:02X} at {idx}"
    g = spec["global_scale"].copy()
    bad = draw(st.sampled_from([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, -1e-30]))
    idx = tuple(int(rng.integers(0, d)) for d in g.shape)
    g[idx] = bad
    spec["global_scale"] = g
    return spec, f"global {bad} at {idx}"


def _check_message(err: PlaneError, name: str, kind: str) -> None:
    msg = str(err)
    assert f"{name!r}" in msg or name in msg, (kind, msg)
    assert "expected" in msg, (kind, msg)
    assert "found" in msg, (kind, msg)
    assert err.tensor == name, (kind, err.tensor)


# ----------------------------------------------------------------------------- tests
@_settings(60)
@given(valid_specs())
def test_valid_planes_pass_content_validation(spec: Spec) -> None:
    p = NVFP4Planes(**spec)
    assert validate(p, content=True) is p
    codes = spec["codes"]
    assert p.shape == (*codes.shape[:-1], codes.shape[-1] * 2)
    assert p.k % 16 == 0
    assert p.n == codes.shape[-2]
    assert p.row_global().shape == codes.shape[:-1]


@pytest.mark.parametrize("defect", STRUCTURAL_KINDS)
@_settings(16)
@given(data=st.data())
def test_structural_defects_raise_plane_error(defect: str, data: st.DataObject) -> None:
    spec, kind = data.draw(structural_mutations(defect), label="mutation")
    event(" ".join(kind.split()[:2]))
    with pytest.raises(PlaneError) as info:
        NVFP4Planes(**spec)
    _check_message(info.value, spec["name"], kind)
    assert isinstance(info.value, ValueError)


@_settings(40)
@given(data=st.data())
def test_validate_rechecks_structure_after_construction(data: st.DataObject) -> None:
    """Arrays can be reshaped or re-viewed in place after construction: validate() sees it."""
    defect = data.draw(st.sampled_from(STRUCTURAL_KINDS), label="defect")
    spec, kind = data.draw(structural_mutations(defect), label="mutation")
    good = dict(spec)
    # rebuild a valid base with the same name, then swap the defective fields in
    base = NVFP4Planes(
        codes=np.zeros((2, 8), np.uint8),
        scales=np.zeros((2, 1), np.uint8),
        global_scale=np.asarray(1.0, np.float32),
        name=good["name"],
    )
    fields = ("codes", "scales", "global_scale", "partitions")
    swapped = {f: good[f] for f in fields}
    if not isinstance(swapped["partitions"], tuple | type(None)):
        swapped["partitions"] = None  # __post_init__ converts; a raw non-tuple cannot be stored
    # the defect must still be present in the swapped fields, else use the original planes
    try:
        NVFP4Planes(**swapped, name=good["name"])
    except PlaneError:
        pass
    else:
        return
    for f, v in swapped.items():
        object.__setattr__(base, f, v)
    with pytest.raises(PlaneError) as info:
        validate(base)
    _check_message(info.value, spec["name"], kind)


@_settings(80)
@given(content_mutations())
def test_content_defects_raise_plane_error_only_with_content(mutation: tuple[Spec, str]) -> None:
    spec, kind = mutation
    p = NVFP4Planes(**spec)  # structurally fine
    assert validate(p) is p
    with pytest.raises(PlaneError) as info:
        validate(p, content=True)
    _check_message(info.value, spec["name"], kind)
    assert kind.split(" at ")[-1] in str(info.value)  # the index of the bad value


FIXED_SPECS: list[Spec] = [
    {
        "codes": np.zeros((4, 16), np.uint8),
        "scales": np.zeros((4, 2), np.uint8),
        "global_scale": np.float32(0.5),
        "partitions": None,
        "name": "w",
    },
    {
        "codes": np.zeros((2, 6, 8), np.uint8),
        "scales": np.zeros((2, 6, 1), np.uint8),
        "global_scale": np.ones((2, 2), np.float32),
        "partitions": (0, 2, 6),
        "name": "experts.w13",
    },
    {
        "codes": np.zeros((1, 8), np.uint8),
        "scales": np.zeros((1, 1), np.uint8),
        "global_scale": np.ones(1, np.float32),
        "partitions": (0, 1),
        "name": "one_row",
    },
]


@pytest.mark.parametrize("index", range(len(FIXED_SPECS)))
def test_every_bad_dtype_of_every_plane(index: int) -> None:
    base = FIXED_SPECS[index]
    NVFP4Planes(**base)  # the base is valid
    for plane in ("codes", "scales", "global_scale"):
        for dt in [*BAD_DTYPES, np.float32 if plane != "global_scale" else np.uint8]:
            spec = dict(base, **{plane: np.asarray(base[plane]).astype(dt)})
            with pytest.raises(PlaneError) as info:
                NVFP4Planes(**spec)
            _check_message(info.value, base["name"], f"{plane} {dt}")
            assert "dtype" in str(info.value)


@pytest.mark.parametrize("index", range(len(FIXED_SPECS)))
def test_every_bad_partitions(index: int) -> None:
    base = FIXED_SPECS[index]
    n = base["codes"].shape[-2]
    for parts in _bad_partitions(n):
        # keep the global scalar so that only the partitions are wrong
        spec = dict(base, partitions=parts, global_scale=np.float32(1.0))
        with pytest.raises(PlaneError) as info:
            NVFP4Planes(**spec)
        _check_message(info.value, base["name"], repr(parts))
        assert "partitions" in str(info.value)


@pytest.mark.parametrize("index", range(len(FIXED_SPECS)))
def test_every_non_array_plane(index: int) -> None:
    base = FIXED_SPECS[index]
    for plane in ("codes", "scales", "global_scale"):
        a = np.asarray(base[plane])
        for value in (
            np.atleast_1d(a).tolist(),
            None,
            FakeTensor(a),
            "abc",
            memoryview(np.ascontiguousarray(a).tobytes()),
            True,
            b"\x00" * 8,
        ):
            with pytest.raises(PlaneError) as info:
                NVFP4Planes(**dict(base, **{plane: value}))
            _check_message(info.value, base["name"], f"{plane} {type(value).__name__}")
            assert f"{plane} type" in str(info.value)


def test_in_place_reshape_is_caught_by_validate() -> None:
    p = NVFP4Planes(
        np.zeros((4, 16), np.uint8), np.zeros((4, 2), np.uint8), np.asarray(1.0, np.float32)
    )
    p.scales.shape = (2, 4)
    with pytest.raises(PlaneError, match="scales leading shape"):
        validate(p)


# ----------------------------------------------------------------- exact messages
def _planes(**kw: Any) -> NVFP4Planes:
    args: dict[str, Any] = {
        "codes": np.zeros((4, 16), np.uint8),
        "scales": np.zeros((4, 2), np.uint8),
        "global_scale": np.float32(0.5),
        "name": "w",
    }
    args.update(kw)
    return NVFP4Planes(**args)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"codes": np.zeros((4, 16), np.int8)},
            "tensor 'w': codes dtype: expected uint8, found int8",
        ),
        (
            {"scales": np.zeros((4, 2), np.float32)},
            "tensor 'w': scales dtype: expected uint8 (E4M3 bytes), found float32",
        ),
        (
            {"global_scale": np.asarray(0.5, dtype=np.float64)},
            "tensor 'w': global_scale dtype: expected float32, found float64",
        ),
        (
            {"codes": [[0] * 16] * 4},
            "tensor 'w': codes type: expected numpy.ndarray, found list",
        ),
        (
            {"codes": np.zeros((16,), np.uint8), "scales": np.zeros((2,), np.uint8)},
            "tensor 'w': codes rank: expected 2 ([N, K/2]) or 3 ([E, N, K/2]), found 1",
        ),
        (
            {"scales": np.zeros((5, 2), np.uint8)},
            "tensor 'w': scales leading shape: expected (4,) (codes' leading axes), found (5,)",
        ),
        (
            {"codes": np.zeros((4, 12), np.uint8)},
            "tensor 'w': K (= 2 * codes.shape[-1]): expected a positive multiple of 16, found 24",
        ),
        (
            {"scales": np.zeros((4, 3), np.uint8)},
            "tensor 'w': scales.shape[-1]: expected K/16 = 2 for K = 32, found 3",
        ),
        (
            {"codes": np.zeros((0, 16), np.uint8), "scales": np.zeros((0, 2), np.uint8)},
            "tensor 'w': rows / experts: expected at least 1 each, found (0,)",
        ),
        (
            {
                "codes": np.zeros((2, 4, 16), np.uint8),
                "scales": np.zeros((2, 4, 2), np.uint8),
                "global_scale": np.ones(3, np.float32),
            },
            "tensor 'w': global_scale shape: expected () or (2,), found (3,)",
        ),
        (
            {"partitions": (0, 2, 5), "global_scale": np.ones(2, np.float32)},
            "tensor 'w': partitions: expected (0, ..., 4) with at least 2 entries, found (0, 2, 5)",
        ),
        (
            {"partitions": (0, 2, 2, 4), "global_scale": np.ones(3, np.float32)},
            "tensor 'w': partitions: expected strictly increasing row boundaries, "
            "found (0, 2, 2, 4)",
        ),
        (
            {"partitions": (0, 2.0, 4), "global_scale": np.ones(2, np.float32)},
            "tensor 'w': partitions: expected integer row boundaries, found (0, 2.0, 4)",
        ),
        (
            {"partitions": 4},
            "tensor 'w': partitions: expected a tuple of row boundaries, found int",
        ),
    ],
)
def test_structural_error_messages(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(PlaneError) as info:
        _planes(**changes)
    assert str(info.value) == message


def test_content_error_messages() -> None:
    scales = np.full((4, 2), 0x38, np.uint8)
    scales[1, 0] = 0x80
    scales[3, 1] = 0x7F
    with pytest.raises(PlaneError) as info:
        validate(_planes(scales=scales), content=True)
    assert str(info.value) == (
        "tensor 'w': scale byte at (1, 0): "
        "expected 0x00..0x7E (bit 7 clear, not the NaN byte 0x7F), found 0x80"
    )
    assert info.value.tensor == "w"
    assert info.value.found == "0x80"
    scales[1, 0] = 0x38
    with pytest.raises(PlaneError, match=r"scale byte at \(3, 1\).*found 0x7F"):
        validate(_planes(scales=scales), content=True)

    g = np.array([0.5, np.nan, 1.0], np.float32)
    with pytest.raises(PlaneError) as info:
        validate(_planes(global_scale=g, partitions=(0, 1, 2, 4)), content=True)
    assert str(info.value) == "tensor 'w': global_scale at (1,): expected finite and > 0, found nan"
    with pytest.raises(PlaneError) as info:
        validate(_planes(global_scale=np.float32(-2.0)), content=True)
    assert str(info.value) == "tensor 'w': global_scale at (): expected finite and > 0, found -2.0"


def test_validate_refuses_non_planes() -> None:
    with pytest.raises(PlaneError) as info:
        validate({"codes": 1})  # type: ignore[arg-type]
    assert str(info.value) == (
        "tensor '<unnamed>': planes type: expected nvfp4.NVFP4Planes, found dict"
    )


def test_plane_error_is_exported_and_carries_fields() -> None:
    assert nvfp4.PlaneError is PlaneError
    assert issubclass(PlaneError, ValueError)
    err = PlaneError("t", "what", "exp", "fnd")
    assert (err.tensor, err.what, err.expected, err.found) == ("t", "what", "exp", "fnd")
    assert str(err) == "tensor 't': what: expected exp, found fnd"


def test_python_float_global_is_accepted() -> None:
    p = _planes(global_scale=0.25)
    assert isinstance(p.global_scale, np.ndarray)
    assert p.global_scale.dtype == np.float32
    assert p.global_scale.shape == ()
    assert float(p.global_scale) == 0.25
    assert validate(p, content=True) is p
