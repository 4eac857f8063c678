"""Shared test configuration."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

# Property tests: a fast default for CI, more examples with KVREF_HYPOTHESIS_PROFILE=thorough.
settings.register_profile(
    "ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("KVREF_HYPOTHESIS_PROFILE", "ci"))
