#!/usr/bin/env bash
# Installs a Docker Engine with BuildKit (buildx) and compose v2 on Debian bookworm, and starts it.
# bookworm's own docker.io (20.10) has no buildx package; trixie's .debs run on bookworm
# (they need libc6 >= 2.34), so trixie is added at a low pin priority and only these come from it.
# The mirror is the host's own (its first Debian archive in apt's sources), or $VERLBOX_APT_MIRROR.
set -euo pipefail
if docker info >/dev/null 2>&1 && docker buildx version >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
host_mirror() {
  # deb822 stanzas (URIs:/Suites:) first, then one-line `deb URI SUITE ...`; skip -security/-updates suites
  awk '
    /^URIs:/ { uri = $2 }
    /^Suites:/ { for (i = 2; i <= NF; i++) if ($i !~ /-/ && uri != "") { print uri; exit } }
    /^[[:space:]]*$/ { uri = "" }
  ' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | grep . && return 0
  awk '$1 == "deb" { u = ($2 ~ /^\[/) ? $3 : $2; s = ($2 ~ /^\[/) ? $4 : $3; if (s !~ /-/) { print u; exit } }' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1
}
mirror="${VERLBOX_APT_MIRROR:-$(host_mirror)}"
if [ -z "$mirror" ]; then
  echo "no Debian mirror in apt's sources: set VERLBOX_APT_MIRROR" >&2
  exit 1
fi
if [ ! -f /etc/apt/sources.list.d/trixie.sources ]; then
  cat >/etc/apt/sources.list.d/trixie.sources <<SRC
Types: deb
URIs: ${mirror}
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  cat >/etc/apt/preferences.d/trixie-low <<'PIN'
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
fi
apt-get update -qq
apt-get install -y -qq -t trixie docker.io docker-buildx docker-compose >/dev/null
# the tools tests run for real: debootstrap (--bootstrap-base), zsh (the completion script it loads)
apt-get install -y -qq debootstrap zsh >/dev/null
mkdir -p /etc/docker
[ -f /etc/docker/daemon.json ] || echo '{"features": {"containerd-snapshotter": false}}' >/etc/docker/daemon.json
if ! docker info >/dev/null 2>&1; then
  (setsid dockerd >/var/log/dockerd.log 2>&1 &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
docker info --format 'Docker Engine {{.ServerVersion}}'
docker buildx version
docker compose version
