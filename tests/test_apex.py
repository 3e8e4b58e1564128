"""Apex from a hashed archive: the build plan, the counted build patches, the archive checks, and the
fatbin reader smoke relies on (checked against cuobjdump in tests/test_image.py)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO, git_shaped_archive, run_verlbox
from standins import closed_port_url
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.render import render_dockerfile
from verlbox.host.building.sources import default_archive_dir
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.steps.apex_build import ApexBuildError, apply_build_patches, archive_commit, build
from verlbox.runtime.steps.apex_facts import apex_facts

COMMIT = "e13873debc4699d39c6861074b9a3b2a02327f92"
CLOSED_URL = closed_port_url()


def fake_archive(folder: Path, commit: str, setup_py: str) -> Path:
    return git_shaped_archive(folder, commit, {"setup.py": setup_py.encode()})


def test_both_recipes_build_the_same_apex_from_the_same_archive() -> None:
    p40, cu124 = load_recipe("p40").apex, load_recipe("p40-cu124").apex
    assert p40.commit == cu124.commit == COMMIT and p40.archive_sha256 == cu124.archive_sha256
    assert p40.toolkit is None  # the CUDA 11.8 base has its own nvcc
    assert cu124.toolkit is not None and cu124.toolkit.suite == "trixie"
    assert cu124.toolkit.packages["nvidia-cuda-toolkit"].startswith("12.4.")  # torch 2.6.0's CUDA, as setup.py insists


def test_the_apex_stage_depends_on_nothing_outside_the_apex_component(tmp_path: Path) -> None:
    """Whatever else changes, the apex-build stage's text and its context folder stay the same bytes."""
    # both beside each other in a folder without locks: a lock's apex slices are inputs of the stage too
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"extends": str(REPO / "recipes" / "p40-cu124.yaml")}))
    changed = tmp_path / "changed.yaml"
    changed.write_text(
        yaml.safe_dump(
            {
                "extends": str(REPO / "recipes" / "p40-cu124.yaml"),
                "description": "another description",
                "verl": {"dependencies": {"wandb": "0.20.0"}},
                "runtime": {"requirements": {"rich": "13.9.4"}},
            }
        )
    )

    def apex_stage(recipe: object) -> str:
        text = render_dockerfile(BuildPlan(recipe))
        return text[text.index("FROM system AS apex-build") : text.index("FROM system AS final")]

    assert apex_stage(load_recipe(base)) == apex_stage(load_recipe(changed))
    assert load_recipe(changed).apex.build_plan_json(["6.1"]) == load_recipe(base).apex.build_plan_json(["6.1"])


def test_the_plan_carries_the_archive_hash_targets_and_declared_patches() -> None:
    plan = load_recipe("p40-cu124").apex.build_plan(["6.1"])
    assert plan["commit"] == COMMIT and plan["arch_list"] == "6.1" and plan["max_jobs"] is None
    patches = ["drop-compute-70-for-cuda-13", "skip-fused-weight-gradient-mlp"]
    assert [patch["id"] for patch in plan["build_patches"]] == patches


# the extension's fixed SASS (sm_70/80/86/90/100/120) runs on 7.5 (sm_70), 8.9 (sm_86) and 9.0, on nothing older
SKIPPED_FOR = [("6.1", True), ("6.0;6.1", True), ("5.2", True), ("6.1;8.0", False), ("7.5", False), ("9.0", False)]


@pytest.mark.parametrize(("arch_list", "skipped"), SKIPPED_FOR)
def test_an_extension_is_skipped_only_when_it_would_run_on_no_target(arch_list: str, skipped: bool) -> None:
    plan = load_recipe("p40-cu124").apex.build_plan(arch_list.split(";"))
    planned = {patch["id"] for patch in plan["build_patches"]}
    assert ("skip-fused-weight-gradient-mlp" in planned) is skipped
    facts = apex_facts(COMMIT)
    built = facts.built_cuda_extensions(sorted(planned))
    assert ("fused_weight_gradient_mlp_cuda" in built) is not skipped and len(built) == 11 - skipped


def test_every_declared_patch_matches_the_real_setup_py(tmp_path: Path) -> None:
    archives = default_archive_dir(os.environ)
    archive = archives / f"apex-{COMMIT}.tar.gz"
    if not archive.is_file():
        pytest.skip(f"no Apex archive in {archives} (set VERLBOX_SOURCES; .ci/run does)")
    with tarfile.open(archive) as tar:
        member = tar.getmember(f"apex-{COMMIT}/setup.py")
        setup_py = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
    (tmp_path / "setup.py").write_text(setup_py)
    patches = [patch.model_dump() for patch in apex_facts(COMMIT).build_patches]
    assert apply_build_patches(tmp_path, patches, "13.0") == [patch["id"] for patch in patches]
    patched = (tmp_path / "setup.py").read_text()
    ast.parse(patched)
    compute_70 = "arch=compute_70,code=sm_70"  # other extensions, behind other flags, keep theirs
    assert patched.count(compute_70) == setup_py.count(compute_70) - 1
    assert patched.count("if False:  # verlbox") == 1


def test_build_patches_apply_by_cuda_version_and_count(tmp_path: Path) -> None:
    patch = apex_facts(COMMIT).build_patches[0].model_dump()
    (tmp_path / "setup.py").write_text("before\n" + patch["find"] + "after\n")
    assert apply_build_patches(tmp_path, [patch], "12.4") == []  # CUDA 12.4 still knows compute_70
    assert "compute_70" in (tmp_path / "setup.py").read_text()
    assert apply_build_patches(tmp_path, [patch], "13.0") == ["drop-compute-70-for-cuda-13"]
    assert (tmp_path / "setup.py").read_text() == "before\nafter\n"
    with pytest.raises(ApexBuildError, match=r"expected 1 places in setup\.py, found 0"):
        apply_build_patches(tmp_path, [patch], "13.0")  # a second time: the text is gone


def test_the_build_refuses_other_bytes_and_another_commit(tmp_path: Path) -> None:
    archive = fake_archive(tmp_path, "0" * 40, "print('not apex')\n")
    assert archive_commit(archive) == "0" * 40
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    plan = {"commit": COMMIT, "archive_sha256": "f" * 64, "arch_list": "6.1", "build_style": "env", "build_patches": []}
    with pytest.raises(ApexBuildError, match="but the recipe pins ffff"):
        build(plan, archive, tmp_path / "out")
    with pytest.raises(ApexBuildError, match=f"was made from commit {'0' * 40}, not {COMMIT}"):
        build(plan | {"archive_sha256": sha}, archive, tmp_path / "out")


def test_a_missing_or_altered_archive_stops_the_build_before_it_starts(tmp_path: Path) -> None:
    env = {"DOCKER_HOST": "unix:///nonexistent.sock"}
    # a missing archive is fetched (tests/test_archives.py); here from a port nothing listens on
    missing = run_verlbox("build", "p40-cu124", "--sources", str(tmp_path), "--sources-url", CLOSED_URL, env=env)
    assert missing.returncode == 1 and f"could not fetch apex-{COMMIT}.tar.gz" in missing.stderr
    assert list(tmp_path.iterdir()) == []
    fake_archive(tmp_path, COMMIT, "altered\n")
    altered = run_verlbox("build", "p40-cu124", "--sources", str(tmp_path), env=env)
    assert altered.returncode == 2 and "refusing other source bytes" in altered.stderr
    assert "Traceback" not in missing.stderr + altered.stderr


def test_the_context_carries_the_archive_plan_and_build_script_only(tmp_path: Path) -> None:
    from verlbox.host.building.context import write_context
    from verlbox.host.building.sources import BuildSources

    recipe = load_recipe("p40-cu124")
    sources_dir = tmp_path / "sources"
    sources_dir.mkdir()
    archive = fake_archive(sources_dir, COMMIT, "x\n")
    pinned = recipe.model_copy(
        update={
            "apex": recipe.apex.model_copy(update={"archive_sha256": hashlib.sha256(archive.read_bytes()).hexdigest()})
        }
    )
    pinned._source = tmp_path / "pinned.yaml"  # another recipe now: the shipped lock is not its lock
    context = tmp_path / "context"
    context.mkdir()
    write_context(BuildPlan(pinned), context, BuildSources(archives=sources_dir))
    assert sorted(p.name for p in (context / "apex").iterdir()) == sorted(["apex_build.py", archive.name, "plan.json"])
    assert json.loads((context / "apex" / "plan.json").read_text())["commit"] == COMMIT


def test_a_skip_patch_must_name_an_extension_with_fixed_architectures() -> None:
    facts = apex_facts(COMMIT).model_dump()
    facts["build_patches"][-1]["skips_extension"] = "fused_weight_gradient_mlp_cuda_typo"
    with pytest.raises(ValueError, match="skips fused_weight_gradient_mlp_cuda_typo, not in fixed_architectures"):
        type(apex_facts(COMMIT)).model_validate(facts)
