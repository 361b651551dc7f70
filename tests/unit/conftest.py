"""Fixtures the unit tests share."""

import pytest

from sparkinfra import remote


@pytest.fixture
def nothing_connects(monkeypatch):
    """The operator's tools may not reach any node here: ``remote.connect`` fails the test."""

    def connect(*args):
        raise AssertionError("connected")

    monkeypatch.setattr(remote, "connect", connect)
