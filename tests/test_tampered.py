"""Images changed after their build, as one who can change an image would, each caught by `verlbox verify` in one
line naming the file (or the part of its config), whatever the image's own files say: verify runs nothing of the
image and holds its files and config to the host's record of the build (host/trust/built.py). And the untouched
image matches in seconds, unread."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from conftest import docker, run_verlbox

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SITE = "opt/venv/lib/python3.11/site-packages"
# run in the tampered image's build, by its own Python: a checked-hash .pyc of verlbox/__init__.py that carries the
# untouched source's hash (so Python runs it: the header checks) and other code
FORGE_PYC = """
import importlib._bootstrap_external as bootstrap, importlib.util, sys
from pathlib import Path
source = Path(sys.argv[1])
code = compile("print('forged')\\n", str(source), "exec")
pyc = Path(importlib.util.cache_from_source(str(source)))
pyc.write_bytes(bootstrap._code_to_hash_pyc(code, importlib.util.source_hash(source.read_bytes()), checked=True))
"""
# a .pth runs at every start of the venv's Python; this one would hide an edited module from a check run there
HIDING_PTH = b"import sys; sys.modules.setdefault('verlbox_hidden', sys)\n"


def tampered(image: str, tmp_path: Path, name: str, lines: str, files: dict[str, bytes] | None = None) -> str:
    """An image FROM IMAGE with LINES after the FROM (FILES in its context), tagged verlbox-test/tampered-NAME."""
    tag = f"verlbox-test/tampered-{name}:ci"
    context = tmp_path / name
    context.mkdir()
    for file, data in (files or {}).items():
        (context / file).write_bytes(data)
    (context / "Dockerfile").write_text(f"FROM {image}\n{lines}")
    docker("buildx", "build", "--load", "--progress", "plain", "--tag", tag, str(context))
    return tag


def verified(tag: str) -> list[str]:
    """What `verlbox verify TAG` prints, once it failed (exit 1); the image removed after."""
    try:
        result = run_verlbox("verify", tag, timeout=900)
    finally:
        docker("image", "rm", tag, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stdout.splitlines()


def test_the_untouched_image_matches_in_seconds(image: str) -> None:
    started = time.monotonic()
    result = run_verlbox("verify", image)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(result.stdout.splitlines()) == 1 and result.stdout.startswith(f"{image} matches "), result.stdout
    assert seconds < 30, f"verify took {seconds:.0f} s"


def test_a_pth_that_hides_is_named(image: str, tmp_path: Path) -> None:
    tag = tampered(image, tmp_path, "pth", f"COPY zz-hide.pth /{SITE}/zz-hide.pth\n", {"zz-hide.pth": HIDING_PTH})
    digest = hashlib.sha256(HIDING_PTH).hexdigest()[:12]
    assert verified(tag) == [f"file /{SITE}/zz-hide.pth: added since the build (file 0644 0:0 sha256 {digest})"]


def test_an_edited_placed_py_is_named(image: str, tmp_path: Path) -> None:
    placed = f"/{SITE}/verlbox/runtime/steps/placed.py"
    tag = tampered(
        image, tmp_path, "placed", f"RUN printf 'def changed_since_build(path=None):\\n    return []\\n' >> {placed}\n"
    )
    lines = verified(tag)
    assert len(lines) == 1 and lines[0].startswith(f"file {placed}: changed since the build (file 0644 0:0 sha256 "), (
        lines
    )


def test_a_forged_checked_hash_pyc_is_named(image: str, tmp_path: Path) -> None:
    source = f"/{SITE}/verlbox/__init__.py"
    tag = tampered(
        image,
        tmp_path,
        "pyc",
        f"COPY forge.py /forge.py\nRUN python /forge.py {source} && rm /forge.py\n",
        {"forge.py": FORGE_PYC.encode()},
    )
    # the forgery is real: Python takes the bytecode for the untouched source and runs the other code
    ran = docker("run", "--rm", "--entrypoint", "python", tag, "-c", "import verlbox", check=False)
    assert ran.stdout == "forged\n", ran.stdout + ran.stderr
    lines = verified(tag)
    pyc = f"/{SITE}/verlbox/__pycache__/__init__.cpython-311.pyc"
    assert len(lines) == 1 and lines[0].startswith(f"file {pyc}: changed since the build (file 0644 0:0 sha256 "), lines


def test_an_entrypoint_that_runs_other_code_is_named(image: str, tmp_path: Path) -> None:
    """No file changes and no layer is added: what a container runs is the image's config, held to the build's too."""
    forged = '["python", "-c", "print(\'forged\')", "--"]'
    tag = tampered(image, tmp_path, "entrypoint", f'ENTRYPOINT {forged}\nCMD ["train"]\n')
    assert (
        docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", tag).stdout
        == docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", image).stdout
    )
    assert docker("run", "--rm", tag).stdout == "forged\n"  # the forgery is real: a container runs it
    assert verified(tag) == [f'config Entrypoint: image {forged}, built ["verlbox"]']
