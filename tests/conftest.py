"""Suite-wide settings: hypothesis profiles (HYPOTHESIS_PROFILE=deep for a long hunt), the shared data.

Real-data tests skip when the shared data folder is missing, except where the data is required:
under CI (``CI=true``) or when ``HEADWAY_DATA_DIR`` names the folder (``.ci/run`` sets both). There a
missing folder fails the test, so that a CI run cannot pass by skipping every real-data test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Generator
from pathlib import Path

import pytest
from hypothesis import settings

from headway._proc import SigtermRaises
from headway.predict._paths import default_data_dir

settings.register_profile("default", max_examples=50, deadline=None)
settings.register_profile("deep", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The phrase every missing-data skip reason contains (this fixture's, tests/predict/conftest.py's and
# the tests' own "shared data not present").
MISSING_DATA = "shared data"


def data_required() -> bool:
    """True where a missing shared data folder must fail the tests instead of skipping them."""
    return os.environ.get("CI", "").lower() in {"1", "true"} or bool(os.environ.get("HEADWAY_DATA_DIR"))


_SIGTERM = SigtermRaises()


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM ends the run as Ctrl-C does: pytest then tears the fixtures down, so the vLLM servers,
    redis-servers and gateways the session started are stopped (by default SIGTERM would end pytest at
    once and leave them running). A run started in the background by a shell without job control
    inherits SIGINT ignored, and so would every process it starts (an ignored signal stays ignored
    across exec): the interrupt tests' Ctrl-C would reach nobody. It is handled as Python handles it
    by default instead, which each child, its handler reset by exec, starts with."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _SIGTERM.__enter__()


def pytest_unconfigure(config: pytest.Config) -> None:
    _SIGTERM.__exit__()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared real-data folder; tests using it skip when it is absent (fail where it is required)."""
    try:
        return default_data_dir()  # $HEADWAY_DATA_DIR, else ../shared/data
    except FileNotFoundError as exc:
        pytest.skip(f"{MISSING_DATA} folder missing: {exc} (set HEADWAY_DATA_DIR to run real-data tests)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """Where the data is required, a skip for missing shared data is reported as a failure."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and data_required()) or getattr(report, "wasxfail", None) is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if MISSING_DATA in reason:
        report.outcome = "failed"
        reason = reason.removeprefix("Skipped: ")
        report.longrepr = f"the shared data is required here (CI=true or HEADWAY_DATA_DIR is set): {reason}"
