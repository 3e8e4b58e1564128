# The shell around build_steps.py, which holds every in-image build step (Python's standard library only):
# each installing RUN runs `bash /tmp/verlbox/steps/steps.sh COMMAND ...`. Its one job of its own: a base
# without a python3 that can run the module gets its distribution's python3 first (the first apt step
# installs it anyway; with a lock, that step's locked list), by plain apt with the build's CA and, offline,
# the bundle's repository (apt checks it against Debian's key), online the build's mirror for a Debian
# base's release, else the base's own sources (build_steps.py refuses a Debian mirror on another
# distribution in one line). The step's record still starts from the base's package list.
set -euo pipefail
if ! python3 -c 'import sys, json, dataclasses, shutil, concurrent.futures; assert sys.version_info >= (3, 9)' \
  2>/dev/null; then
  dpkg-query -W -f '${Package}=${Version}\n' >/tmp/verlbox-dpkg-before
  packages=(python3)
  for slice in /tmp/verlbox/lock/*.apt.txt; do
    if [ -e "$slice" ]; then mapfile -t packages <"$slice"; fi
  done
  options=(-o Acquire::Languages=none)
  if [ -s /run/secrets/ca_bundle ]; then options+=(-o Acquire::https::CAInfo=/run/secrets/ca_bundle); fi
  if [ -e /tmp/verlbox/offline.list ]; then
    mkdir -p /tmp/verlbox-repo
    cp -r /tmp/verlbox/debian/. /tmp/verlbox-repo/
    while read -r deb pool; do
      mkdir -p "/tmp/verlbox-repo/${pool%/*}"
      cp "/tmp/verlbox/debs/$deb" "/tmp/verlbox-repo/$pool"
    done </tmp/verlbox/pool.txt
    options+=(-o Dir::Etc::SourceList=/tmp/verlbox/offline.list -o Dir::Etc::SourceParts=/nonexistent
      -o Acquire::Check-Valid-Until=false)
  elif [ -s /run/secrets/apt_mirror ] && [ "$(. /etc/os-release && echo "$ID")" = debian ]; then
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
    printf 'deb %s %s main\n' "$(cat /run/secrets/apt_mirror)" "$codename" >/tmp/verlbox-mirror.list
    options+=(-o Dir::Etc::SourceList=/tmp/verlbox-mirror.list -o Dir::Etc::SourceParts=/nonexistent)
  fi
  apt-get "${options[@]}" update
  apt-get "${options[@]}" install -y --no-install-recommends "${packages[@]}"
  rm -f /tmp/verlbox-mirror.list
  if [ "${1:-}" != apt ] && [ "${2:-}" != apt ]; then  # only an apt step records, and clears apt's lists
    rm -rf /tmp/verlbox-dpkg-before /var/lib/apt/lists/*
  fi
fi
exec python3 /tmp/verlbox/steps/build_steps.py "$@"
