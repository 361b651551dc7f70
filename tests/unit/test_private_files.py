"""
``put_private`` and ``same_on_node`` (``sparkinfra.operations.files``): a secret passes only through
a folder only the SSH user can enter, which is gone afterwards whatever happened (a host stand-in
records the commands and uploads).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sparkinfra.operations.files import put_private, same_on_node


class Host:
    """Records commands (as text) and uploads; ``mktemp`` answers ``folder``; ``cmp`` answers ``same``."""

    def __init__(self, folder="/tmp/tmp.private", same=True, upload=True, upload_raises=False):
        self.folder, self.same, self.upload, self.upload_raises = folder, same, upload, upload_raises
        self.commands, self.uploads = [], []

    def run_shell_command(self, command, _sudo=False):
        text = command.get_raw_value()
        self.commands.append((text, _sudo))
        if text == "mktemp -d":
            return bool(self.folder), SimpleNamespace(stdout=self.folder)
        if text.startswith("cmp "):
            return self.same, None
        return True, None

    def put_file(self, data, path, remote_temp_filename=None, _sudo=False):
        self.uploads.append((data.read(), path, remote_temp_filename, _sudo))
        if self.upload_raises:
            raise OSError("the connection dropped")
        return self.upload


def test_put_private_makes_the_file_first_then_uploads_through_a_private_folder_it_removes():
    host = Host()
    assert put_private(host, b"token", "/etc/sparkinfra/hf-token", mode="600")
    assert host.commands == [
        ("install -m 600 -o root -g root /dev/null /etc/sparkinfra/hf-token", True),
        ("mktemp -d", False),
        ("rm -rf /tmp/tmp.private", False),
    ]
    assert host.uploads == [(b"token", "/etc/sparkinfra/hf-token", "/tmp/tmp.private/upload", True)]


def test_put_private_removes_its_folder_when_the_upload_fails_and_uploads_nothing_without_one():
    host = Host(upload_raises=True)
    with pytest.raises(OSError):
        put_private(host, "token", "/etc/x")
    assert host.commands[-1] == ("rm -rf /tmp/tmp.private", False)
    host = Host(folder="")
    assert put_private(host, "token", "/etc/x") is False
    assert host.uploads == [] and not any(c.startswith("rm ") for c, _ in host.commands)


@pytest.mark.parametrize("same", [True, False])
def test_same_on_node_compares_on_the_node_and_removes_the_candidate(same):
    host = Host(same=same)
    assert same_on_node(host, "key", "/etc/sparkinfra/api-key.env") is same
    assert host.uploads == [("key", "/tmp/tmp.private/candidate", None, False)]
    assert host.commands == [
        ("mktemp -d", False),
        ("cmp -s /etc/sparkinfra/api-key.env /tmp/tmp.private/candidate", True),
        ("rm -rf /tmp/tmp.private", False),
    ]


def test_same_on_node_says_no_when_the_candidate_cannot_go_up():
    host = Host(upload=False)
    assert same_on_node(host, "key", "/etc/x") is False
    assert [c for c, _ in host.commands] == ["mktemp -d", "rm -rf /tmp/tmp.private"]
