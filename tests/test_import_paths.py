"""A job in a container keeps only Snakemake from the driver's environment (deploybench.import_paths).

The chain under the stand-in image (tests/test_containers.py) shows the leak it closes: without
it, the job found pytriton through Snakemake's search paths and ran the driver's tritonserver.
Here, in a process of its own without site-packages (``-S``), a search path laid out as Snakemake's mount of the driver's
site-packages: a Snakemake that requires one package, and a module nothing requires.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def _dist(site: Path, name: str, requires: list[str]) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = [f"Name: {name}", "Version: 1.0", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (site / name).mkdir()
    (site / name / "__init__.py").write_text("")
    (site / name / "later.py").write_text("")


def _job(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    prefix = tmp_path / "mnt" / "snakemake_searchpaths"
    site = prefix / "item_0"
    _dist(site, "snakemake", ["yte>=1", "pulp; extra == 'lp'"])
    _dist(site, "yte", [])
    (site / "leaky.py").write_text("")
    code = (
        f"import sys; sys.path.append({str(site)!r})\n"
        "import snakemake, yte\n"  # what the preamble's unpickling loads
        "from deploybench.import_paths import confine_to_image\n"
        f"{body}\n"
    )
    return subprocess.run(
        [sys.executable, "-S", "-c", code.replace("PREFIX", repr(f"{prefix}/"))],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip


def test_snakemake_stays_and_nothing_else_is_found_there(tmp_path):
    result = _job(
        tmp_path,
        "assert confine_to_image(PREFIX)\n"
        "import snakemake.later, yte.later\n"  # Snakemake's own, imported later: still found
        "try:\n"
        "    import leaky\n"
        "except ModuleNotFoundError as e:\n"
        "    print('not found:', e.name)\n",
    )
    assert result.returncode == 0, result.stderr
    assert "not found: leaky" in result.stdout


def test_a_module_already_loaded_from_there_fails_naming_it(tmp_path):
    result = _job(tmp_path, "import leaky\nconfine_to_image(PREFIX)\n")
    assert result.returncode == 1
    assert "LeakFromDriver: imported from the driver's environment, not the image: leaky" in (
        result.stderr
    )
    assert "add what is missing to the image's requirements" in result.stderr


def test_outside_a_container_nothing_changes(tmp_path):
    result = _job(tmp_path, "import leaky\nassert confine_to_image('/nowhere/') == []\n")
    assert result.returncode == 0, result.stderr
