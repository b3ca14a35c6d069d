"""Test-wide settings: under CI (CI=true) hypothesis runs derandomized, so a landing is
judged on the same examples every time; locally it explores new examples on every run."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
