"""docs/architecture.md's module table against the tree, and the sweep side's subpackages saying what they import."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("runner", "hydra_plugins")
SWEEPS = ROOT / "runner" / "sweeps"


def _modules_table_paths() -> list[str]:
    """Every backticked `.py` path in the first column of the "## The modules" table, in order, repeats kept."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = re.search(r"^## The modules\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert section is not None, f'{ARCHITECTURE.relative_to(ROOT)} has no "## The modules" section'
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")]
    assert rows and rows[0].replace(" ", "") == "|module|owns|", "the section's table is not `| module | owns |`"
    paths = []
    for row in rows[2:]:  # the header and its --- line
        first_column = row.split("|")[1]
        paths += [path for path in re.findall(r"`([^`]+)`", first_column) if path.endswith(".py")]
    return paths


def _package_modules() -> set[str]:
    """Every `*.py` under runner/ and hydra_plugins/ but the packages' `__init__.py`, relative to the repository."""
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }


def test_every_module_listed_in_the_architecture_table_exists():
    """Each path the modules table names is a file of the repository."""
    absent = sorted(path for path in _modules_table_paths() if not (ROOT / path).is_file())
    assert not absent, f"docs/architecture.md lists modules that do not exist: {', '.join(absent)}"


def test_the_architecture_table_lists_exactly_the_package_modules():
    """The modules table names every module of runner/ and hydra_plugins/, and nothing else."""
    listed = set(_modules_table_paths())
    modules = _package_modules()
    missing = sorted(modules - listed)
    extra = sorted(listed - modules)
    assert not missing and not extra, (
        "docs/architecture.md's module table differs from the tree:"
        f"\n  missing (add a row): {', '.join(missing) or 'none'}"
        f"\n  extra (no such module): {', '.join(extra) or 'none'}"
    )


def test_no_module_is_listed_twice_in_the_architecture_table():
    """Each module has one row of the modules table."""
    repeated = sorted(path for path, count in Counter(_modules_table_paths()).items() if count > 1)
    assert not repeated, f"docs/architecture.md lists these modules more than once: {', '.join(repeated)}"


def test_each_sweeps_subpackage_docstring_says_what_it_may_import():
    """Every subpackage of runner/sweeps has a module docstring in its __init__.py that names what it imports."""
    inits = sorted(path for path in SWEEPS.rglob("__init__.py") if path.parent != SWEEPS)
    assert inits, "runner/sweeps has no subpackages"
    silent = []
    for init in inits:
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        if not docstring or "import" not in docstring:
            silent.append(init.relative_to(ROOT).as_posix())
    assert not silent, f"these docstrings are empty or do not say what their package may import: {', '.join(silent)}"


def test_every_package_of_the_tree_is_one_the_wheel_ships():
    """pyproject.toml lists the packages setuptools puts in the wheel: a subpackage missing there would be absent
    from an installed runner (tests/test_packaging.py installs the wheel; this finds it without building one)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for top in ("runner", "hydra_plugins")
        for path in (ROOT / top).rglob("__init__.py")
    }
    assert tree - listed == set(), f"packages missing from pyproject.toml's [tool.setuptools] packages: {tree - listed}"
