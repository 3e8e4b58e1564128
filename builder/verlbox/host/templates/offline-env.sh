# Sourced after build-env.sh by every installing RUN of an offline build (`verlbox build --offline`).
# The step runs with --network=none; pip and uv see only the bundle's wheels (each still checked
# against the lock's sha256), apt only the step's own .debs from the bundle.
export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/verlbox/wheels
export UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS=/tmp/verlbox/wheels
# no cache mounts offline: a cache would be written into the layer itself
export UV_NO_CACHE=1 PIP_NO_CACHE_DIR=1
unset PIP_INDEX_URL PIP_EXTRA_INDEX_URL

# Step STEP's locked files, by hash. uv's --compile-bytecode would compile the whole environment again
# at every step (about 35 s each here), so this step's own files are compiled instead.
verlbox_pip() {
  step="$1"
  slice="/tmp/verlbox/lock/$step.pip"
  if [ ! -f "$slice.txt" ]; then
    echo "verlbox: the lock has no Python files for step $step: an offline build installs only the lock" >&2
    return 1
  fi
  if command -v uv >/dev/null; then
    # uv leaves lock files with random names in its temporary folder (uv-setuptools-*.lock, from
    # building an sdist): a folder of its own, removed after, keeps them out of the layer
    scratch="$(mktemp -d)"
    TMPDIR="$scratch" UV_LINK_MODE=copy uv pip install --no-deps --require-hashes -r "$slice.txt" \
      && rm -rf "$scratch" && verlbox_compile "$slice.json"
  else
    pip install --no-deps --require-hashes -r "$slice.txt"
  fi && python3 /tmp/verlbox/record.py copy "$step" "$slice.json"
}

# Bytecode for the distributions a step record names (SOURCE_DATE_EPOCH makes it hash-checked .pyc),
# and uv's uv_cache.json in each dist-info dated SOURCE_DATE_EPOCH instead of the install time (its
# RECORD line follows), so that two builds write the same bytes.
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
epoch = int(os.environ["SOURCE_DATE_EPOCH"])
for dist in distributions:
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

verlbox_apt_packages() {
  ls -d /tmp/verlbox/debs/*.deb
}

# What apt and dpkg write with the time in it (logs, binary caches): it would differ between two builds.
verlbox_offline_apt_clean() {
  rm -f /var/cache/apt/*.bin /var/cache/ldconfig/aux-cache
  find /var/log -type f -exec truncate -s 0 {} +
}
