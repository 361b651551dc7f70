"""The README's settings table mirrors the settings model: every key, its default, its meaning."""

import re
from pathlib import Path

from sparkinfra.settings import HostSettings

README = Path(__file__).resolve().parents[2] / "README.md"


def _table() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in README.read_text().splitlines():
        m = re.match(r"\| `(\w+)` \| [^|]+ \| (.*?) \| (.*?) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_every_setting_is_in_the_readme_and_nothing_else():
    assert set(_table()) == set(HostSettings.model_fields)


def test_readme_defaults_and_descriptions_match_the_model():
    table = _table()
    for name, field in HostSettings.model_fields.items():
        default, meaning = table[name]
        if field.is_required():
            assert default == "required", name
        else:
            assert default == f"`{field.get_default(call_default_factory=True)}`", name
        assert meaning == field.description, name
