"""Fixtures the unit tests share."""

import pytest
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state

from sparkinfra import remote


@pytest.fixture
def nothing_connects(monkeypatch):
    """The operator's tools may not reach any node here: ``remote.connect`` fails the test."""

    def connect(*args):
        raise AssertionError("connected")

    monkeypatch.setattr(remote, "connect", connect)


@pytest.fixture(autouse=True)
def pyinfra_context_as_it_was():
    """pyinfra's context (state, host, config) as before each test: its ``use`` restores nothing
    when its body raises, so a test whose operation raised left the next tests a fake state."""
    contexts = (ctx_state, ctx_host, ctx_config, ctx_inventory)
    before = [c.get() for c in contexts]
    yield
    for c, value in zip(contexts, before):
        c.set(value)
