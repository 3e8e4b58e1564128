"""Hashed locks: build records from real `pip install --report` output, requirement slices that pip
installs by hash without a resolver, and lock files that refuse to be misread."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import run_verlbox
from verlbox import paths
from verlbox.errors import UsageError
from verlbox.host.building.plan import BuildPlan
from verlbox.host.recipes.lock import Lock, lock_target, read_lock
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.steps.build_record import apt_record, pip_record, requirement_lines


@pytest.fixture(scope="module")
def six_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "six==1.16.0", "-d", str(folder)],
        check=True,
        capture_output=True,
    )
    return next(folder.glob("six-1.16.0-*.whl"))


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def test_a_real_pip_report_becomes_a_record_with_the_files_hash(six_wheel: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = pip(
        "install", "--dry-run", "--ignore-installed", "--no-index", "--find-links", str(six_wheel.parent),
        "--report", str(report), "six==1.16.0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (entry,) = pip_record(json.loads(report.read_text()))
    assert entry == {
        "name": "six",
        "version": "1.16.0",
        "file": six_wheel.name,
        "sha256": hashlib.sha256(six_wheel.read_bytes()).hexdigest(),
    }
    assert "url" not in entry  # an index or mirror URL never reaches a record


def test_a_slice_installs_by_hash_and_an_altered_hash_is_refused_naming_the_package(
    six_wheel: Path, tmp_path: Path
) -> None:
    entry = {
        "name": "six",
        "version": "1.16.0",
        "file": six_wheel.name,
        "sha256": hashlib.sha256(six_wheel.read_bytes()).hexdigest(),
    }
    requirements = tmp_path / "slice.txt"
    requirements.write_text("\n".join(requirement_lines([entry])) + "\n")
    install = ("install", "--dry-run", "--ignore-installed", "--no-deps", "--require-hashes", "--no-index")
    good = pip(*install, "--find-links", str(six_wheel.parent), "-r", str(requirements))
    assert good.returncode == 0, good.stderr
    requirements.write_text("\n".join(requirement_lines([entry | {"sha256": "0" * 64}])) + "\n")
    bad = pip(*install, "--find-links", str(six_wheel.parent), "-r", str(requirements))
    assert bad.returncode != 0 and "six==1.16.0" in bad.stderr and "0" * 64 in bad.stderr


def test_apt_records_what_a_step_added_or_changed() -> None:
    before = "base-files=12.4\nlibc6=2.36-9\n"
    after = "base-files=12.4\nlibc6=2.36-9+deb12u10\npython3=3.11.2-1+b1\n"
    assert apt_record(before, after) == [
        {"name": "libc6", "version": "2.36-9+deb12u10"},
        {"name": "python3", "version": "3.11.2-1+b1"},
    ]


def test_lock_slices_per_step_and_kind() -> None:
    lock = Lock(
        recipe="x",
        recipe_hash="e" * 64,
        base={"reference": "debian:bookworm-slim", "image_id": "sha256:" + "f" * 64},
        steps=[
            {"name": "python", "stage": "final", "apt": [{"name": "python3", "version": "3.11.2-1+b1"}]},
            {
                "name": "torch",
                "stage": "final",
                "pip": [
                    {"name": "numpy", "version": "2.4.6", "file": "n.whl", "sha256": "b" * 64},
                    {"name": "torch", "version": "2.6.0", "file": "t.whl", "sha256": "a" * 64},
                ],
            },
            {
                "name": "tools",
                "stage": "builder",
                "pip": [{"name": "ninja", "version": "1.11.1.4", "file": "x.whl", "sha256": "c" * 64}],
            },
            {
                "name": "verl-deps",
                "stage": "final",
                "pip": [{"name": "numpy", "version": "1.26.4", "file": "m.whl", "sha256": "d" * 64}],
            },
        ],
    )
    assert (
        lock.slice("torch", "pip") == f"numpy==2.4.6 --hash=sha256:{'b' * 64}\ntorch==2.6.0 --hash=sha256:{'a' * 64}\n"
    )
    assert lock.slice("python", "apt") == "python3=3.11.2-1+b1\n"
    assert lock.slice("torch", "apt") is None and lock.slice("verl", "pip") is None
    # the final image: a later step's numpy wins, and a builder stage's tools are not in it
    assert lock.packages("pip") == {"numpy": "1.26.4", "torch": "2.6.0"}


def test_a_locked_plan_mounts_each_steps_slice_only_there(tmp_path: Path) -> None:
    recipe = load_recipe("p40-cu124")
    lock = read_lock(recipe.lock_path)
    text = BuildPlan(recipe).lock_slice("torch", "pip")
    assert text is not None and "torch==2.6.0 --hash=sha256:" in text
    assert [(step.name, step.stage) for step in lock.steps] == [
        ("python", "final"),
        ("torch", "final"),
        ("apex-compiler", "builder"),
        ("apex-build-tools", "builder"),
        ("verl", "final"),
        ("verl-deps", "final"),
        ("runtime", "final"),
    ]
    from verlbox.host.building.render import render_dockerfile

    dockerfile = render_dockerfile(BuildPlan(recipe))
    torch_run = next(block for block in dockerfile.split("\nRUN ") if "steps.sh pip torch " in block)
    assert "source=verlbox-build/lock/torch.pip.txt" in torch_run and "verl-deps.pip.txt" not in torch_run


def test_a_broken_lock_file_is_one_line_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.lock.json"
    broken.write_text("{not json")
    with pytest.raises(UsageError, match="not a verlbox lock"):
        read_lock(broken)
    recipe = tmp_path / "broken.yaml"
    recipe.write_text("extends: p40-cu124\n")
    result = run_verlbox("render", str(recipe))
    assert result.returncode == 2 and "not a verlbox lock" in result.stderr and "Traceback" not in result.stderr


def test_a_lock_made_for_another_version_of_the_recipe_is_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("extends: p40-cu124\n")
    stale = read_lock(load_recipe("p40-cu124").lock_path).model_copy(update={"recipe_hash": "0" * 64})
    (tmp_path / "mine.lock.json").write_text(stale.model_dump_json())
    result = run_verlbox("render", str(recipe))
    assert result.returncode == 2 and "made for another version of recipe mine" in result.stderr


def test_lock_never_writes_into_the_installed_verlbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel install's shipped recipes live in site-packages: a lock written there would be pip's file, and
    `verify` of the same image would then read it (it failed after `lock p40` from a wheel install)."""
    installed = tmp_path / "site-packages" / "verlbox"
    (installed / "shipped" / "recipes").mkdir(parents=True)
    monkeypatch.setattr(paths, "PACKAGE_DIR", installed)
    recipe = SimpleNamespace(name="p40-cu124", lock_path=installed / "shipped" / "recipes" / "p40-cu124.lock.json")
    with pytest.raises(UsageError, match=r"p40-cu124\.lock\.json is inside the installed verlbox: copy the recipe"):
        lock_target(recipe, None)
    with pytest.raises(UsageError, match="is inside the installed verlbox"):
        lock_target(recipe, installed / "elsewhere.lock.json")
    assert lock_target(recipe, tmp_path / "mine.lock.json") == tmp_path / "mine.lock.json"
    mine = SimpleNamespace(name="mine", lock_path=tmp_path / "mine.lock.json")
    assert lock_target(mine, None) == tmp_path / "mine.lock.json"


def test_a_builder_stage_s_wheels_are_recorded_with_their_sha256_and_compared_by_verify(tmp_path: Path) -> None:
    from verlbox.host.recipes.lock import PipEntry
    from verlbox.host.trust.verify import _compiled_differences
    from verlbox.runtime.steps.compiled_record import wheel_record

    (tmp_path / "apex-0.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"compiled")
    (tmp_path / "verlbox-source.json").write_text("{}")  # not a wheel: the source record, not pinned
    [entry] = wheel_record(tmp_path)
    assert entry == {
        "name": "apex",
        "version": "0.1",
        "file": "apex-0.1-cp311-cp311-linux_x86_64.whl",
        "sha256": hashlib.sha256(b"compiled").hexdigest(),
    }
    lock = Lock.model_validate(
        json.loads((paths.shipped_root() / "recipes" / "p40-cu124.lock.json").read_text())
    ).model_copy(update={"compiled": {"apex": [PipEntry.model_validate(entry)]}})
    assert _compiled_differences(lock, {"apex": [entry]}) == []
    other = entry | {"sha256": "0" * 64}
    [differs] = _compiled_differences(lock, {"apex": [other]})
    assert differs.startswith(
        f"apex wheel {entry['file']}: lock {entry['sha256']}, image {'0' * 64} (not the lock's compile"
    )
    [absent] = _compiled_differences(lock, {})
    assert absent.startswith(f"apex wheel {entry['file']}: lock {entry['sha256']}, image absent (")
