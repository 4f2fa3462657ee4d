"""envs/install_lock.py, which installs an image's lock with the image's own pip: its lock parsing
and its handling of packages an upstream pip cannot uninstall (tests/image_rehearsal.py runs it
for real in a root file system with the NGC bases' traits)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploybench.locks import lock_format
from tests.conftest import REPO

install_lock = lock_format()  # envs/install_lock.py, as deploybench.locks reads locks with it


def test_every_entry_of_every_lock_is_read_with_its_hashes():
    for lock in sorted((REPO / "envs" / "containers").glob("*.lock")):
        text = lock.read_text()
        found = install_lock.entries(text)
        pinned = re.findall(r"^([A-Za-z0-9][\w.-]*)==", text, re.MULTILINE)
        assert list(found) == [install_lock.canonical(n) for n in pinned], lock.name
        for name, entry in found.items():
            assert entry.count("--hash=sha256:") >= 1, (lock.name, name)
            assert "# via" not in entry  # comments are not requirements
        # nothing lost: every hash of the lock is in one entry
        assert sum(e.count("--hash=") for e in found.values()) == text.count("--hash="), lock


def _dist(site: Path, name: str, version: str, record: bool) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if record:
        (info / "RECORD").write_text("")


def test_packages_installed_without_record_are_installed_beside(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _dist(site, "PyYAML", "6.0.1", record=False)  # as apt installs python3-yaml
    _dist(site, "six", "1.16.0", record=True)  # as pip installs it
    assert install_lock.without_record(["pyyaml", "six", "idna"], [str(site)]) == ["pyyaml"]

    lock = tmp_path / "x.lock"
    lock.write_text(
        "# header\npyyaml==6.0.3 \\\n    --hash=sha256:aa\n    # via -r x\n"
        "six==1.17.0 \\\n    --hash=sha256:bb\n"
    )
    monkeypatch.setattr(install_lock, "without_record", lambda names, path=None: ["pyyaml"])
    work = tmp_path / "work"
    work.mkdir()
    (first_names, first), (second_names, second) = install_lock.pip_commands(lock, ["six"], work)
    assert (first_names, second_names) == (["six"], ["pyyaml"])
    assert "--ignore-installed" not in first and first[-1].endswith("lock-0.txt")
    assert Path(first[-1]).read_text() == "six==1.17.0 \\\n    --hash=sha256:bb\n"
    assert "--ignore-installed" in second
    assert Path(second[-1]).read_text() == "pyyaml==6.0.3 \\\n    --hash=sha256:aa\n"
    for command in (first, second):
        assert {"--no-deps", "--require-hashes", "--break-system-packages"} <= set(command)
        assert command[command.index("--no-binary") + 1] == "six"


def test_the_lock_format_is_read_once_for_all_its_readers():
    """install_lock.parse: the header, each entry verbatim (what the rehearsal cuts), its
    hashes and pip's view of it (what install_lock installs, what deploybench.locks counts)."""
    text = (
        "# header\n#   more\nfoo_bar==1.0 \\\n    --hash=sha256:ab \\\n    --hash=sha256:cd\n"
        "    # via x\n\nsix==1.17.0 \\\n    --hash=sha256:ef\n"
    )
    header, (foo, six) = install_lock.parse(text)
    assert header == "# header\n#   more"
    assert (foo.name, foo.key, foo.version, foo.hashes) == (
        "foo_bar",
        "foo-bar",
        "1.0",
        ("ab", "cd"),
    )
    assert (
        foo.text == "foo_bar==1.0 \\\n    --hash=sha256:ab \\\n    --hash=sha256:cd\n    # via x\n"
    )
    assert foo.requirement == "foo_bar==1.0 \\\n    --hash=sha256:ab \\\n    --hash=sha256:cd\n"
    assert (six.key, six.version, six.hashes) == ("six", "1.17.0", ("ef",))
    with pytest.raises(install_lock.LockFormatError, match="'onnx>=1.14' is not pinned with =="):
        install_lock.parse("onnx>=1.14 ; python_version > '3' \\\n    --hash=sha256:00\n")
