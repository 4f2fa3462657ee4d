#!/usr/bin/env bash
# Debian packages the tests need beyond the venv: SLURM and munge for the real one-node SLURM
# cluster the tests start (tests/slurm_cluster.py; see ../shared/notes/slurm.md), and
# debootstrap for the image-build rehearsal's Debian root (tests/image_rehearsal.py), gcc for
# the stand-in libcuda the preflight's driver check is tested with (tests/test_cuda_driver.py),
# chromium, run headless, to open the report pages and charts as a reader would
# (tests/test_browser.py). Installs only; the tests write the configuration and start the daemons
# themselves (there is no systemd to start them). Without root (and no password-less sudo) it
# says so and stops: those tests then skip, except under CI (CI=true), where a missing package
# is a failure.
set -euo pipefail
PACKAGES=(slurmctld slurmd slurm-client slurmdbd mariadb-server munge debootstrap gcc libc6-dev chromium)

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "envs/test-packages.sh: not root, cannot install ${missing[*]}: their tests will skip" >&2
    [ "${CI:-}" = "true" ] && exit 1
    exit 0
fi
"${SUDO[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
