"""
``sparkinfra/api_key.py`` (issue 43): a cluster whose settings name no key serves with one the first
converge generates, kept beside the site's data (0600, ignored by git) and read by every command as
a named key is; ``api_open`` serves without one and says so at the end of every run.
"""

from __future__ import annotations

import logging
import os
import stat
from types import SimpleNamespace

import pytest
from spark_cluster import load_cluster

from sparkinfra import api_key
from sparkinfra.settings import Settings, SettingsError


@pytest.fixture
def keyless(tmp_path, monkeypatch):
    monkeypatch.delenv(api_key.variable("pair"), raising=False)
    cluster = load_cluster(tmp_path)
    project = tmp_path / "site"
    (project / "group_data").mkdir(parents=True)
    return Settings(clusters={"pair": cluster}), project


def test_a_keyless_cluster_names_its_generated_keys_variable_and_only_a_converge_makes_the_key(keyless):
    settings, project = keyless
    read = api_key.with_keys(settings, project)  # status, chat, verify: nothing is made
    assert read.clusters["pair"].config.api_key_env == "SPARKINFRA_API_KEY_PAIR"
    assert not api_key.key_path(project, "pair").exists() and "SPARKINFRA_API_KEY_PAIR" not in os.environ
    assert api_key.where(read.clusters["pair"], project) == (
        f"none yet: the first converge generates it in {project}/group_data/pair.api-key")
    made = api_key.with_keys(read, project, make=True)  # a converge (its settings already name the variable)
    path = api_key.key_path(project, "pair")
    key = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) >= 40
    assert os.environ["SPARKINFRA_API_KEY_PAIR"] == key
    assert (project / ".gitignore").read_text().splitlines()[-1] == "group_data/*.api-key"
    api_key.with_keys(made, project, make=True)  # the next converge: the same key, one ignore rule
    assert path.read_text().strip() == key and (project / ".gitignore").read_text().count("*.api-key") == 1
    assert api_key.where(made.clusters["pair"], project) == f"{path} (generated, 0600)"


@pytest.mark.parametrize(("group", "where"), [
    ({"api_key_env": "SITE_KEY"}, "$SITE_KEY of the controller's environment (api_key_env)"),
    ({"api_open": True}, "none: the API is open (api_open: true)"),
])
def test_a_named_key_or_an_open_api_is_left_as_the_site_says(tmp_path, group, where):
    settings = Settings(clusters={"pair": load_cluster(tmp_path, group)})
    kept = api_key.with_keys(settings, tmp_path, make=True)
    assert kept.clusters["pair"].config.api_key_env == group.get("api_key_env", "")
    assert not api_key.key_path(tmp_path, "pair").exists()
    assert api_key.where(kept.clusters["pair"], tmp_path) == where


def test_an_open_api_with_a_key_is_refused_naming_both(tmp_path):
    with pytest.raises(SettingsError, match=r"key 'api_open'.*an open API takes no key, and api_key_env names SITE_KEY"):
        load_cluster(tmp_path, {"api_open": True, "api_key_env": "SITE_KEY"})


def test_an_open_api_is_said_in_the_runs_last_lines(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="pyinfra")  # another test may have quietened pyinfra's log
    cluster = load_cluster(tmp_path, {"api_open": True})
    handlers = []
    state = SimpleNamespace(add_callback_handler=handlers.append)
    api_key.say_open(state, Settings(clusters={"pair": cluster}))
    (handler,) = handlers
    handler.host_disconnect(state, None)
    handler.host_disconnect(state, None)  # one line per cluster, not per host
    said = [r.getMessage() for r in caplog.records if "api_open" in r.getMessage()]
    assert said == ["--> cluster pair serves its API without a key (api_open: true): anyone who reaches "
                    "bluey.local:8000 may use it"]
    api_key.say_open(state, Settings(clusters={"pair": load_cluster(tmp_path)}))
    assert len(handlers) == 1  # nothing to say for a keyed cluster
