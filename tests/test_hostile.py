"""Hostile and odd input: each is refused in one line naming the problem, with the documented exit
code, no traceback and nothing written; values that are valid but odd reach the Dockerfile quoted."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import venv
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest
import yaml

from conftest import REPO, run_verlbox
from distributions import make_sdist, make_wheel
from standins import serve_files
from test_bundle import write_bundle
from verlbox.errors import BAD_INPUT, UsageError
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.render import render_dockerfile
from verlbox.host.clients.reference import parse_tag
from verlbox.host.recipes.basetree import saved_layer, tree_digest
from verlbox.host.recipes.lock import Lock, PipEntry
from verlbox.host.recipes.recipe import load_recipe
from verlbox.host.trust.bundle import (
    MANIFEST,
    check_base_archive,
    check_compiled,
    check_debs,
    check_debs_indexed,
    check_files,
    index_entries,
    offline_repository,
    read_manifest,
)
from verlbox.runtime.steps import build_steps
from verlbox.runtime.training.overrides import OverrideError, override_int

SHIPPED = REPO / "recipes"


def child(folder: Path, changes: dict, parent: str = "p40.yaml", name: str = "hostile") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"extends": str(SHIPPED / parent), **changes}, sort_keys=False))
    return path


def assert_refused(result, *needles: str, code: int = BAD_INPUT) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verlbox: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


INJECTIONS = [
    ({"description": "fine\nRUN touch /pwned"}, "description", "control character"),
    ({"description": "tab\there"}, "description", "control character"),
    ({"base": {"image": "debian:bookworm-slim\nRUN touch /pwned"}}, "base.image", "control character"),
    ({"base": {"image": "debian:bookworm-slim AS x"}}, "base.image", "may hold only"),
    ({"base": {"digest": "sha256:abc; touch /pwned"}}, "base.digest", "pattern"),
    ({"base": {"bootstrap": {"suite": "bookworm; touch /pwned"}}}, "base.bootstrap.suite", "pattern"),
    ({"python": {"version": "3.10; touch /pwned"}}, "python.version", "pattern"),
    ({"python": {"pip": "25.1.1 && touch /pwned"}}, "python.pip", "exact version"),
    ({"cudnn": {"apt_version": "8.9.7.29-1+cuda11.8 curl"}}, "cudnn.apt_version", "Debian package version"),
    ({"torch": {"version": "2.6.0$(touch /pwned)"}}, "torch.version", "exact version"),
    ({"torch": {"index": "cu118 --trusted-host evil"}}, "torch.index", "pattern"),
    ({"apex": {"repo": "https://github.com/NVIDIA/apex; touch /pwned"}}, "apex.repo", "https:// URL"),
    ({"apex": {"repo": "https://user:token@git.example/apex"}}, "apex.repo", "credentials"),
    ({"apex": {"repo": "http://git.example/apex"}}, "apex.repo", "https:// URL"),
    ({"apex": {"commit": "e13873de; touch /pwned"}}, "apex.commit", "pattern"),
    ({"apex": {"max_jobs": "4; touch /pwned"}}, "apex.max_jobs", "integer"),
    ({"vllm": {"wheel_url": "https://x.example/v.whl`touch /pwned`"}}, "vllm.wheel_url", "https:// URL"),
    ({"vllm": {"kernels_for": ["7.0 8.0"]}}, "vllm.kernels_for.0", "pattern"),
    ({"verl": {"version": "0.4.1 verl-evil"}}, "verl.version", "exact version"),
    ({"verl": {"dependencies": {"x; touch /pwned": "1.0"}}}, "verl.dependencies", "PEP 508"),
    ({"verl": {"dependencies": {"ray[default]*": "2.47.1"}}}, "verl.dependencies", "PEP 508"),
    ({"verl": {"dependencies": {"numpy": "1.26.4 evil"}}}, "verl.dependencies.numpy", "exact version"),
    ({"runtime": {"requirements": {"rich": "14.0.0\nRUN x"}}}, "runtime.requirements.rich", "control character"),
    ({"target_gpus": ["6.1; touch /pwned"]}, "target_gpus.0", "pattern"),
    ({"target_gpus": ["5.0"]}, "target_gpus", "older than anything verlbox supports"),
    ({"profile": "../../etc/passwd"}, "profile", "pattern"),
    ({"name": "Evil Name"}, "name", "pattern"),
]


@pytest.mark.parametrize(("changes", "key", "problem"), INJECTIONS, ids=[key for _, key, _ in INJECTIONS])
def test_every_recipe_field_refuses_what_could_escape(tmp_path: Path, changes: dict, key: str, problem: str) -> None:
    path = child(tmp_path, changes)
    output = tmp_path / "out" / "Dockerfile"
    result = run_verlbox("render", str(path), "-o", str(output))
    assert_refused(result, f"{path}: {key}", problem)
    assert not output.exists() and not output.parent.exists()


def test_valid_but_odd_values_reach_the_dockerfile_quoted(tmp_path: Path) -> None:
    path = child(tmp_path, {"description": 'costs $HOME and "quotes" \\ too'})
    text = render_dockerfile(BuildPlan(load_recipe(path)))
    assert 'org.opencontainers.image.description="costs \\$HOME and \\"quotes\\" \\\\ too"' in text
    assert "'ray[default]==2.47.1'" in text  # a glob pattern to the shell unless quoted
    assert "# costs $HOME" in text.splitlines()[1]


def test_credentials_in_a_build_time_index_url_never_reach_the_context(tmp_path: Path, sources_dir: Path) -> None:
    from verlbox.host.building.context import write_context
    from verlbox.host.building.sources import BuildSources

    plan = BuildPlan(load_recipe("p40"))
    context = tmp_path / "context"
    context.mkdir()
    write_context(plan, context, BuildSources(archives=sources_dir))
    sources = BuildSources.from_options(
        None, "https://user:s3cr3t-t0ken@mirror.example/simple", "https://u:t@torch.example/cu118", {}
    )
    arguments, environment = sources.secret_arguments()
    assert "s3cr3t-t0ken" not in " ".join(arguments)  # buildx reads the URL from the environment, not argv
    assert environment == {
        "VERLBOX_SECRET_PIP_INDEX_URL": "https://user:s3cr3t-t0ken@mirror.example/simple",
        "VERLBOX_SECRET_TORCH_INDEX_URL": "https://u:t@torch.example/cu118",
    }
    for file in context.rglob("*"):
        if file.is_file():
            assert b"s3cr3t-t0ken" not in file.read_bytes() and b"torch.example" not in file.read_bytes(), file


def test_a_relative_path_is_the_local_file_never_the_shipped_recipe(tmp_path: Path) -> None:
    for name in ("p40-cu124.yaml", "_verl-0.4.1.yaml"):
        shutil.copy(SHIPPED / name, tmp_path / name)
    local = tmp_path / "p40-cu124.yaml"
    local.write_text(local.read_text().replace("description: P40 with", "description: LOCAL COPY P40 with"))
    result = run_verlbox("render", "./p40-cu124.yaml", cwd=tmp_path)
    assert result.returncode == 0 and "# LOCAL COPY P40 with" in result.stdout
    assert load_recipe(local).lock_path == tmp_path / "p40-cu124.lock.json"  # `verlbox lock` writes beside it
    missing = run_verlbox("render", "./p40.yaml", cwd=tmp_path)  # shipped, but not here
    assert_refused(missing, "./p40.yaml", "no such recipe file")


@pytest.mark.parametrize(
    ("argument", "problem"),
    [
        ("_verl-0.4.1", "no shipped recipe of that name"),
        ("p41", "no shipped recipe of that name"),
        ("recipes/", "no such recipe file"),
        ("/dev/null/x.yaml", "no such recipe file"),
        ("verlbox/p40-cu124:1", "no such recipe file (an image? give --image verlbox/p40-cu124:1)"),
    ],
)
def test_odd_recipe_arguments(argument: str, problem: str) -> None:
    assert_refused(run_verlbox("render", argument), problem)


def test_unreadable_and_non_mapping_recipe_files(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_refused(run_verlbox("render", str(binary)), str(binary), "cannot be read")
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    assert_refused(run_verlbox("render", str(listing)), "expected a mapping")


def test_a_childs_name_is_its_own_not_its_parents(tmp_path: Path) -> None:
    parent = tmp_path / "parent.yaml"
    parent.write_text(yaml.safe_dump({"extends": str(SHIPPED / "p40-cu124.yaml"), "name": "parent-name"}))
    kid = tmp_path / "kid.yaml"
    kid.write_text(yaml.safe_dump({"extends": "parent.yaml"}))
    recipe = load_recipe(kid)
    assert recipe.name == "kid" and recipe.lock_path == tmp_path / "kid.lock.json"


@pytest.mark.parametrize("tag", ["Bad", "a b", "x:y:z", "img:tag with space", "img@sha256:" + "0" * 64, "img;rm", ""])
def test_bad_tags_are_refused_before_any_build(tag: str) -> None:
    # an unreachable engine proves it: had the build started, the error would be about the engine (exit 1)
    result = run_verlbox("build", "p40-cu124", "--tag", tag, env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert_refused(result, "--tag")


@pytest.mark.parametrize(
    ("tag", "repository", "name_tag"),
    [
        ("myimage", "myimage", "latest"),
        ("localhost:5000/img", "localhost:5000/img", "latest"),
        ("registry.example:443/a/b:v1.0", "registry.example:443/a/b", "v1.0"),
    ],
)
def test_odd_but_valid_tags_split_as_docker_does(tag: str, repository: str, name_tag: str) -> None:
    reference = parse_tag(tag)
    assert (reference.repository, reference.tag) == (repository, name_tag)


@pytest.mark.parametrize("value", ["24G", "-1", "0", "nan", "inf", "lots"])
def test_a_malformed_memory_cap_is_one_line_exit_2(value: str) -> None:
    result = run_verlbox("train", "--recipe", "p40-cu124", "--dry-run", env={"VERLBOX_GPU_MEMORY_GIB": value})
    assert_refused(result, "VERLBOX_GPU_MEMORY_GIB", "positive number of GiB")
    flag = run_verlbox("train", "--recipe", "p40-cu124", "--dry-run", "--gpu-memory-gib", value)
    assert_refused(flag, "--gpu-memory-gib")


def test_other_commands_ignore_the_memory_cap_variable() -> None:
    assert run_verlbox("recipes", env={"VERLBOX_GPU_MEMORY_GIB": "24G"}).returncode == 0


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("VERLBOX_TORCH_INDEX_URL", "not a url"),
        ("VERLBOX_PIP_INDEX_URL", "ftp://x y"),
        ("VERLBOX_APT_MIRROR", "mirror"),
        ("VERLBOX_PIP_INDEX_URL", "https://user:PLANTED-TOKEN@index.example/simple x?token=PLANTED-TOKEN"),
        ("VERLBOX_TORCH_INDEX_URL", "ftp://user:PLANTED-TOKEN@index.example/whl"),
        ("VERLBOX_APT_MIRROR", "https//user:PLANTED-TOKEN@mirror.example/debian"),
        ("VERLBOX_APT_MIRROR", "https://mirror.example/debian?token=PLANTED-TOKEN"),
    ],
)
def test_malformed_source_variables(variable: str, value: str) -> None:
    result = run_verlbox(
        "build", "p40", "--bootstrap-base", env={variable: value, "DOCKER_HOST": "unix:///nonexistent.sock"}
    )
    assert_refused(result)
    assert "PLANTED-TOKEN" not in result.stdout + result.stderr  # a malformed URL is still not echoed whole


def test_a_torch_index_verlbox_does_not_know_needs_its_url_before_building(tmp_path: Path) -> None:
    shutil.copy(SHIPPED / "_verl-0.4.1.yaml", tmp_path / "_verl-0.4.1.yaml")
    recipe = tmp_path / "rocm.yaml"
    recipe.write_text((SHIPPED / "p40.yaml").read_text().replace("index: pytorch-cu118", "index: pytorch-rocm6"))
    env = {"VERLBOX_TORCH_INDEX_URL": "", "DOCKER_HOST": "unix:///nonexistent.sock"}
    assert_refused(run_verlbox("build", str(recipe), env=env), "'pytorch-rocm6' wheel index", "--torch-index-url")


def test_an_interpolated_integer_override_is_named() -> None:
    with pytest.raises(OverrideError, match=r"trainer.n_gpus_per_node=\$\{oc.env:GPUS\}: expected a whole number"):
        override_int(["trainer.n_gpus_per_node=${oc.env:GPUS}"], "trainer.n_gpus_per_node", 1)
    assert issubclass(OverrideError, UsageError)


@pytest.mark.parametrize("target", ["/proc/verlbox/Dockerfile", "{tmp}"])
def test_an_unwritable_output_is_one_line_and_nothing_is_left(tmp_path: Path, target: str) -> None:
    output = target.format(tmp=tmp_path)  # an existing folder cannot be replaced by a file
    result = run_verlbox("render", "p40", "-o", output)
    assert_refused(result, output, "cannot write here")
    assert os.listdir(tmp_path) == []


def test_unknown_arguments_exit_2_in_one_line() -> None:
    result = run_verlbox("build", "p40", "--no-such-flag")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("verlbox: error: unrecognized arguments")


def _locked_child(folder: Path, edit: Callable[[dict], object]) -> Path:
    """A recipe of the user's (p40-cu124 under another name) with the shipped lock, made for it and then
    edited by EDIT as an attacker or a bad merge would: the lock is what the build trusts."""
    recipe = child(folder, {}, parent="p40-cu124.yaml", name="mine")
    lock = json.loads((SHIPPED / "p40-cu124.lock.json").read_text())
    lock["recipe"], lock["recipe_hash"] = "mine", load_recipe(recipe).content_hash
    edit(lock)
    (folder / "mine.lock.json").write_text(json.dumps(lock))
    return recipe


def _step(lock: dict, name: str) -> dict:
    return next(step for step in lock["steps"] if step["name"] == name)


CRAFTED_LOCKS = [
    ("traversal", lambda lock: _step(lock, "torch").update(name="../../x"), "steps.1.name", "pattern"),
    (
        "apt-option",
        lambda lock: _step(lock, "python")["apt"].append({"name": "-oDPkg::Pre-Invoke::=touch /x", "version": "1"}),
        "steps.0.apt.47.name",
        "Debian package name",
    ),
    (
        "apt-version-option",
        lambda lock: _step(lock, "python")["apt"][0].update(version="--allow-unauthenticated"),
        "steps.0.apt.0.version",
        "Debian package version",
    ),
    (
        "pip-newline",
        lambda lock: _step(lock, "torch")["pip"][0].update(name="filelock\n--extra-index-url http://evil/"),
        "steps.1.pip.0.name",
        "control character",
    ),
    ("pip-hash", lambda lock: _step(lock, "torch")["pip"][0].update(sha256="abc"), "steps.1.pip.0.sha256", "pattern"),
    ("missing-key", lambda lock: _step(lock, "torch")["pip"][0].pop("sha256"), "steps.1.pip.0.sha256", "missing"),
    ("base-newline", lambda lock: lock["base"].update(reference="debian\nRUN x"), "base.reference", "control"),
    ("unknown-key", lambda lock: lock.update(extra_index="http://evil/"), "extra_index", "unknown key"),
    ("missing-step", lambda lock: lock["steps"].remove(_step(lock, "verl-deps")), "steps: no step verl-deps", ""),
    (
        "extra-step",
        lambda lock: lock["steps"].append({"name": "evil", "stage": "final"}),
        "steps: step evil is not one",
        "",
    ),
    ("twice", lambda lock: lock["steps"].append(_step(lock, "torch")), "steps", "torch is listed more than once"),
]


@pytest.mark.parametrize(("edit", "key", "problem"), [c[1:] for c in CRAFTED_LOCKS], ids=[c[0] for c in CRAFTED_LOCKS])
def test_a_crafted_lock_is_refused_in_one_line_naming_file_and_key(
    tmp_path: Path, edit: Callable[[dict], object], key: str, problem: str
) -> None:
    recipe = _locked_child(tmp_path, edit)
    out = tmp_path / "Dockerfile"
    result = run_verlbox("render", str(recipe), "-o", str(out))
    assert_refused(result, f"{tmp_path / 'mine.lock.json'}: {key}", problem)
    assert not out.exists()


def test_the_shipped_lock_passes_its_own_schema_and_each_fault_is_its_own_line(tmp_path: Path) -> None:
    assert run_verlbox("render", str(_locked_child(tmp_path, lambda lock: None))).returncode == 0

    def two_faults(lock: dict) -> None:
        _step(lock, "torch")["pip"][0].update(sha256="abc")
        _step(lock, "python")["apt"][0].update(version="-x")

    result = run_verlbox("render", str(_locked_child(tmp_path, two_faults)))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == BAD_INPUT and len(lines) == 2, result.stderr
    assert "steps.0.apt.0.version" in lines[0] and "steps.1.pip.0.sha256" in lines[1]


# ---- crafted bundles: the manifest is an index, the lock decides -------------------------------------------


def _offline_plan() -> BuildPlan:
    return BuildPlan(load_recipe("p40-cu124"), base_override=BUNDLE_BASE, offline=True)


BUNDLE_BASE = "verlbox-base/debian:bookworm-minbase"


def _locked_debs(plan: BuildPlan) -> dict[str, bytes]:
    """One stand-in .deb per locked package of the image's apt steps, named as `apt-get download` names them."""
    assert plan.lock is not None
    return {
        f"debs/{step.name}/{entry.name}_{entry.version.replace(':', '%3a')}_amd64.deb": entry.name.encode()
        for step in plan.lock.steps
        if step.stage == "final"
        for entry in step.apt
    }


def test_a_manifest_naming_another_base_is_refused(tmp_path: Path) -> None:
    plan = _offline_plan()
    bundle = write_bundle(tmp_path, plan, {"wheels/six-1.16.0-py2.py3-none-any.whl": b"w"})
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["base"]["reference"] = "attacker/anything:latest"
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    result = run_verlbox("render", "p40-cu124", "--offline", str(bundle))
    assert_refused(result, "manifest.json: base.reference is attacker/anything:latest", BUNDLE_BASE)


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda m: m["base"].update(reference="debian\nFROM evil"), "base.reference"),
        (lambda m: m["files"].update({"../outside.whl": "0" * 64}), "files.../outside.whl.[key]"),
        (lambda m: m["files"].update({"/etc/passwd": "0" * 64}), "files./etc/passwd.[key]"),
        (lambda m: m["base"].update(image_id="latest"), "base.image_id"),
    ],
    ids=["newline", "traversal", "absolute", "image-id"],
)
def test_a_malformed_manifest_is_one_line_naming_the_key(tmp_path: Path, edit: Callable[[dict], object], key: str):
    plan = _offline_plan()
    bundle = write_bundle(tmp_path, plan, {"wheels/six-1.16.0-py2.py3-none-any.whl": b"w"})
    manifest = json.loads((bundle / MANIFEST).read_text())
    edit(manifest)
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    assert_refused(run_verlbox("render", "p40-cu124", "--offline", str(bundle)), f"manifest.json: {key}: ")


def test_debs_are_exactly_the_locks_for_each_step(tmp_path: Path) -> None:
    plan = _offline_plan()
    assert plan.lock is not None
    debs = _locked_debs(plan)
    check_debs(tmp_path, read_manifest(write_bundle(tmp_path, plan, debs)), plan.lock)
    extra = debs | {"debs/python/evil_1.0_amd64.deb": b"x"}  # listed in a manifest recomputed over it
    with pytest.raises(UsageError, match=r"debs/python: evil=1\.0 not in the lock's step python"):
        check_debs(tmp_path, read_manifest(write_bundle(tmp_path / "extra", plan, extra)), plan.lock)
    first = next(iter(debs))
    swapped = {name.replace("_amd64", "-evil_amd64") if name == first else name: data for name, data in debs.items()}
    with pytest.raises(UsageError, match="not in the lock's step python"):
        check_debs(tmp_path, read_manifest(write_bundle(tmp_path / "swapped", plan, swapped)), plan.lock)
    missing = dict(list(debs.items())[1:])
    with pytest.raises(UsageError, match=r"no \.deb for"):
        check_debs(tmp_path, read_manifest(write_bundle(tmp_path / "missing", plan, missing)), plan.lock)
    compiler = debs | {"debs/apex-compiler/gcc_12_amd64.deb": b"x"}  # a builder step's packages are never bundled
    with pytest.raises(UsageError, match=r"debs/apex-compiler: gcc=12 not in the lock's step apex-compiler"):
        check_debs(tmp_path, read_manifest(write_bundle(tmp_path / "compiler", plan, compiler)), plan.lock)


def _signed_index(debs: dict[str, bytes], changed: str | None = None) -> dict[str, bytes]:
    """A stand-in of Debian's indexes as a bundle carries them: InRelease and a Packages file listing DEBS
    (CHANGED's entry with another hash)."""
    stanzas = []
    for name, data in debs.items():
        package, version = name.split("/")[-1].removesuffix("_amd64.deb").split("_", 1)
        digest = hashlib.sha256(data if name != changed else b"what Debian published").hexdigest()
        stanzas.append(
            f"Package: {package}\nVersion: {version.replace('%3a', ':')}\nArchitecture: amd64\n"
            f"Description: one\n two\nFilename: pool/main/{package}.deb\nSHA256: {digest}"
        )
    return {
        "debian/dists/bookworm/InRelease": b"-----BEGIN PGP SIGNED MESSAGE-----",
        "debian/dists/bookworm/main/binary-amd64/Packages": ("\n\n".join(stanzas) + "\n").encode(),
        "debian/dists/bookworm/main/binary-amd64/Packages.xz": b"the archive's own compression of it",
    }


def test_each_deb_is_the_one_debian_s_signed_index_in_the_bundle_lists(tmp_path: Path) -> None:
    """A manifest recomputed over a changed .deb passes the file check: Debian's index does not."""
    plan = _offline_plan()
    debs = _locked_debs(plan)

    def check(files: dict[str, bytes]) -> None:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        manifest = read_manifest(write_bundle(folder, plan, files))
        check_debs_indexed(folder, manifest, index_entries(folder, manifest))

    check(debs | _signed_index(debs))
    first = next(iter(debs))
    with pytest.raises(UsageError, match=r"sha256 [0-9a-f]{64}, but Debian's signed index lists [0-9a-f]{64}"):
        check(debs | _signed_index(debs, changed=first))
    unlisted = dict(list(debs.items())[1:])
    with pytest.raises(UsageError, match=r"is in none of the bundle's signed indexes"):
        check(debs | _signed_index(unlisted))
    with pytest.raises(UsageError, match=r"no copy of Debian's signed indexes .* run `verlbox bundle` again"):
        check(debs)


def test_the_offline_repository_places_each_deb_where_its_signed_index_says(tmp_path: Path) -> None:
    """The offline build's apt reads a `file:` repository: its sources line and each .deb's place come from
    the bundle's indexes, and reach a shell and a path inside the build, so only plain names pass."""
    plan = _offline_plan()
    debs = _locked_debs(plan)
    indexes = _signed_index(debs)

    def repository(files: dict[str, bytes]):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        manifest = read_manifest(write_bundle(folder, plan, files))
        return offline_repository(folder, manifest, index_entries(folder, manifest))

    made = repository(debs | indexes)
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert made.sources == f"deb [signed-by={keyring}] file:/tmp/verlbox-repo bookworm main\n"
    first = next(iter(debs))
    package = first.split("/")[-1].split("_")[0]
    assert (first.split("/")[-1], f"pool/main/{package}.deb") in made.pools[first.split("/")[1]]
    assert sum(len(placed) for placed in made.pools.values()) == len(debs)
    index = "debian/dists/bookworm/main/binary-amd64/Packages"
    for bad, pattern in (
        (indexes[index].replace(b"Filename: pool/main/", b"Filename: pool/../../etc/", 1), "no usable place"),
        (indexes[index].replace(b"Filename: pool/main/", b"Filename: /etc/", 1), "no usable place"),
    ):
        with pytest.raises(UsageError, match=pattern):
            repository(debs | indexes | {index: bad})
    renamed = {name.replace("/bookworm/", "/Bookworm%0Adeb/"): data for name, data in indexes.items()}
    with pytest.raises(UsageError, match="not a suite or component name"):
        repository(debs | renamed)


APEX_WHEEL = "apex-0.1-cp311-cp311-linux_x86_64.whl"


def test_the_compiled_apex_wheel_is_exactly_the_one_the_lock_pins(tmp_path: Path) -> None:
    """The offline build installs every wheel of the bundle's apex/ folder: only the lock's, by sha256."""
    plan = _offline_plan()
    assert plan.lock is not None
    digest = hashlib.sha256(b"compiled once").hexdigest()
    pin = PipEntry(name="apex", version="0.1", file=APEX_WHEEL, sha256=digest)
    lock = plan.lock.model_copy(update={"compiled": {"apex": [pin]}})

    def check(files: dict[str, bytes], against=lock) -> None:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        check_compiled(plan, folder, read_manifest(write_bundle(folder, plan, files)), against)

    records = {"apex/verlbox-source.json": _source_record(plan)} | _builder_records(lock)
    check({f"apex/{APEX_WHEEL}": b"compiled once"} | records)  # the genuine one
    with pytest.raises(UsageError, match=rf"apex/{APEX_WHEEL}: sha256 [0-9a-f]{{64}} is not a apex wheel the lock"):
        check({f"apex/{APEX_WHEEL}": b"compiled again"} | records)  # a manifest recomputed over a swapped wheel
    with pytest.raises(UsageError, match=r"apex/evil-1.0-py3-none-any.whl: sha256 .* is not a apex wheel"):
        check({f"apex/{APEX_WHEEL}": b"compiled once", "apex/evil-1.0-py3-none-any.whl": b"x"} | records)
    with pytest.raises(UsageError, match=rf"/apex: no {APEX_WHEEL} \(the lock's\)"):
        check(records)
    unpinned = lock.model_copy(update={"compiled": {}})
    with pytest.raises(UsageError, match=r"compiled: no apex wheel pinned .* run `verlbox lock` again"):
        check({f"apex/{APEX_WHEEL}": b"compiled once"}, unpinned)


def _builder_records(lock: Lock) -> dict[str, bytes]:
    """apex/build-record/STEP.KIND.json of the Apex stage's steps, as the lock has them."""
    return {
        f"apex/build-record/{step.name}.{kind}.json": json.dumps(
            [entry.model_dump(exclude_none=True) for entry in getattr(step, kind)]
        ).encode()
        for step in lock.steps
        if step.stage == "builder"
        for kind in ("pip", "apt")
        if getattr(step, kind)
    }


def _source_record(plan: BuildPlan, **changed: object) -> bytes:
    """Apex's source record as the recipe's compile writes it (apex_build.py), CHANGED as a crafted one."""
    assert plan.apex is not None
    expected = plan.apex.build_plan(plan.recipe.target_gpus)
    record = {key: expected[key] for key in ("commit", "archive_sha256", "arch_list")}
    applied = [patch["id"] for patch in expected["build_patches"] if patch["min_cuda"] in ("0", "12.4")]
    record |= {"nvcc": "12.4.131", "build_patches": applied}
    return json.dumps(record | changed).encode()


def test_apex_s_records_in_a_bundle_are_the_recipe_s_and_the_lock_s_and_nothing_else_is_there(
    tmp_path: Path,
) -> None:
    """What the offline build copies from apex/ into the image beside the wheel: the source record (the
    commit smoke and verify report) held to the recipe, each build-stage record to the lock's step."""
    plan = _offline_plan()
    assert plan.lock is not None
    pin = PipEntry(name="apex", version="0.1", file=APEX_WHEEL, sha256=hashlib.sha256(b"w").hexdigest())
    lock = plan.lock.model_copy(update={"compiled": {"apex": [pin]}})
    genuine = {f"apex/{APEX_WHEEL}": b"w", "apex/verlbox-source.json": _source_record(plan)} | _builder_records(lock)
    genuine_tools = genuine["apex/build-record/apex-build-tools.pip.json"]

    def check(files: dict[str, bytes]) -> None:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        check_compiled(plan, folder, read_manifest(write_bundle(folder, plan, files)), lock)

    check(genuine)
    swapped = json.loads(genuine_tools)
    swapped[0]["sha256"] = "0" * 64
    for files, refusal in (
        ({"apex/verlbox-source.json": _source_record(plan, commit="0" * 40)}, "commit '0{40}', the recipe's is"),
        ({"apex/verlbox-source.json": _source_record(plan, build_patches=["evil"])}, "build_patches"),
        ({"apex/verlbox-source.json": _source_record(plan, build_patches=[])}, "build_patches \\[\\], the recipe's"),
        ({"apex/verlbox-source.json": _source_record(plan, archive_sha256=["x"])}, "archive_sha256"),
        ({"apex/verlbox-source.json": _source_record(plan, nvcc="$(id)")}, "is not a CUDA version"),
        ({"apex/verlbox-source.json": _source_record(plan, extra=1)}, "keys"),
        ({"apex/build-record/apex-build-tools.pip.json": json.dumps(swapped).encode()}, "differs from the lock"),
        ({"apex/build-record/nowhere.pip.json": b"[]"}, "not a record of a step the lock has"),
        ({"apex/build-record/deeper/x.json": b"[]"}, "not a file a bundle's apex/ holds"),
        ({"apex/run-me.sh": b"#!/bin/sh"}, "not a file a bundle's apex/ holds"),
    ):
        with pytest.raises(UsageError, match=refusal):
            check(genuine | files)
    without = {name: data for name, data in genuine.items() if not name.endswith("verlbox-source.json")}
    with pytest.raises(UsageError, match=r"no verlbox-source\.json"):
        check(without)
    no_record = {name: data for name, data in genuine.items() if "build-record" not in name}
    with pytest.raises(UsageError, match=r"apex-compiler\.apt\.json: missing"):
        check(no_record)


def test_symlinks_in_a_bundle_or_as_the_bundle_are_refused(tmp_path: Path) -> None:
    plan = _offline_plan()
    bundle = write_bundle(tmp_path / "bundle", plan, {"wheels/six-1.16.0-py2.py3-none-any.whl": b"w"})
    link = tmp_path / "link"
    link.symlink_to(bundle)
    assert_refused(run_verlbox("render", "p40-cu124", "--offline", str(link)), "is a symbolic link")
    outside = tmp_path / "outside.whl"
    outside.write_bytes(b"w")
    (bundle / "wheels/six-1.16.0-py2.py3-none-any.whl").unlink()
    (bundle / "wheels/six-1.16.0-py2.py3-none-any.whl").symlink_to(outside)  # same bytes, same hash
    with pytest.raises(UsageError, match=r"six-1\.16\.0-py2\.py3-none-any\.whl: a symbolic link"):
        check_files(bundle, read_manifest(bundle))
    (bundle / "wheels/six-1.16.0-py2.py3-none-any.whl").unlink()
    os.mkfifo(bundle / "wheels/six-1.16.0-py2.py3-none-any.whl")
    with pytest.raises(UsageError, match="not a regular file"):
        check_files(bundle, read_manifest(bundle))


def _saved_archive(
    path: Path,
    image_id: str,
    tags: list[str],
    packages: list[str],
    images: int = 1,
    index_name: str | None = None,
    extra: dict[str, bytes] | None = None,
) -> Path:
    """An archive laid out as `docker save` writes it (manifest.json, OCI blobs, index.json): one layer whose
    dpkg status lists PACKAGES as installed, and EXTRA files."""

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    status = "\n\n".join(
        f"Package: {p.split('=')[0]}\nStatus: install ok installed\nVersion: {p.split('=')[1]}" for p in packages
    )
    layer = io.BytesIO()
    files = {"./var/lib/dpkg/status": status.encode()} | (extra or {})  # as `tar -C root -cf - .` names them
    folders = sorted({str(parent) for name in files for parent in PurePosixPath(name).parents} - {"."})
    with tarfile.open(fileobj=layer, mode="w") as inner:
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            inner.addfile(info)
        for name, data in files.items():
            add(inner, name, data)
    config = image_id.removeprefix("sha256:")
    entry = {"Config": f"blobs/sha256/{config}", "RepoTags": tags, "Layers": ["blobs/sha256/layer"]}
    index = {"manifests": [{"annotations": {"io.containerd.image.name": index_name}}]} if index_name else {}
    with tarfile.open(path, "w") as tar:
        add(tar, "manifest.json", json.dumps([entry] * images).encode())
        add(tar, "index.json", json.dumps(index).encode())
        add(tar, "blobs/sha256/layer", layer.getvalue())
        add(tar, f"blobs/sha256/{config}", b"{}")
    return path


def test_base_tar_is_read_before_it_is_loaded(tmp_path: Path) -> None:
    plan = _offline_plan()
    assert plan.lock is not None and plan.lock.base.packages
    bundle = write_bundle(tmp_path, plan, {"wheels/six-1.16.0-py2.py3-none-any.whl": b"w"})
    manifest = read_manifest(bundle)
    wanted, packages = manifest.base.image_id, plan.lock.base.packages
    archive = tmp_path / "base.tar"

    def refusal(**changes: object) -> str:
        arguments: dict = {"image_id": wanted, "tags": [BUNDLE_BASE], "packages": packages} | changes
        _saved_archive(archive, **arguments)
        with pytest.raises(UsageError) as refused:
            check_base_archive(archive, manifest, lock)
        return str(refused.value)

    _saved_archive(archive, wanted, [BUNDLE_BASE], packages, index_name=f"docker.io/{BUNDLE_BASE}")
    with tarfile.open(archive) as genuine, saved_layer(genuine, "genuine") as layer:  # a lock pinning its files
        lock = plan.lock.model_copy(
            update={"base": plan.lock.base.model_copy(update={"tree": tree_digest(layer, "genuine")})}
        )
    check_base_archive(archive, manifest, lock)  # the genuine layout passes
    # a registry base: Docker writes an official image's full name into index.json
    official = manifest.model_copy(update={"base": manifest.base.model_copy(update={"reference": "debian:bookworm"})})
    _saved_archive(archive, wanted, ["debian:bookworm"], packages, index_name="docker.io/library/debian:bookworm")
    check_base_archive(archive, official, lock)
    assert "would tag debian:bookworm-slim" in refusal(tags=[BUNDLE_BASE, "debian:bookworm-slim"])
    assert "would tag mine:latest" in refusal(index_name="mine:latest")
    assert "holds 2 images" in refusal(images=2)
    assert f"not the bundle's base {wanted}" in refusal(image_id="sha256:" + "9" * 64)
    assert "packages differ from the lock's base, e.g. evil=1" in refusal(packages=[*packages, "evil=1"])
    # issue 32: the lock's packages exactly, and one file more (an attacker's keyring, a python3 of their own)
    keyring = {"./usr/share/keyrings/debian-archive-keyring.gpg": b"an attacker's key"}
    assert "its files (tree sha256" in refusal(extra=keyring)
    archive.write_bytes(b"not a tar")
    with pytest.raises(UsageError, match="not a `docker save` archive"):
        check_base_archive(archive, manifest, lock)


def test_bundle_out_on_a_symlink_is_one_line_and_the_link_stays(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    assert_refused(run_verlbox("bundle", "p40-cu124", "--out", str(tmp_path / "link")), "is a symbolic link")
    assert (tmp_path / "link").is_symlink() and list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("value", ["10m", "-5", "nan", "1e999"])
def test_a_malformed_cluster_wait_is_named_before_waiting(value: str) -> None:
    from rich.console import Console

    from verlbox.runtime.training import train

    environ = {"RAY_ADDRESS": "127.0.0.1:9", "VERLBOX_CLUSTER_WAIT_S": value}
    with pytest.raises(UsageError, match=rf"^VERLBOX_CLUSTER_WAIT_S={value}: expected a number of seconds >= 0$"):
        train.resolve_topology(None, 2, [], environ, Console(file=io.StringIO()))


@pytest.mark.parametrize(
    ("written", "password"), [("s3cr3t-T0KEN", "s3cr3t-T0KEN"), ("s3cr3t%2FT0KEN", "s3cr3t/T0KEN")]
)
def test_a_mirror_token_reaches_neither_the_command_line_nor_the_base_nor_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str, password: str
) -> None:
    """--bootstrap-base with a mirror that needs credentials: debootstrap (run by verlbox on the host) gets
    the bare URL, the host's Debian keyring and --force-check-gpg, and wget the credentials from
    $HOME/.netrc; debootstrap writes the URL it got into the base's sources.list, so no layer of any image
    carries the token, and what it says (shown: its warnings) holds no password, as written or decoded.
    A password's '/' is written %2F; a raw one is refused. The boundary faked: the commands."""
    from rich.console import Console

    from verlbox.host.building import bootstrap
    from verlbox.host.recipes.recipe import Bootstrap

    seen: list[tuple[list[str], str]] = []
    real_run = subprocess.run
    keyring = tmp_path / "debian-archive-keyring.gpg"
    keyring.write_bytes(b"a keyring")

    def run(step: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        env = kwargs["env"]  # debootstrap's alone: the other steps keep the user's HOME
        netrc = Path(env["HOME"]) / ".netrc" if isinstance(env, dict) else None
        seen.append((step, netrc.read_text() if netrc and netrc.exists() else "-"))
        if step[0] == "debootstrap":  # what debootstrap writes: the mirror it was given; it echoes the login
            (Path(step[-2]) / "etc/apt").mkdir(parents=True)
            (Path(step[-2]) / "etc/apt/sources.list").write_text(f"deb {step[-1]} bookworm main\n")
            return subprocess.CompletedProcess(step, 0, "", f"W: retrying ci:{written} (ci:{password})\n")
        if step[0] == "tar":
            return real_run(step, check=True, capture_output=True, text=True)
        return subprocess.CompletedProcess(step, 0, "", "")

    def load(layer: tarfile.TarFile, where: str, reference: str) -> str:  # what the base's layer would hold
        (tmp_path / "sources.list").write_bytes(layer.extractfile("./etc/apt/sources.list").read())  # type: ignore[union-attr]
        return "sha256:" + "0" * 64

    monkeypatch.setattr(bootstrap.subprocess, "run", run)
    monkeypatch.setattr(bootstrap, "image_exists", lambda engine, reference: False)
    monkeypatch.setattr(bootstrap, "load_canonical_base", load)
    monkeypatch.setattr(bootstrap, "DEBIAN_KEYRING", keyring)
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: "/usr/sbin/" + name)
    monkeypatch.setattr(bootstrap.os, "geteuid", lambda: 0)
    output = io.StringIO()
    mirror = bootstrap.choose_mirror(f"https://ci:{written}@mirror.invalid/debian")
    bootstrap.ensure_bootstrapped_base(None, Bootstrap(suite="bookworm"), mirror, Console(file=output, width=400))
    debootstrap = [step for step, _ in seen if step[0] == "debootstrap"]
    assert len(debootstrap) == 1 and f"--keyring={keyring}" in debootstrap[0] and "--force-check-gpg" in debootstrap[0]
    commands = " ".join(" ".join(step) for step, _ in seen)
    assert "T0KEN" not in commands and debootstrap[0][-1] == "https://mirror.invalid/debian"
    assert [netrc for step, netrc in seen if step[0] == "debootstrap"] == [
        f"machine mirror.invalid login ci password {password}\n"
    ]
    assert {netrc for step, netrc in seen if step[0] != "debootstrap"} == {"-"}
    assert "T0KEN" not in (tmp_path / "sources.list").read_text()
    shown = output.getvalue()
    assert "T0KEN" not in shown and "W: retrying ci:*** (ci:***)" in shown
    assert "from https://mirror.invalid/debian" in shown
    raw_slash = "https://ci:s3cr3t/T0KEN@mirror.invalid/debian"  # the host part would end at that '/'
    spaced = "https://ci:s3cr3t%20T0KEN@mirror.invalid/debian"  # .netrc would read `T0KEN` as its next word
    for refused in (f"ftp://ci:{written}@mirror.invalid/debian?key={written}", raw_slash, spaced):
        with pytest.raises(UsageError) as error:
            bootstrap.choose_mirror(refused)
        assert "T0KEN" not in str(error.value) and "\n" not in str(error.value)


# an in-tree PEP 517 backend: the sdist builds with nothing but itself, so an install that fetches the
# backend it declares (setuptools) does so only because its build is isolated
_TREE_BACKEND = """
import base64, hashlib, zipfile
def _digest(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = "tinysdist-1.0.dist-info"
    files = {"tinysdist.py": b"BUILT = True\\n",
             info + "/METADATA": b"Metadata-Version: 2.1\\nName: tinysdist\\nVersion: 1.0\\n",
             info + "/WHEEL": b"Wheel-Version: 1.0\\nGenerator: tree\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = [f"{p},sha256={_digest(d)},{len(d)}" for p, d in files.items()] + [info + "/RECORD,,"]
    files[info + "/RECORD"] = ("\\n".join(record) + "\\n").encode()
    name = "tinysdist-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel_directory + "/" + name, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return name
"""


def _sdist(folder: Path) -> Path:
    files = {
        "pyproject.toml": '[build-system]\nrequires = ["setuptools>=40"]\n'
        'build-backend = "tree_backend"\nbackend-path = ["."]\n\n[project]\nname = "tinysdist"\nversion = "1.0"\n',
        "tree_backend.py": _TREE_BACKEND,
        "PKG-INFO": "Metadata-Version: 2.1\nName: tinysdist\nVersion: 1.0\n",
    }
    return make_sdist(folder, "tinysdist", "1.0", files)


def _simple_index(folder: Path) -> dict[str, bytes]:
    """A PEP 503 index of FOLDER's files: /simple/NAME/ pages and /files/FILE."""
    files = {f"/files/{path.name}": path.read_bytes() for path in folder.iterdir()}
    pages: dict[str, list[str]] = {}
    for path in folder.iterdir():
        pages.setdefault(path.name.split("-")[0], []).append(path.name)
    for name, names in pages.items():
        links = "".join(f'<a href="/files/{file}#sha256={_sha256(folder / file)}">{file}</a>' for file in names)
        files[f"/simple/{name}/"] = f"<html><body>{links}</body></html>".encode()
    return files


@pytest.mark.parametrize("served_by", ["bundle folder", "hostile index"])
@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_locked_sdist_is_built_with_no_build_tool_from_the_folder_or_index(
    tmp_path: Path, installer: str, served_by: str
) -> None:
    """Issue 32's first finding: beside the lock's files, the bundle's folder (offline) or the mirror
    (online) serves a setuptools-99 whose .pth runs in any interpreter of an environment it is installed in.
    The locked step installs its wheel by hash and builds its sdist, and that setuptools never runs."""
    if installer == "uv" and shutil.which("uv") is None:
        pytest.skip("needs uv (the test extra installs the image's version)")
    marker, wheels, tools = tmp_path / "hostile-code-ran", tmp_path / "wheels", tmp_path / "tools"
    wheels.mkdir()
    (tools / "lock").mkdir(parents=True)
    hostile_line = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n"
    make_wheel(wheels, "setuptools", "99.0.0", {"setuptools/__init__.py": "", "zz_hostile.pth": hostile_line})
    locked = [make_wheel(wheels, "tinywheel", "1.0", {"tinywheel.py": "WHEEL = True\n"}), _sdist(wheels)]
    entries = [
        {"name": path.name.split("-")[0], "version": "1.0", "file": path.name, "sha256": _sha256(path)}
        for path in locked
    ]
    (tools / "lock" / "deps.pip.txt").write_text(
        "".join(f"{e['name']}=={e['version']} --hash=sha256:{e['sha256']}\n" for e in entries)
    )
    (tools / "lock" / "deps.pip.json").write_text(json.dumps(entries))
    target, records = tmp_path / "env", tmp_path / "records"
    venv.create(target, with_pip=installer == "pip")
    offline = served_by == "bundle folder"
    base = {"PATH": os.environ["PATH"], "VIRTUAL_ENV": str(target), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    with serve_files(_simple_index(wheels)) as url, pytest.MonkeyPatch.context() as patch:
        secrets = build_steps.Secrets(pip_index_url=f"{url}/simple/")
        env = build_steps.pip_environment(secrets, offline=offline, index=None, extra_index=None, base=base)
        if offline:
            env |= {"UV_FIND_LINKS": str(wheels), "PIP_FIND_LINKS": str(wheels)}
        if installer == "pip":  # an image without uv: its own python's pip
            patch.setattr(build_steps.shutil, "which", lambda name: None)
            patch.setattr(build_steps.sys, "executable", str(target / "bin" / "python"))
        patch.setattr(build_steps, "compile_bytecode", lambda names, epoch: None)  # the image's own environment
        build_steps.install_python("deps", [], env, offline=offline, tools=tools, records=records)
    installed = subprocess.run(
        [str(target / "bin" / "python"), "-c", "import tinysdist, tinywheel; print(tinysdist.BUILT, tinywheel.WHEEL)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert installed.stdout.split() == ["True", "True"]
    assert not marker.exists(), "a build tool the lock does not pin ran"
    assert json.loads((records / "deps.pip.json").read_text()) == entries


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _faked_engine(monkeypatch: pytest.MonkeyPatch, loaded: list[str]) -> None:
    """bootstrap's Docker engine: no image yet, and a load that only notes it was asked."""
    from verlbox.host.building import bootstrap

    monkeypatch.setattr(bootstrap, "image_exists", lambda engine, reference: False)
    monkeypatch.setattr(bootstrap, "load_canonical_base", lambda layer, where, reference: loaded.append(reference))


@pytest.mark.parametrize("keyring_bytes", [None, b""])
def test_a_bootstrap_base_without_a_debian_keyring_is_refused_before_debootstrap_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyring_bytes: bytes | None
) -> None:
    """Without the keyring, debootstrap only warns that it cannot check the Release file and installs what the
    mirror serves: verlbox refuses first, in one line saying what to install."""
    from rich.console import Console

    from verlbox.errors import VerlboxError
    from verlbox.host.building import bootstrap
    from verlbox.host.recipes.recipe import Bootstrap

    keyring = tmp_path / "debian-archive-keyring.gpg"
    if keyring_bytes is not None:
        keyring.write_bytes(keyring_bytes)
    ran: list[list[str]] = []
    loaded: list[str] = []
    _faked_engine(monkeypatch, loaded)
    monkeypatch.setattr(bootstrap, "DEBIAN_KEYRING", keyring)
    monkeypatch.setattr(bootstrap.subprocess, "run", lambda step, **kwargs: ran.append(step))
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: "/usr/sbin/" + name)
    monkeypatch.setattr(bootstrap.os, "geteuid", lambda: 0)
    mirror = "https://mirror.invalid/debian"
    with pytest.raises(VerlboxError) as refused:
        bootstrap.ensure_bootstrapped_base(None, Bootstrap(suite="bookworm"), mirror, Console())
    message = str(refused.value)
    assert "\n" not in message and str(keyring) in message and "apt-get install debian-archive-keyring" in message
    assert ran == [] and loaded == []


def test_a_real_debootstrap_refuses_an_unsigned_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local mirror whose Release has no signature (no Release.gpg, no InRelease), given to the real
    debootstrap. Its own default keyring is made one this host lacks (its scripts, copied, under
    DEBOOTSTRAP_DIR), as on a host whose debootstrap names a keyring that is not there: on its own it would
    then only warn and read the unsigned Release on. With the host's keyring and --force-check-gpg it stops
    at the missing signature, before any package is fetched. Faked: only the Docker engine."""
    from rich.console import Console

    from verlbox.errors import VerlboxError
    from verlbox.host.building import bootstrap
    from verlbox.host.recipes.recipe import Bootstrap

    scripts = Path("/usr/share/debootstrap")
    if shutil.which("debootstrap") is None:
        pytest.skip("needs debootstrap (apt-get install debootstrap)")
    if os.geteuid() != 0:
        pytest.skip("debootstrap needs root")
    if not bootstrap.DEBIAN_KEYRING.is_file():
        pytest.skip(f"needs the host's Debian archive keyring at {bootstrap.DEBIAN_KEYRING}")
    if not (scripts / "scripts" / "bookworm").is_file():
        pytest.skip(f"needs debootstrap's scripts in {scripts}")
    own = tmp_path / "debootstrap"
    shutil.copytree(scripts, own)  # links followed: scripts/bookworm is sid's
    script = own / "scripts" / "bookworm"
    script.write_text(
        "\n".join(
            f"keyring {tmp_path / 'absent.gpg'}" if line.startswith("keyring ") else line
            for line in script.read_text().splitlines()
        )
        + "\n"
    )
    monkeypatch.setenv("DEBOOTSTRAP_DIR", str(own))
    suite = tmp_path / "mirror" / "dists" / "bookworm"
    suite.mkdir(parents=True)
    (suite / "Release").write_text(
        "Origin: Debian\nSuite: bookworm\nCodename: bookworm\nArchitectures: amd64 arm64\nComponents: main\n"
    )
    unpacked: list[list[str]] = []  # what the tree held once debootstrap stopped, besides its own log
    real_run = subprocess.run

    def run(step: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:  # the real one, watched
        result = real_run(step, **kwargs)  # type: ignore[call-overload]
        if step[0] == "debootstrap":
            tree = Path(step[-2])
            held = [path.name for path in tree.iterdir() if path.name not in ("debootstrap", "var")]
            unpacked.append(held + [path.name for path in tree.glob("var/cache/apt/archives/*.deb")])
        return result

    loaded: list[str] = []
    _faked_engine(monkeypatch, loaded)
    monkeypatch.setattr(bootstrap.subprocess, "run", run)
    mirror = bootstrap.choose_mirror((tmp_path / "mirror").as_uri())
    with pytest.raises(VerlboxError) as refused:
        bootstrap.ensure_bootstrapped_base(None, Bootstrap(suite="bookworm"), mirror, Console(file=io.StringIO()))
    assert "Release.gpg" in str(refused.value), str(refused.value)  # debootstrap: failed getting the signature
    assert unpacked == [[]] and loaded == []


def test_debootstraps_warnings_are_shown_after_it_succeeds_without_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What debootstrap let pass (a W: line) is the user's to judge: shown, its other lines not, and the
    password (as written, or decoded) never. The boundary faked: the commands."""
    from rich.console import Console

    from verlbox.host.building import bootstrap
    from verlbox.host.recipes.recipe import Bootstrap

    keyring = tmp_path / "debian-archive-keyring.gpg"
    keyring.write_bytes(b"a keyring")
    real_run = subprocess.run
    said = "I: Retrieving Release\nW: [main] ci:p%2Fw@mirror.invalid ci:p/w skipped\nI: Base system installed\n"

    def run(step: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if step[0] == "debootstrap":
            (Path(step[-2]) / "etc").mkdir(parents=True)
            return subprocess.CompletedProcess(step, 0, "", said)
        return real_run(step, check=True, capture_output=True, text=True)

    loaded: list[str] = []
    _faked_engine(monkeypatch, loaded)
    monkeypatch.setattr(bootstrap, "DEBIAN_KEYRING", keyring)
    monkeypatch.setattr(bootstrap.subprocess, "run", run)
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: "/usr/sbin/" + name)
    monkeypatch.setattr(bootstrap.os, "geteuid", lambda: 0)
    output = io.StringIO()
    mirror = "https://ci:p%2Fw@mirror.invalid/debian"
    bootstrap.ensure_bootstrapped_base(None, Bootstrap(suite="bookworm"), mirror, Console(file=output, width=400))
    lines = output.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0] == "debootstrap W: [main] ci:***@mirror.invalid ci:*** skipped"
    assert re.fullmatch(
        r"made base image verlbox-base/debian:bookworm-minbase with debootstrap from https://mirror\.invalid/debian "
        r"in \d+ s",
        lines[1],
    ), lines
    assert loaded == ["verlbox-base/debian:bookworm-minbase"]
