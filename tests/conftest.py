"""Test configuration: hypothesis is derandomized in CI so a run is reproducible."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Every envelope a test makes says the same "created" (latsim honours SOURCE_DATE_EPOCH), so
# two runs of one command print the same bytes; tests/test_output.py checks the clock itself.
os.environ.setdefault("SOURCE_DATE_EPOCH", "1764547200")
