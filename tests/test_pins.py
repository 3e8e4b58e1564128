"""`verlbox build RECIPE --check`: every pin asked of stand-in upstreams on 127.0.0.1 (a registry with Docker
Hub's token exchange, simple indexes serving small real wheels, an archive server, NVIDIA's signed apt index),
the real `uv` resolving the final stage once; then each way an upstream fails, one line each."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from conftest import REPO, run_verlbox
from standins import REGISTRY_TOKEN, closed_port_url, serve_files, serve_registry
from test_nvidia_release import signed_repository, throwaway_key
from verlbox.host.building.sources import BuildSources
from verlbox.host.clients.upstream import Http
from verlbox.host.recipes.recipe import load_recipe, recipe_names
from verlbox.host.trust import pins

TAG = "11.8.0-cudnn8-devel-ubuntu22.04"
DIGEST = "sha256:" + "c" * 64


def wheel(name: str, version: str, requires: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """A real (tiny) wheel: its METADATA is what uv resolves with."""
    stem = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    files = {
        f"{stem}.dist-info/METADATA": metadata,
        f"{stem}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{stem}.dist-info/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{stem}.dist-info/RECORD"])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return f"{stem}-py3-none-any.whl", buffer.getvalue()


def simple_index(prefix: str, wheels: list[tuple[str, str, bytes]]) -> dict[str, bytes]:
    """PEP 503 pages under PREFIX for (project, file name, bytes), and the files themselves."""
    served: dict[str, bytes] = {}
    pages: dict[str, list[str]] = {}
    for project, file_name, data in wheels:
        digest = hashlib.sha256(data).hexdigest()
        served[f"{prefix}/{canonicalize_name(project)}/{file_name}"] = data
        pages.setdefault(canonicalize_name(project), []).append(
            f'<a href="{file_name}#sha256={digest}">{file_name}</a>'
        )
    for project, links in pages.items():
        served[f"{prefix}/{project}/"] = ("<html><body>" + "<br>".join(links) + "</body></html>").encode()
    return served


def upstream_files(vllm_requires: tuple[str, ...]) -> dict[str, bytes]:
    """The p40 recipe's upstreams, each pin served (vLLM's wheel asking for VLLM_REQUIRES)."""
    recipe = load_recipe("p40")
    torch_wheels = [(name, *wheel(name, version)) for name, version in recipe.torch.pins().items()]
    pypi = {"pip": recipe.python.pip, "uv": recipe.python.uv, "vllm": recipe.vllm.version, "verl": recipe.verl.version}
    pypi |= {name.split("[")[0]: version for name, version in recipe.verl.dependencies.items()}
    pypi |= recipe.apex.build_requirements | recipe.runtime.requirements
    pypi_wheels = [
        (name, *wheel(name, version, vllm_requires if name == "vllm" else ())) for name, version in pypi.items()
    ]
    pypi_wheels.append(("numpy", *wheel("numpy", "2.1.0")))  # a newer numpy is there to be taken
    packages = "".join(
        f"Package: {name}\nVersion: {recipe.cudnn.apt_version}\nArchitecture: amd64\n\n"
        for name in ("libcudnn8", "libcudnn8-dev")
    )
    files = simple_index("/simple", pypi_wheels) | simple_index("/torch", torch_wheels)
    files |= signed_repository(f"/cuda/{recipe.cudnn.repository}", packages, throwaway_key("A"))
    files[f"/archives/{recipe.apex.archive_name}"] = b"the archive's bytes"
    return files


@pytest.fixture
def recipe_file(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """p40 with its base on a stand-in registry (and vLLM from the index: a recipe's URL is https only)."""
    with serve_registry({f"/v2/nvidia/cuda/manifests/{TAG}": DIGEST}) as registry:
        for name in ("p40.yaml", "_verl-0.4.1.yaml"):
            (tmp_path / name).write_text((REPO / "recipes" / name).read_text())
        data = yaml.safe_load((tmp_path / "p40.yaml").read_text())
        data["base"]["image"] = f"{registry}/nvidia/cuda:{TAG}"
        del data["vllm"]["wheel_url"]
        data["cudnn"]["repository_key"] = throwaway_key("A").fingerprint  # the stand-in NVIDIA repository's key
        (tmp_path / "p40.yaml").write_text(yaml.safe_dump(data))
        yield tmp_path / "p40.yaml", registry


def check(recipe: Path, upstream: str, tmp_path: Path, *extra: str) -> tuple[int, list[str], str]:
    empty = tmp_path / "no-sources"
    empty.mkdir(exist_ok=True)
    result = run_verlbox(
        "build", str(recipe), "--check", "--check-timeout", "2",
        "--pip-index-url", f"{upstream}/simple", "--torch-index-url", f"{upstream}/torch",
        "--nvidia-repo-url", f"{upstream}/cuda", "--sources-url", f"{upstream}/archives", "--sources", str(empty),
        *extra, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in result.stderr and REGISTRY_TOKEN not in result.stdout + result.stderr
    return result.returncode, result.stdout.splitlines(), result.stderr


def test_every_pin_is_served_and_the_final_stage_resolves_once(recipe_file: tuple[Path, str], tmp_path: Path) -> None:
    recipe, registry = recipe_file
    with serve_files(upstream_files(("numpy<2",))) as upstream:
        code, lines, stderr = check(recipe, upstream, tmp_path)
    assert code == 0, "\n".join(lines) + stderr
    assert lines[0] == f"ok      base {registry}/nvidia/cuda:{TAG}  [{registry}] served ({DIGEST})"
    assert any(line.startswith("ok      torch==2.6.0+cu118  [127.0.0.1:") for line in lines)
    assert any(line.startswith("ok      libcudnn8=8.9.7.29-1+cuda11.8 libcudnn8-dev=") for line in lines)
    assert any(line.startswith("ok      apex e13873debc46 archive  [127.0.0.1:") for line in lines)
    resolution = next(line for line in lines if "resolved together" in line)
    assert resolution.startswith("ok") and resolution.endswith("for CPython 3.10, numpy 1.26.4")
    assert lines[-1] == f"{len(lines) - 1} of {len(lines) - 1} served"


def test_pins_that_cannot_coexist_are_named_before_any_build(recipe_file: tuple[Path, str], tmp_path: Path) -> None:
    recipe, _ = recipe_file
    with serve_files(upstream_files(("numpy>=2",))) as upstream:
        code, lines, _ = check(recipe, upstream, tmp_path)
    (resolution,) = [line for line in lines if "resolved together" in line]
    assert code == 1 and resolution.startswith("FAILED")
    assert "vllm==0.8.5.post1 depends on numpy>=2" in resolution and "numpy==1.26.4" in resolution
    assert lines[-1].endswith("; 1 failed")


def test_a_deleted_base_tag_says_what_to_do_in_one_line(tmp_path: Path) -> None:
    with serve_registry({}) as registry:
        finding = pins.check_base(Http(None, 5), f"{registry}/nvidia/cuda:{TAG}", None)
    assert not finding.served and finding.answer == (
        "not found: the tag was deleted (NVIDIA removes end-of-life CUDA tags); build with --base-image naming a "
        "copy you kept, or from a `verlbox bundle`"
    )


def test_a_refused_token_and_a_digest_that_moved_are_each_one_line() -> None:
    with serve_registry({f"/v2/nvidia/cuda/manifests/{TAG}": DIGEST}, token_status=401) as registry:
        image = f"{registry}/nvidia/cuda:{TAG}"
        refused = pins.asked("base", f"http://{registry}/v2/", lambda: pins.check_base(Http(None, 5), image, None))
    assert refused.answer == f"its token service ({registry}) answered HTTP 401 Unauthorized"
    other = "sha256:" + "d" * 64
    with serve_registry({f"/v2/nvidia/cuda/manifests/{other}": DIGEST}) as registry:
        moved = pins.check_base(Http(None, 5), f"{registry}/nvidia/cuda:{TAG}", other)
    assert not moved.served and moved.answer == f"the registry's digest is {DIGEST}, not the recipe's"


# the glibc of each base a shipped recipe names (Ubuntu 22.04: 2.35, Debian bookworm: 2.36)
BASE_GLIBC = {"nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04": 35, "debian:bookworm-slim": 36}


def test_the_glibc_floor_is_the_oldest_glibc_of_the_shipped_bases() -> None:
    bases = {load_recipe(name).base.image for name in recipe_names()}
    assert bases <= BASE_GLIBC.keys(), "a new base: add its glibc above, and lower pins.GLIBC_MINOR if it is older"
    assert min(BASE_GLIBC[base] for base in bases) == pins.GLIBC_MINOR


@pytest.mark.parametrize(
    ("fault", "answer"),
    [
        ("slow", "no answer within 1 s"),
        ("truncated", "the answer was cut short"),
        ("garbage", "no valid HTTP answer"),
        (None, "the index has no such project"),
    ],
)
def test_each_way_an_index_fails_is_one_line_naming_the_pin(fault: str | None, answer: str) -> None:
    files = {} if fault is None else simple_index("/simple", [("numpy", *wheel("numpy", "1.26.4"))])
    http = Http(None, 1)
    with serve_files(files, fault=fault) as upstream:
        index = f"{upstream}/simple"
        finding = pins.asked(
            "numpy==1.26.4", index, lambda: pins.check_on_index(http, index, "numpy", "1.26.4", "3.10")
        )
    assert not finding.served and finding.pin == "numpy==1.26.4" and finding.answer.startswith(answer)


def test_a_version_without_a_file_for_the_recipe_s_python_is_not_served() -> None:
    only_311 = "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    files = {"/simple/numpy/": f'<a href="{only_311}">{only_311}</a><a href="numpy-2.1.0.tar.gz">x</a>'.encode()}
    with serve_files(files) as upstream:
        for python, served in (("3.11", True), ("3.10", False)):
            finding = pins.check_on_index(Http(None, 5), f"{upstream}/simple", "numpy", "1.26.4", python)
            assert finding.served is served
        missing = pins.check_on_index(Http(None, 5), f"{upstream}/simple", "numpy", "1.25.0", "3.10")
    assert finding.answer == "1.26.4 is listed, but no file for CPython 3.10 on linux x86_64, glibc 2.35"
    assert missing.answer == "no 1.25.0 on this index (newest: 2.1.0)"


def test_a_wheel_that_needs_a_newer_glibc_than_every_base_has_is_not_served() -> None:
    """Ubuntu 22.04 (p40's base) has glibc 2.35: a manylinux_2_39 wheel would not install there."""
    too_new = "numpy-1.26.4-cp310-cp310-manylinux_2_39_x86_64.whl"
    fits = "numpy-1.26.4-cp310-cp310-manylinux_2_35_x86_64.whl"
    for listed, served in ((too_new, False), (fits, True)):
        with serve_files({"/simple/numpy/": f'<a href="{listed}">{listed}</a>'.encode()}) as upstream:
            finding = pins.check_on_index(Http(None, 5), f"{upstream}/simple", "numpy", "1.26.4", "3.10")
        assert finding.served is served, (listed, finding.answer)
    assert pins.PLATFORM == "x86_64-manylinux_2_35"  # uv's rehearsal holds the same floor


def test_an_unreachable_upstream_fails_its_pins_and_the_run_exits_1(
    recipe_file: tuple[Path, str], tmp_path: Path
) -> None:
    recipe, _ = recipe_file
    code, lines, _ = check(recipe, closed_port_url(), tmp_path)
    failed = [line for line in lines[:-1] if line.startswith("FAILED")]
    assert code == 1 and len(failed) == len(lines) - 2  # all but the base, whose registry is up
    assert all("cannot connect" in line or "resolved together" in line for line in failed)


def test_check_and_build_options_do_not_mix() -> None:
    result = run_verlbox("build", "p40", "--check", "--tag", "x:y")
    assert result.returncode == 2 and "--check builds nothing" in result.stderr
    result = run_verlbox("build", "p40", "--nvidia-repo-url", "http://127.0.0.1:9/cuda")
    assert result.returncode == 2 and "--nvidia-repo-url goes with --check" in result.stderr


def test_p40_s_final_stage_resolves_as_one_set_on_the_real_index_for_python_3_10() -> None:
    """The rehearsal of p40's final stage with the real resolver on this host's package index: PyPI's builds
    stand in for the +cu118 ones (the same metadata but for nvidia-*-cu11 packages) and vLLM's PyPI wheel for
    its cu118 release file. vLLM's ranges resolved alone take a numpy 2; with verl's pins, one set at 1.26.4."""
    recipe = load_recipe("p40")
    sources = BuildSources()
    index = pins.default_pip_index(sources)
    stand_ins = [requirement.split("+", 1)[0] for requirement in pins.final_requirements(recipe, url_wheels=False)]
    together = pins.check_resolution(stand_ins, "3.10", index, None, sources, 60)
    assert together.served and "for CPython 3.10, numpy 1.26.4; sdist only" in together.answer, together.answer
    # sdist-only on PyPI: named, never built (a build runs the index's code)
    assert together.answer.endswith("antlr4-python3-runtime 4.9.3, pylatexenc 2.10"), together.answer
    vllm_alone = [requirement for requirement in stand_ins if requirement.startswith(("vllm", "torch"))]
    alone = pins.check_resolution(vllm_alone, "3.10", index, None, sources, 60)
    assert alone.served and re.search(r"numpy (\d+)", alone.answer).group(1) != "1", alone.answer


def test_only_http_urls_are_asked_and_a_malformed_one_is_one_line() -> None:
    """A registry's token realm (or an index option) naming file:, or a port that is not a number, is a failed
    finding, never a local file read or a traceback."""
    http = Http(None, 2)
    for url, said in (
        ("file:///etc/passwd", "not an http(s) URL: 'file:///etc/passwd/numpy/'"),
        ("", "not an http(s) URL: '/numpy/'"),
        ("https://u:p@mirror.invalid:abc/simple", "the host[:port] after '://' is malformed"),
    ):
        finding = pins.asked("numpy==1.26.4", url, lambda url=url: pins.check_on_index(http, url, "numpy", "1", "3.10"))
        assert not finding.served and finding.answer.startswith(said) and "u:p" not in finding.answer + finding.host
