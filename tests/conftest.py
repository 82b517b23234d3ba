"""Suite-wide settings: hypothesis profiles (HYPOTHESIS_PROFILE=deep for a long hunt), the shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from headway.predict._paths import default_data_dir

settings.register_profile("default", max_examples=50, deadline=None)
settings.register_profile("deep", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared real-data folder; tests using it skip when it is absent."""
    try:
        return default_data_dir()  # $HEADWAY_DATA_DIR, else ../shared/data
    except FileNotFoundError as exc:
        pytest.skip(f"{exc} (set HEADWAY_DATA_DIR to run real-data tests)")
