# Sourced after build-env.sh by every installing RUN of an offline build (`verlbox build --offline`).
# The step runs with --network=none; pip and uv see only the bundle's wheels (each still checked
# against the lock's sha256), apt only the step's own .debs from the bundle.
export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/verlbox/wheels
export UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS=/tmp/verlbox/wheels
# no cache mounts offline: a cache would be written into the layer itself
export UV_NO_CACHE=1 PIP_NO_CACHE_DIR=1
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL
export VERLBOX_OFFLINE=1

verlbox_apt_packages() {
  ls -d /tmp/verlbox/debs/*.deb
}

# What apt and dpkg write with the time in it (logs, binary caches): it would differ between two builds.
verlbox_offline_apt_clean() {
  rm -f /var/cache/apt/*.bin /var/cache/ldconfig/aux-cache
  find /var/log -type f -exec truncate -s 0 {} +
}
