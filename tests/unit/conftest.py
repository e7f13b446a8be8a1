"""Fixtures of the unit tests that several modules use (beside tests/conftest.py)."""

from tests.unit.fake_stream import fake_server

__all__ = ["fake_server"]
