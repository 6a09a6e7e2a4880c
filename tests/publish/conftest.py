"""Fixtures of the publish tests (helpers in support.py)."""

from tests.publish.support import index, release  # noqa: F401  (fixtures)
