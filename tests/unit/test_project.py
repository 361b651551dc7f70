"""
``sparkinfra.project``: the project's root (templates/, lanes/, images/, mods/) found through
``$SPARKINFRA_ROOT``, beside the package (a checkout, an editable install), or from the current
folder up (a non-editable install run from a checkout); anything else refused by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkinfra import project
from sparkinfra.lanes import LANES_DIR
from sparkinfra.operations.files import TEMPLATES
from sparkinfra.serving import UNIT_TEMPLATE

REPO = Path(__file__).resolve().parents[2]


def checkout(folder: Path, name: str = "sparkinfra") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    return folder


def test_this_checkout_is_the_root_and_its_data_is_found_through_it():
    assert project.ROOT == REPO
    assert (TEMPLATES, LANES_DIR) == (REPO / "templates", REPO / "lanes")
    assert UNIT_TEMPLATE.is_file() and UNIT_TEMPLATE.is_relative_to(TEMPLATES)
    assert any(LANES_DIR.glob("*.yaml"))


def test_beside_the_package_wins_over_the_current_folder(tmp_path):
    root, elsewhere = checkout(tmp_path / "src"), checkout(tmp_path / "other")
    assert project.find_root({}, cwd=elsewhere, package=root / "sparkinfra") == root


def test_an_installed_package_finds_the_checkout_it_runs_from(tmp_path):
    site = tmp_path / "site-packages"
    root = checkout(tmp_path / "site")
    (root / "inventory").mkdir()
    assert project.find_root({}, cwd=root / "inventory", package=site / "sparkinfra") == root


def test_the_environment_names_the_root_first(tmp_path):
    root, beside = checkout(tmp_path / "named"), checkout(tmp_path / "beside")
    assert project.find_root({project.ENV: str(root)}, cwd=beside, package=beside / "sparkinfra") == root


def test_no_root_is_refused_naming_where_it_looked(tmp_path):
    other = checkout(tmp_path / "other-project", name="something-else")
    with pytest.raises(project.ProjectNotFound, match=r"no sparkinfra project beside the package .* set \$SPARKINFRA_ROOT"):
        project.find_root({}, cwd=other, package=tmp_path / "site-packages" / "sparkinfra")
    with pytest.raises(project.ProjectNotFound, match=r"\$SPARKINFRA_ROOT is .*nowhere: no sparkinfra pyproject.toml"):
        project.find_root({project.ENV: str(tmp_path / "nowhere")}, cwd=REPO, package=REPO / "sparkinfra")
    (other / "pyproject.toml").write_text("not = [toml")
    assert not project.is_root(other)
