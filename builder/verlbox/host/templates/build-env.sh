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

# Python packages for build step STEP. With the recipe's lock: exactly the step's locked files, by
# hash, without a resolver, installed by uv where the image has it (about 5x faster than pip here:
# docs/benchmarks.md), and the lock's entries become the step's record. Without a lock: pip resolves
# the requirements given, and its --report becomes the record (what `verlbox lock` reads); an offline
# build (offline-env.sh) installs only what the lock names.
verlbox_pip() {
  step="$1"
  shift
  slice="/tmp/verlbox/lock/$step.pip"
  if [ -f "$slice.txt" ] && command -v uv >/dev/null; then
    if [ -n "${PIP_INDEX_URL:-}" ]; then export UV_INDEX_URL="$PIP_INDEX_URL"; fi
    if [ -n "${PIP_EXTRA_INDEX_URL:-}" ]; then export UV_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX_URL"; fi
    # uv leaves lock files with random names in its temporary folder (uv-setuptools-*.lock, from
    # building an sdist): a folder of its own, removed after, keeps them out of the layer.
    # uv's --compile-bytecode would compile the whole environment again at every step (about 35 s
    # each here, torch included): verlbox_compile compiles this step's own files.
    scratch="$(mktemp -d)"
    TMPDIR="$scratch" UV_LINK_MODE=copy uv pip install --no-deps --require-hashes -r "$slice.txt" \
      && rm -rf "$scratch" && verlbox_compile "$slice.json" \
      && python3 /tmp/verlbox/record.py copy "$step" "$slice.json"
  elif [ -f "$slice.txt" ]; then
    pip install --no-deps --require-hashes -r "$slice.txt" && python3 /tmp/verlbox/record.py copy "$step" "$slice.json"
  elif [ -n "${VERLBOX_OFFLINE:-}" ]; then
    echo "verlbox: the lock has no Python files for step $step: an offline build installs only the lock" >&2
    return 1
  else
    pip install --report /tmp/verlbox-report.json "$@" \
      && python3 /tmp/verlbox/record.py pip "$step" /tmp/verlbox-report.json && rm -f /tmp/verlbox-report.json
  fi
}

# Bytecode for the distributions a step record names. With SOURCE_DATE_EPOCH (offline builds) the .pyc
# are hash-checked, and uv's uv_cache.json in each dist-info is dated SOURCE_DATE_EPOCH instead of the
# install time (its RECORD line follows), so that two builds write the same bytes.
verlbox_compile() {
  python3 - "$1" <<'PY'
import base64, hashlib, importlib.metadata as metadata, json, os, subprocess, sys, tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

with open(sys.argv[1]) as record:
    distributions = [metadata.distribution(entry["name"]) for entry in json.load(record)]
files = sorted(str(path.locate()) for dist in distributions for path in dist.files or [] if path.suffix == ".py")


# marshal's output depends on what the compiling process did before (its reference flags follow
# refcounts), so a worker pool gives other .pyc bytes per run: fixed slices of the sorted list, each
# compiled by a fresh interpreter, give the same bytes on any machine (failures ignored, as pip does)
def compile_slice(paths):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as listing:
        listing.write("\n".join(paths) + "\n")
        listing.flush()
        subprocess.run([sys.executable, "-m", "compileall", "-qq", "-i", listing.name], check=False)


with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
    list(pool.map(compile_slice, [files[i::8] for i in range(8)]))
# only an offline build has a date to write: online, the install time is true and two builds differ anyway
epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
for dist in distributions if epoch else []:
    info = Path(dist._path)
    marker = info / "uv_cache.json"
    if not marker.is_file():
        continue
    data = json.loads(marker.read_text())
    data["timestamp"] = {"secs_since_epoch": epoch, "nanos_since_epoch": 0}
    text = json.dumps(data, separators=(",", ":")).encode()
    marker.write_bytes(text)
    digest = base64.urlsafe_b64encode(hashlib.sha256(text).digest()).rstrip(b"=").decode()
    entry = f"{info.name}/uv_cache.json"
    record = info / "RECORD"
    lines = [f"{entry},sha256={digest},{len(text)}" if line.startswith(entry + ",") else line
             for line in record.read_text().splitlines()]
    record.write_text("\n".join(lines) + "\n")
PY
}

# apt steps: trust the CA, use the build's mirror if one is given (the base's sources come back after),
# install the locked versions if the lock has the step, and record what changed.
verlbox_apt_begin() {
  verlbox_apt_trust_ca
  if [ -s /run/secrets/apt_mirror ]; then
    mkdir -p /tmp/verlbox-apt-sources && cp -a /etc/apt/sources.list /etc/apt/sources.list.d /tmp/verlbox-apt-sources/ 2>/dev/null || true
    # the URL as sed's replacement text: its \ & and | (a query string's) taken literally
    mirror="$(sed -e 's/[\\&|]/\\&/g' /run/secrets/apt_mirror)"
    sed -i "s|^URIs: .*|URIs: $mirror|" /etc/apt/sources.list.d/*.sources 2>/dev/null || true
    sed -i -E "s|^(deb(-src)? (\[[^]]*\] )?)[^ ]+|\1$mirror|" /etc/apt/sources.list 2>/dev/null || true
  fi
  dpkg-query -W -f '${Package}=${Version}\n' | sort >/tmp/verlbox-dpkg-before
}
verlbox_apt_packages() {
  step="$1"
  shift
  if [ -f "/tmp/verlbox/lock/$step.apt.txt" ]; then
    cat "/tmp/verlbox/lock/$step.apt.txt"
  else
    echo "$@"
  fi
}
verlbox_apt_end() {
  dpkg-query -W -f '${Package}=${Version}\n' | sort >/tmp/verlbox-dpkg-after
  python3 /tmp/verlbox/record.py apt "$1" /tmp/verlbox-dpkg-before /tmp/verlbox-dpkg-after
  if [ -d /tmp/verlbox-apt-sources ]; then
    cp -a /tmp/verlbox-apt-sources/. /etc/apt/ && rm -rf /tmp/verlbox-apt-sources
  fi
  rm -rf /etc/apt/apt.conf.d/99verlbox-ca /tmp/verlbox-dpkg-before /tmp/verlbox-dpkg-after
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
