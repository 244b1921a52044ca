"""What a fresh machine needs: every module imports, every imported package is declared,
and compiled kernels find a cache directory even when the installed package is read-only."""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
import os
import pkgutil
import re
import sys
import tomllib
from pathlib import Path

import pytest

import popplay
from popplay import _numba_cache

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "popplay"


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], set[str]]:
    """Distribution names in [project].dependencies and in any optional extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_requirement_name(r) for r in project["dependencies"]}
    extras = {_requirement_name(r) for group in project.get("optional-dependencies", {}).values() for r in group}
    return core, extras


def _extra_groups() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: {_requirement_name(r) for r in group}
            for name, group in project.get("optional-dependencies", {}).items()}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """Top-level names imported by ``path``: (at module level, anywhere)."""
    tree = ast.parse(path.read_text())
    module_level: set[str] = set()
    anywhere: set[str] = set()
    top_nodes = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        tops = {name.split(".")[0] for name in names}
        anywhere |= tops
        if id(node) in top_nodes:
            module_level |= tops
    return module_level, anywhere


def test_every_module_of_the_package_imports():
    names = [info.name for info in pkgutil.walk_packages(popplay.__path__, prefix="popplay.")]
    assert "popplay.cli" in names and "popplay.games.bandit.rules" in names
    for name in names:
        if name == "popplay.__main__":  # runs the CLI when imported
            continue
        importlib.import_module(name)


def test_every_imported_package_is_declared():
    """A package imported at module level must be a core dependency; one imported inside a
    function (an optional feature) must at least be in an extra, and so must one imported
    at module level by a module named after its extra (an adapter such as
    ``games/knights/pettingzoo.py``, which only users of that extra import). The
    machine's own Python may hold more than a fresh one: this is what keeps that from
    hiding a missing one."""
    core, extras = _declared()
    groups = _extra_groups()
    owners = importlib.metadata.packages_distributions()
    local = {"popplay", "__future__"} | set(sys.stdlib_module_names)
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module_level, anywhere = _imports(path)
        for name in sorted(anywhere - local):
            dists = {_requirement_name(d) for d in owners.get(name, [name])}
            allowed = core | groups.get(path.stem, set()) if name in module_level else core | extras
            if not dists & allowed:
                missing.append(f"{name} ({path.relative_to(ROOT)})")
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_declared_check_would_catch_an_undeclared_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import click\n\ndef f():\n    import matplotlib\n")
    module_level, anywhere = _imports(module)
    assert module_level == {"click"} and anywhere == {"click", "matplotlib"}
    core, _ = _declared()
    assert "click" not in core  # typer 0.29 and newer no longer bring it


def test_numba_cache_stays_beside_a_writable_package(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert _numba_cache.choose_cache_dir(str(tmp_path / "pkg"), str(tmp_path / "home")) is None


def test_numba_cache_falls_back_to_a_private_temp_dir_when_package_and_home_are_read_only(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    blocker = tmp_path / "a-file"  # nothing can be created below a regular file, even by root
    blocker.write_text("")
    chosen = _numba_cache.choose_cache_dir(str(blocker / "pkg"), str(blocker / "home"))
    assert chosen == str(tmp_path / f"popplay-numba-cache-{os.getuid()}")
    info = os.stat(chosen)
    assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700


def test_numba_cache_never_uses_a_planted_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f"popplay-numba-cache-{os.getuid()}").symlink_to(elsewhere)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert _numba_cache.choose_cache_dir(str(blocker / "pkg"), str(blocker / "home")) is None
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("TMPDIR", str(shared))
    (shared / f"popplay-numba-cache-{os.getuid()}").mkdir(mode=0o777)
    (shared / f"popplay-numba-cache-{os.getuid()}").chmod(0o777)  # writable by others: not ours alone
    assert _numba_cache.choose_cache_dir(str(blocker / "pkg"), str(blocker / "home")) is None


def test_an_explicit_numba_cache_dir_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert _numba_cache.choose_cache_dir(str(blocker / "pkg"), str(blocker / "home")) is None


@pytest.mark.parametrize("line", ['pip install -e . && popplay train bandit',
                                  'pip install -e ".[dev]" && python -m pytest -q'])
def test_readme_opens_with_the_two_commands_ci_runs(line):
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1].splitlines()[1:]
    assert first_block == ['pip install -e . && popplay train bandit',
                           'pip install -e ".[dev]" && python -m pytest -q']
    assert line in (ROOT / ".ci" / "run").read_text()


def test_the_entry_point_imports_little_before_its_ctrl_c_guard():
    """What loads before ``entry_point`` guards Ctrl-C is a window for a traceback: keep
    it to the package itself (tempfile alone pulled in random, shutil and compression)."""
    import subprocess
    import sys

    code = "import sys, popplay._entry; print(sorted(m for m in ('tempfile', 'numpy', 'typer') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
