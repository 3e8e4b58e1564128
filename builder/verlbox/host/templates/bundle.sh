# Sourced (after build-env.sh) by the stages `verlbox bundle` exports: fetch every file the lock names.
# Each step's slice sits in /tmp/verlbox/bundle/{pip,apt}/STEP.txt; hashes are checked as files arrive.

# Python files, every step's, into DEST: pip checks each against the lock's sha256.
verlbox_bundle_wheels() {
  dest="$1"
  mkdir -p "$dest"
  if [ -n "${VERLBOX_TORCH_INDEX_URL:-}" ]; then
    export PIP_EXTRA_INDEX_URL="$VERLBOX_TORCH_INDEX_URL"
  fi
  for slice in /tmp/verlbox/bundle/pip/*.txt; do
    pip download --no-deps --require-hashes --dest "$dest" -r "$slice" || return 1
  done
}

# Debian packages of the image's apt steps into DEST/STEP/, at the locked versions, from the base's
# own sources (or the build's mirror): apt checks them against the archive's signed indexes, which go
# into INDEXES for the offline build's apt to check them again.
verlbox_bundle_debs() {
  dest="$1"
  indexes="$2"
  verlbox_apt_begin && apt-get update && verlbox_bundle_indexes "$indexes" || return 1
  for slice in /tmp/verlbox/bundle/apt/*.txt; do
    [ -e "$slice" ] || continue
    step="$(basename "$slice" .txt)"
    mkdir -p "$dest/$step"
    # one word per locked package: name=version lines, split on purpose
    # shellcheck disable=SC2046
    (cd "$dest/$step" && apt-get download $(cat "$slice")) || return 1
  done
  mkdir -p "$dest"
  rm -rf /var/lib/apt/lists/*
}

# The archive's signed indexes as apt fetched and checked them (InRelease, or Release and its signature,
# and each Packages file), laid out as a repository's dists/ in DEST: an offline build points apt at
# them, which checks them against the base's keyring and each .deb against them.
verlbox_bundle_indexes() {
  # its own names: a shell function shares the caller's variables (verlbox_bundle_debs has a dest)
  indexes_dest="$1"
  # what the offline build's apt can check: Debian's archive layout (dists/), signed by Debian's keyring
  if [ ! -s /usr/share/keyrings/debian-archive-keyring.gpg ]; then
    echo "verlbox: the base has no Debian archive keyring: offline builds check .debs against Debian's only" >&2
    return 1
  fi
  for list in /var/lib/apt/lists/*_Packages; do
    case "$list" in
      *_dists_*) ;;
      *)
        echo "verlbox: ${list##*/} is a flat repository's index: offline builds check Debian's archive only" >&2
        return 1
        ;;
    esac
  done
  for list in /var/lib/apt/lists/*_dists_*; do
    name="${list##*_dists_}"
    case "$name" in
      *_InRelease | *_Release | *_Release.gpg | *_Packages) ;;
      *) continue ;;
    esac
    path="$indexes_dest/dists/$(printf '%s' "$name" | tr _ /)"
    mkdir -p "$(dirname "$path")" && cp "$list" "$path" || return 1
  done
  if ! ls "$indexes_dest"/dists/*/*/binary-*/Packages >/dev/null 2>&1; then
    echo "verlbox: apt kept no uncompressed Packages index to bundle (Acquire::GzipIndexes set?)" >&2
    return 1
  fi
  # each Packages file as the archive serves it too, xz-compressed: an offline apt asks for that one
  # first (it is what InRelease lists first). Fetched by apt's own helper and checked against InRelease.
  # (the loop runs in a subshell of the pipe: `exit` leaves it, the status after `done` says so)
  apt-get indextargets --format '$(URI)' 'Created-By: Packages' | while read -r uri; do
    relative="${uri#*/dists/}"
    release="$(ls "$indexes_dest/dists/${relative%%/*}"/*Release | head -n 1)"
    sha256="$(awk -v f="${relative#*/}.xz" '/^SHA256:/ { s = 1; next } /^[^ ]/ { s = 0 } s && $3 == f { print $1 }' "$release")"
    if [ -z "$sha256" ]; then
      echo "verlbox: ${relative#*/}.xz is not in ${release##*/}" >&2
      exit 1
    fi
    /usr/lib/apt/apt-helper download-file "$uri.xz" "$indexes_dest/dists/$relative.xz" "SHA256:$sha256" >/dev/null \
      || exit 1
  done || return 1
}
