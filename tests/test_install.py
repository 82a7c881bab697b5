"""The install contract: pins in pyproject.toml and environment.yml agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return dict(r.split("==") for r in reqs)


def _environment_pins() -> tuple[str, dict[str, str]]:
    text = (ROOT / "environment.yml").read_text()
    python = re.search(r"^\s*-\s*python=(\S+)", text, re.M).group(1)
    pins = dict(re.findall(r"^\s*-\s*([A-Za-z0-9_.\-]+)==(\S+)\s*$", text, re.M))
    return python, pins


def test_every_requirement_is_pinned_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for e in project["optional-dependencies"].values() for r in e]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[\w.]+", r) for r in reqs), reqs


def test_environment_yml_matches_pyproject():
    python, env_pins = _environment_pins()
    assert env_pins == _pyproject_pins()
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = re.search(r">=(\d+\.\d+)", requires).group(1)
    assert tuple(map(int, python.split("."))) >= tuple(map(int, low.split(".")))


def test_named_packages_are_there():
    pins = _pyproject_pins()
    for name in ("torch", "jupyterlab", "ipywidgets", "plotly", "pandas", "vllm"):
        assert name in pins


def test_vllm_and_torch_installed_at_their_pins():
    from importlib.metadata import version

    pins = _pyproject_pins()
    assert version("vllm") == pins["vllm"]
    assert version("torch").split("+")[0] == pins["torch"]
    import vllm.distributed.parallel_state  # noqa: F401 - imports without a GPU


def test_every_shipped_recording_is_package_data():
    """An installed kit (not only a checkout) carries its H200 recordings: pyproject's globs cover each file."""
    from fnmatch import fnmatch

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["kit.recordings"]
    folder = ROOT / "kit" / "recordings"
    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.suffix != ".py"]
    files = [f for f in files if "__pycache__" not in f]
    assert len(files) > 100 and all(any(fnmatch(f, g) and f.count("/") == g.count("/") for g in globs) for f in files)


def test_the_vllm_stubs_are_package_data():
    """An installed kit carries the stubs its vLLM loader (`kit.experiments.vllm.importing.STUBS`) puts on sys.path."""
    from fnmatch import fnmatch

    from kit.experiments.vllm.importing import STUBS

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = package_data["kit.experiments.vllm"]
    files = [p.relative_to(STUBS.parent).as_posix() for p in STUBS.rglob("*.py")]
    assert STUBS == ROOT / "kit" / "experiments" / "vllm" / "stubs" and len(files) >= 10
    assert all(any(fnmatch(f, g) and f.count("/") == g.count("/") for g in globs) for f in files)


def test_make_test_runs_the_slow_tests_too():
    """`slow` only lets a person leave the long tests out of a quick loop: the suite CI runs selects them."""
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "slow" not in recipe and "slow" not in addopts
    marked = [p.name for p in (ROOT / "tests").glob("test_*.py") if "@pytest.mark.slow" in p.read_text()]
    assert "test_browser.py" in marked and "test_notebooks.py" in marked
