"""``nvfp4.require_spec``: pinning a spec version at run time."""

from __future__ import annotations

import nvfp4
import pytest
from nvfp4.spec import SUPPORTED_SPEC_VERSIONS, SpecVersionError, require_spec


def test_supported_version_is_returned() -> None:
    assert require_spec("1.0") == "1.0"
    assert nvfp4.require_spec("1.0") == "1.0"
    assert nvfp4.SPEC_VERSION in SUPPORTED_SPEC_VERSIONS
    assert "1.0" in nvfp4.SUPPORTED_SPEC_VERSIONS


@pytest.mark.parametrize("version", ["2.0", "1", "1.0.0", "", 1.0, 1, None])
def test_unsupported_version_raises_listing_supported(version: object) -> None:
    with pytest.raises(SpecVersionError) as info:
        require_spec(version)  # type: ignore[arg-type]
    msg = str(info.value)
    assert "supported" in msg
    for v in SUPPORTED_SPEC_VERSIONS:
        assert v in msg
    assert repr(version) in msg


def test_spec_version_error_is_exported() -> None:
    assert nvfp4.SpecVersionError is SpecVersionError
    assert issubclass(SpecVersionError, Exception)
