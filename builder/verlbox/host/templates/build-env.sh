# Sourced at the start of every RUN that installs something (verlbox's templates mount it).
# Reads the build's secrets: an extra CA bundle and package index URLs, used by this RUN only.
if [ -s /run/secrets/ca_bundle ]; then
  export PIP_CERT=/run/secrets/ca_bundle SSL_CERT_FILE=/run/secrets/ca_bundle GIT_SSL_CAINFO=/run/secrets/ca_bundle
fi
if [ -s /run/secrets/pip_index_url ]; then
  PIP_INDEX_URL="$(cat /run/secrets/pip_index_url)"
  export PIP_INDEX_URL
fi
if [ -s /run/secrets/torch_index_url ]; then
  VERLBOX_TORCH_INDEX_URL="$(cat /run/secrets/torch_index_url)"
fi
if [ -f /etc/verlbox/constraints.txt ]; then
  export PIP_CONSTRAINT=/etc/verlbox/constraints.txt
fi
verlbox_apt_trust_ca() {
  if [ -s /run/secrets/ca_bundle ]; then
    echo 'Acquire::https::CAInfo "/run/secrets/ca_bundle";' >/etc/apt/apt.conf.d/99verlbox-ca
  fi
}
# One-line apt source for SUITE with COMPONENTS, on the mirror the base image already uses
# (or the build's apt_mirror secret): verlbox never names a mirror of its own.
verlbox_debian_sources() {
  suite="$1"
  shift
  mirror=""
  if [ -s /run/secrets/apt_mirror ]; then
    mirror="$(cat /run/secrets/apt_mirror)"
  fi
  if [ -z "$mirror" ]; then
    mirror="$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null)"
  fi
  if [ -z "$mirror" ]; then
    mirror="$(awk '$1 == "deb" && $2 !~ /^\[/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null)"
  fi
  if [ -z "$mirror" ]; then
    echo "verlbox: no Debian mirror in the base image's apt sources; build with --apt-mirror" >&2
    return 1
  fi
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite $*"
}
