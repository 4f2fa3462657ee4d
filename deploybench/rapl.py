"""The CPU packages' energy from RAPL, through Linux's powercap sysfs interface.

Each package is a top-level zone ``/sys/class/powercap/intel-rapl:<N>`` (its subzones
``intel-rapl:<N>:<M>``, core, uncore and DRAM, are parts of it or beside it and are not added);
``energy_uj`` counts microjoules and wraps to 0 past ``max_energy_range_uj`` (Linux
Documentation/power/powercap/powercap.rst). AMD Zen processors expose their package counters
through the same driver and the same ``intel-rapl`` names on recent kernels. A ``psys`` zone
(the whole platform, on some client machines) is also top-level: it is left out, as it would
count the packages twice.

Since Linux 5.10 (and its stable backports; CVE-2020-8694) ``energy_uj`` is readable by root
only unless the administrator relaxes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import DeploybenchError

POWERCAP = Path("/sys/class/powercap")
PACKAGE_ZONE = re.compile(r"intel-rapl:(\d+)")


class RaplUnavailable(DeploybenchError, RuntimeError):
    """RAPL cannot be read here; ``str()`` is the reason (``no RAPL: ...``)."""


@dataclass
class _Domain:
    path: Path
    name: str
    max_uj: int
    last_uj: int
    total_uj: int  # the first reading plus every increase since, wraps undone


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


class Rapl:
    """The packages' energy counters under ``root``, summed (:meth:`energy_uj`). Read more
    often than a counter wraps (at 2^32 units: about a minute at 250 W): one wrap between two
    reads is undone, more cannot be seen."""

    def __init__(self, root: Path = POWERCAP) -> None:
        self.root = root
        if not root.is_dir():
            raise RaplUnavailable(
                f"no RAPL: {root} does not exist (no powercap driver: intel_rapl_msr, which "
                "also serves AMD's package counters on recent kernels)"
            )
        zones = sorted(
            (p for p in root.iterdir() if PACKAGE_ZONE.fullmatch(p.name)),
            key=lambda p: int(p.name.split(":")[1]),
        )
        self.domains: list[_Domain] = []
        for zone in zones:
            name = self._name(zone)
            if name is not None and not name.startswith("package"):
                continue  # psys: the platform, packages included
            energy = zone / "energy_uj"
            try:
                value = _read_int(energy)
                max_uj = _read_int(zone / "max_energy_range_uj")
            except PermissionError:
                raise RaplUnavailable(
                    f"no RAPL: {energy} is not readable by this user (Linux 5.10 and later make "
                    "energy_uj root-only; an administrator can grant read access)"
                ) from None
            except (OSError, ValueError) as error:
                raise RaplUnavailable(f"no RAPL: {energy} cannot be read ({error})") from None
            self.domains.append(_Domain(zone, name or zone.name, max_uj, value, value))
        if not self.domains:
            raise RaplUnavailable(f"no RAPL: {root} has no readable intel-rapl:<N>/energy_uj")

    @staticmethod
    def _name(zone: Path) -> str | None:
        try:
            return (zone / "name").read_text().strip()
        except OSError:
            return None

    def energy_uj(self) -> int:
        """Every package's energy, summed, in µJ, wraps undone (the first reading's value at
        the start: only differences mean anything)."""
        for domain in self.domains:
            value = _read_int(domain.path / "energy_uj")
            increase = value - domain.last_uj
            if increase < 0:  # wrapped once: up to the range's end, then from 0
                increase += domain.max_uj
            domain.total_uj += increase
            domain.last_uj = value
        return sum(d.total_uj for d in self.domains)

    def describe(self) -> list[dict[str, object]]:
        """The domains read, for the run's provenance."""
        return [
            {"zone": d.path.name, "name": d.name, "max_energy_range_uj": d.max_uj}
            for d in self.domains
        ]
