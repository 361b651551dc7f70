"""
The README and docs/ checked against the code: the settings page is the one the model generates, the
README stays short with the two set-up commands on its first screen, every deploy, shipped lane,
bed subcommand and benchmark has its place in its page, every relative link resolves, and every
``python -m sparkinfra VIEW`` names a view (``python -m sparkinfra.X``: a module that runs). Each
check is a function returning what is wrong, so ``test_the_checks_can_fail`` can feed it a broken page.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sparkinfra.cli import VIEWS
from sparkinfra.settings import HostSettings
from sparkinfra.settings.docs import COMMAND, settings_page

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_LIMIT = 8192
FIRST_SCREEN = 30  # lines: the set-up commands are seen without scrolling
SETUP_COMMANDS = ["make demo", "make test"]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


# --- (1) docs/settings.md is generated from the settings model ---------------------------------

def settings_problems(text: str) -> list[str]:
    """What differs from the page the model generates, with the command that regenerates it."""
    want = settings_page()
    if text == want:
        return []
    got, wanted = text.splitlines(), want.splitlines()
    line = next((i for i, (a, b) in enumerate(zip(got, wanted)) if a != b), min(len(got), len(wanted)))
    return [f"docs/settings.md is stale from line {line + 1}: run `{COMMAND}`"]


def test_settings_page_is_generated_from_the_model():
    assert not settings_problems(read(DOCS / "settings.md"))


def test_settings_page_says_every_setting_and_its_flag():
    page = settings_page()
    for key, field in HostSettings.model_fields.items():
        assert f"| `{key}` |" in page and field.description in page, key
    assert "`vllm serve --gpu-memory-utilization`" in page


# --- (2) the README: short, two set-up commands on its first screen ----------------------------

def readme_problems(text: str) -> list[str]:
    problems = []
    size = len(text.encode("utf-8"))
    if size > README_LIMIT:
        problems.append(f"README.md is {size} bytes, over {README_LIMIT}")
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    intro = lines[:end]
    fences = [i for i, line in enumerate(intro) if line.startswith("```")]
    if len(fences) != 2:
        return problems + [f"before the first ## heading: {len(fences) // 2} fenced code blocks, not one"]
    start, stop = fences
    if stop >= FIRST_SCREEN:
        problems.append(f"the set-up block ends on line {stop + 1}, past the first screen ({FIRST_SCREEN} lines)")
    indented = [i + 1 for i, line in enumerate(intro) if line.startswith("    ") and not start < i < stop]
    if indented:
        problems.append(f"another (indented) code block before the first ## heading, lines {indented}")
    block = [line for line in intro[start + 1:stop] if line.strip()]
    commands = [line.split("#", 1)[0].strip() for line in block]
    if commands != SETUP_COMMANDS:
        problems.append(f"the set-up commands are {commands}, not {SETUP_COMMANDS}")
    said = [line for line in block if "#" in line and line.split("#", 1)[1].strip()]
    if len(said) != len(block):
        problems.append("a set-up command without a comment saying what it does")
    return problems


def test_readme_is_short_and_starts_with_the_two_setup_commands():
    assert not readme_problems(read(README))


# --- (3) every deploy has its row, every row an existing deploy --------------------------------

def named_deploys(text: str) -> set[str]:
    return set(re.findall(r"^\| `deploys/([\w-]+\.py)` \|", text, re.M))


def deploy_problems(text: str) -> list[str]:
    files = {p.name for p in (ROOT / "deploys").glob("*.py")}
    rows = named_deploys(text)
    return ([f"deploys/{n}: no row in docs/deploys.md" for n in sorted(files - rows)]
            + [f"deploys/{n}: a row in docs/deploys.md, no such deploy" for n in sorted(rows - files)])


def test_every_deploy_has_a_row_and_every_row_a_deploy():
    assert not deploy_problems(read(DOCS / "deploys.md"))


# --- (4) every shipped lane is named in docs/lanes.md ------------------------------------------

def lane_problems(text: str) -> list[str]:
    return [f"lanes/{p.name}: not named in docs/lanes.md" for p in sorted((ROOT / "lanes").glob("*.yaml"))
            if f"`{p.stem}`" not in text]


def test_every_shipped_lane_is_named():
    assert not lane_problems(read(DOCS / "lanes.md"))


# --- (5) every sparkbed subcommand is in docs/testbed.md's table -------------------------------

class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def bed_subcommands(monkeypatch) -> set[str]:
    """The subcommands of ``python -m sparkbed`` as its own parser declares them (hidden ones left
    out): main() is stopped where it parses, before it touches anything."""
    import sparkbed.__main__ as bed_main

    def stop(parser, *args, **kwargs):
        raise _Parsed(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(_Parsed) as parsed:
        bed_main.main([])
    monkeypatch.undo()
    sub = next(a for a in parsed.value.parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest for a in sub._choices_actions if a.help != argparse.SUPPRESS}


def bed_table_commands(text: str) -> set[str]:
    """First words of the backticked commands in the first column of the page's command table."""
    found = set()
    for line in text.splitlines():
        m = re.match(r"\| (`[^|]+`) \| ", line)
        if m:
            found.update(cmd.split()[0] for cmd in re.findall(r"`([^`]+)`", m.group(1)))
    return found


def bed_table_problems(text: str, commands: set[str]) -> list[str]:
    table = bed_table_commands(text)
    return ([f"python -m sparkbed {c}: not in docs/testbed.md's table" for c in sorted(commands - table)]
            + [f"docs/testbed.md's table names {c}, not a subcommand" for c in sorted(table - commands)])


def test_every_bed_subcommand_is_in_the_testbed_table(monkeypatch):
    commands = bed_subcommands(monkeypatch)
    assert {"up", "down", "run"} <= commands  # the parser was read
    assert not bed_table_problems(read(DOCS / "testbed.md"), commands)


# --- (6) every benchmark is named in docs/benchmarks.md ----------------------------------------

def benchmark_problems(text: str) -> list[str]:
    return [f"benchmarks/{p.name}: not named in docs/benchmarks.md"
            for p in sorted((ROOT / "benchmarks").glob("*.py")) if f"benchmarks/{p.name}" not in text]


def test_every_benchmark_is_named():
    assert not benchmark_problems(read(DOCS / "benchmarks.md"))


# --- (7) every relative link resolves ----------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or a place in this page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            problems.append(f"{page.relative_to(ROOT)}: link to {target}: no such file")
    return problems


def test_every_relative_link_resolves():
    problems = [p for page in pages() for p in link_problems(page, read(page))]
    assert not problems


# --- (8) every python -m sparkinfra VIEW runs ---------------------------------------------------

def runnable(module: str) -> bool:
    """A package with a __main__.py, or a module with an ``if __name__ == "__main__"`` block."""
    path = ROOT.joinpath(*module.split("."))
    if (path / "__main__.py").is_file():
        return True
    file = path.with_suffix(".py")
    return file.is_file() and re.search(r"""^if __name__ == ["']__main__["']:""", read(file), re.M) is not None


def module_problems(name: str, text: str) -> list[str]:
    mentioned = sorted(set(re.findall(r"python\s+-m\s+(sparkinfra(?:\.\w+)*)(?:\s+([a-z][\w-]*))?", text)))
    problems = [f"{name}: python -m {m}: no such module with a __main__" for m, _ in mentioned if not runnable(m)]
    return problems + [f"{name}: python -m sparkinfra {view}: no such view (sparkinfra.cli.VIEWS)"
                       for m, view in mentioned if m == "sparkinfra" and view and view not in VIEWS]


def test_every_python_m_sparkinfra_names_a_runnable_module():
    problems = [p for page in pages() for p in module_problems(str(page.relative_to(ROOT)), read(page))]
    assert not problems


# --- each check can fail -----------------------------------------------------------------------

def test_the_checks_can_fail(monkeypatch):
    settings = read(DOCS / "settings.md")
    assert settings_problems(settings.replace("| `fabric_mtu` | int 1280..9216 | `4200` |",
                                              "| `fabric_mtu` | int 1280..9216 | `9000` |"))
    assert settings_problems(settings.replace("| `rank` |", "| `rnak` |"))

    readme = read(README)
    assert readme_problems(readme + "x" * README_LIMIT)
    assert readme_problems(readme.replace("make test ", "make unit ", 1))
    assert readme_problems(readme.replace("make demo ", "make setup && make demo ", 1))

    deploys = read(DOCS / "deploys.md")
    assert deploy_problems(deploys.replace("| `deploys/tune.py` |", "| tune |"))
    assert deploy_problems(deploys + "\n| `deploys/gone.py` | nothing |\n")

    assert lane_problems(read(DOCS / "lanes.md").replace("`sim-long`", "sim-long"))

    commands = bed_subcommands(monkeypatch)
    assert bed_table_problems(read(DOCS / "testbed.md").replace("| `build` |", "| build |"), commands)

    assert benchmark_problems(read(DOCS / "benchmarks.md").replace("benchmarks/converge.py", "converge"))

    assert link_problems(README, "[gone](docs/gone.md)")
    assert not link_problems(README, "[site](https://pyinfra.com) [here](#docs) [lanes](docs/lanes.md#mods)")

    assert module_problems("README.md", "python -m sparkinfra.nothing_here")
    assert module_problems("README.md", "python -m sparkinfra.facts")  # a package without __main__
    assert module_problems("README.md", "python -m sparkinfra.chat")  # a view's old module
    assert module_problems("README.md", "python -m sparkinfra nothing_here")
    assert not module_problems("README.md", "python -m sparkinfra chat and python -m\nsparkinfra lanes show")
