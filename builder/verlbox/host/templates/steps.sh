# The shell around build_steps.py, which holds every in-image build step (Python's standard library only):
# each installing RUN runs `bash /tmp/verlbox/steps.sh COMMAND ...`. Its one job of its own: a base image
# without python3 gets Debian's python3 first (the first apt step installs it anyway), by plain apt with
# the build's CA and, offline, the bundle's repository (apt checks it against Debian's key), online the
# build's mirror for the base's release. The step's record still starts from the base's package list.
set -euo pipefail
if ! command -v python3 >/dev/null 2>&1; then
  dpkg-query -W -f '${Package}=${Version}\n' >/tmp/verlbox-dpkg-before
  options=(-o Acquire::Languages=none)
  if [ -s /run/secrets/ca_bundle ]; then options+=(-o Acquire::https::CAInfo=/run/secrets/ca_bundle); fi
  if [ -e /tmp/verlbox/offline.list ]; then
    mkdir -p /tmp/verlbox-repo && cp -r /tmp/verlbox/debian/. /tmp/verlbox-repo/
    while read -r deb pool; do
      mkdir -p "/tmp/verlbox-repo/${pool%/*}" && cp "/tmp/verlbox/debs/$deb" "/tmp/verlbox-repo/$pool"
    done </tmp/verlbox/pool.txt
    options+=(-o Dir::Etc::SourceList=/tmp/verlbox/offline.list -o Dir::Etc::SourceParts=/nonexistent
      -o Acquire::Check-Valid-Until=false)
  elif [ -s /run/secrets/apt_mirror ]; then
    . /etc/os-release
    printf 'deb %s %s main\n' "$(cat /run/secrets/apt_mirror)" "$VERSION_CODENAME" >/tmp/verlbox-mirror.list
    options+=(-o Dir::Etc::SourceList=/tmp/verlbox-mirror.list -o Dir::Etc::SourceParts=/nonexistent)
  fi
  apt-get "${options[@]}" update && apt-get "${options[@]}" install -y --no-install-recommends python3
  rm -f /tmp/verlbox-mirror.list
fi
exec python3 /tmp/verlbox/steps/build_steps.py "$@"
