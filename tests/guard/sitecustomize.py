"""Loaded by the Python processes a fast test starts (tests/conftest.py puts this folder on
their PYTHONPATH): the same no-sandbox guard as in the test process (no_sandbox.py)."""

import no_sandbox

no_sandbox.install()
