# Sourced after build-env.sh by every installing RUN of an offline build (`verlbox build --offline`).
# The step runs with --network=none; pip and uv see only the bundle's wheels (each still checked
# against the lock's sha256), apt only the step's own .debs from the bundle, checked against Debian's
# signed indexes the bundle carries.
export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/verlbox/wheels
export UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS=/tmp/verlbox/wheels
# no cache mounts offline: a cache would be written into the layer itself
export UV_NO_CACHE=1 PIP_NO_CACHE_DIR=1
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL
export VERLBOX_OFFLINE=1

# apt's only source in an offline apt step: a repository made of the bundle's copy of the archive's
# signed indexes (apt checks InRelease against the base's keyring, each Packages file against InRelease)
# and a pool holding the step's .debs where Packages puts them (apt checks each against its sha256
# there). A .deb is trusted because Debian's key vouches for its hash, not because the bundle lists it.
# The base's sources come back in verlbox_apt_end.
verlbox_offline_apt_sources() {
  repo=/tmp/verlbox-repo
  # a base without a sources.list (deb822 only) gets none back: verlbox_offline_apt_clean removes ours
  [ -e /etc/apt/sources.list ] || touch /tmp/verlbox-no-sources-list
  mkdir -p /tmp/verlbox-apt-sources "$repo" \
    && cp -a /etc/apt/sources.list /etc/apt/sources.list.d /tmp/verlbox-apt-sources/ 2>/dev/null
  rm -rf /etc/apt/sources.list.d/* && : >/etc/apt/sources.list && cp -r /tmp/verlbox/debian/. "$repo/" || return 1
  for dist in "$repo"/dists/*/; do
    suite="$(basename "$dist")"
    components="$(find "$dist" -mindepth 1 -maxdepth 1 -type d -printf '%f ')"
    # folder names from the bundle become words of a sources line: plain names only
    case "$suite $components" in
      *[!a-z0-9.\ -]*)
        echo "verlbox: the bundle's debian/dists holds a name that is not a suite or component: $suite $components" >&2
        return 1
        ;;
    esac
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] file:$repo $suite $components" \
      >>/etc/apt/sources.list
  done
  for deb in /tmp/verlbox/debs/*.deb; do
    # apt-get download's name: NAME_VERSION_ARCH.deb, an epoch's ':' written %3a
    file="$(basename "$deb" .deb)"
    name="${file%%_*}" rest="${file#*_}"
    version="$(printf '%s' "${rest%_*}" | sed 's/%3a/:/g')" arch="${rest##*_}"
    pool="$(awk -v p="$name" -v v="$version" -v a="$arch" '
      /^Package: / { pkg = $2 } /^Version: / { ver = $2 } /^Architecture: / { ar = $2 } /^Filename: / { fn = $2 }
      /^$/ { if (pkg == p && ver == v && ar == a) { print fn; exit } pkg = ver = ar = fn = "" }
      END { if (pkg == p && ver == v && ar == a) print fn }' "$repo"/dists/*/*/binary-*/Packages | head -n 1)"
    if [ -z "$pool" ]; then
      echo "verlbox: $name=$version ($arch) is in none of the bundle's signed indexes" >&2
      return 1
    fi
    mkdir -p "$repo/$(dirname "$pool")" && cp "$deb" "$repo/$pool" || return 1
  done
  # the lock pins the versions: an index past its Valid-Until date still vouches for the hashes it lists
  apt-get -o Acquire::Check-Valid-Until=false -o Acquire::Languages=none update
}

# What apt and dpkg write with the time in it (logs, binary caches): it would differ between two builds.
verlbox_offline_apt_clean() {
  rm -rf /var/cache/apt/*.bin /var/cache/ldconfig/aux-cache /tmp/verlbox-repo
  if [ -e /tmp/verlbox-no-sources-list ]; then
    rm -f /etc/apt/sources.list /tmp/verlbox-no-sources-list
  fi
  find /var/log -type f -exec truncate -s 0 {} +
}
