"""Recipe loading: schema errors name the file and key, extends merges and fails clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_verlbox
from verlbox.errors import RecipeError
from verlbox.host.building.plan import RECIPE_ORIGIN_LABEL, BuildPlan
from verlbox.host.recipes.recipe import RecipeHead, load_recipe, recipe_names


def write(folder: Path, name: str, data: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def child_of_p40(tmp_path: Path, **changes: object) -> Path:
    return write(tmp_path, "child", {"extends": str(REPO / "recipes" / "p40.yaml"), **changes})


def test_shipped_recipes_load_with_their_pins() -> None:
    assert recipe_names() == ["p40", "p40-cu124"]
    p40 = load_recipe("p40")
    assert p40.base.image == "nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04"
    assert p40.cudnn is not None and p40.cudnn.apt_version == "8.9.7.29-1+cuda11.8"
    assert (p40.python.version, p40.torch.version, p40.torch.index) == ("3.10", "2.6.0+cu118", "pytorch-cu118")
    assert p40.apex is not None and len(p40.apex.commit) == 40
    assert p40.vllm is not None and p40.vllm.version == "0.8.5.post1"
    assert p40.verl.version == "0.4.1" and "flash-attn" not in p40.verl.dependencies
    cu124 = load_recipe("p40-cu124")
    assert (cu124.base.image, cu124.python.version, cu124.torch.version) == ("debian:bookworm-slim", "3.11", "2.6.0")
    assert cu124.vllm is None and cu124.cudnn is None
    assert cu124.apex is not None and cu124.apex.commit == p40.apex.commit
    assert cu124.base.bootstrap is not None and cu124.base.bootstrap.suite == "bookworm"
    assert cu124.target_gpus == ["6.1"]


def test_extends_shares_the_verl_stack_and_child_keys_win(tmp_path: Path) -> None:
    child = load_recipe(child_of_p40(tmp_path, description="mine", torch={"version": "2.6.0+cu118"}))
    parent = load_recipe("p40")
    assert child.name == "child" and child.description == "mine"
    assert child.verl == parent.verl  # inherited through two levels
    # a nested mapping merges key by key: torchvision still comes from the parent
    assert child.torch.torchvision == parent.torch.torchvision
    assert child.content_hash != parent.content_hash


def test_a_recipe_counts_as_shipped_by_its_content_not_its_place(tmp_path: Path) -> None:
    """An image says whether its recipe was verlbox's shipped one of its name: init and verify hold only those
    to this verlbox's version. An edited copy keeps the shipped name (from its file name), and a file may take
    one (`name:`), but neither is the shipped recipe; an unchanged copy of the recipe and its lock is, wherever
    it lies. A copy without the lock, or locked anew, builds other packages: not the shipped recipe."""
    shipped_file = REPO / "recipes" / "p40-cu124.yaml"
    data = yaml.safe_load(shipped_file.read_text())
    lock = shipped_file.with_name("p40-cu124.lock.json").read_text()

    def copy(folder: str, lock_text: str | None, **changes: str) -> RecipeHead:
        (tmp_path / folder).mkdir()
        if lock_text is not None:
            (tmp_path / folder / "p40-cu124.lock.json").write_text(lock_text)
        return load_recipe(write(tmp_path / folder, "p40-cu124", data | changes))

    unchanged, unlocked = copy("unchanged", lock), copy("unlocked", None)
    relocked = copy("relocked", lock.replace('"', ' "', 1))  # the same lock data, other bytes: made anew
    edited = copy("edited", lock, description="my edited copy")  # the shipped lock beside it: a build refuses it
    renamed = load_recipe(write(tmp_path, "mine", data | {"name": "p40-cu124"}))
    assert edited.name == renamed.name == "p40-cu124"
    assert (load_recipe("p40-cu124").shipped, load_recipe(shipped_file).shipped, unchanged.shipped) == (True,) * 3
    assert (unlocked.shipped, relocked.shipped, edited.shipped, renamed.shipped) == (False,) * 4
    assert load_recipe(write(tmp_path, "other", data)).shipped is False  # not a shipped name at all
    assert BuildPlan(unchanged).labels[RECIPE_ORIGIN_LABEL] == "shipped"
    assert BuildPlan(renamed).labels[RECIPE_ORIGIN_LABEL] == "user"


def shipped_and_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Shipped recipes in a folder of the test's own, and the user's unchanged copy of p40-cu124 and its lock."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in ("_verl-0.4.1.yaml", "p40-cu124.yaml", "p40-cu124.lock.json"):
        (shipped / name).write_bytes((REPO / "recipes" / name).read_bytes())
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("p40-cu124.yaml", "p40-cu124.lock.json"):
        (mine / name).write_bytes((shipped / name).read_bytes())
    monkeypatch.setattr("verlbox.paths.recipes_dir", lambda: shipped)
    assert load_recipe(mine / "p40-cu124.yaml").shipped is True  # the unchanged copy, while the shipped one loads
    return shipped, mine


def test_a_shipped_recipe_that_fails_to_load_makes_the_users_copy_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken shipped recipe of the same name (an install gone wrong) is nothing to hold the user's copy to: it
    is the user's, not an error that stops their build."""
    shipped, mine = shipped_and_a_copy(tmp_path, monkeypatch)
    (shipped / "p40-cu124.yaml").write_text((shipped / "p40-cu124.yaml").read_text() + "torhc: {}\n")
    with pytest.raises(RecipeError):
        load_recipe("p40-cu124")
    assert load_recipe(mine / "p40-cu124.yaml").shipped is False


def test_an_unreadable_shipped_lock_makes_the_users_copy_their_own_and_their_own_unreadable_lock_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading fails as a permission would (the suite runs as root, which reads any mode): the shipped lock's
    failure leaves the user's build alone; a recipe's own lock's, the shipped recipe's too, is an error naming it."""
    shipped, mine = shipped_and_a_copy(tmp_path, monkeypatch)
    unreadable: set[Path] = set()
    read_bytes = Path.read_bytes

    def refusing(path: Path) -> bytes:
        if path in unreadable:
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", refusing)
    unreadable.add(shipped / "p40-cu124.lock.json")
    assert load_recipe(mine / "p40-cu124.yaml").shipped is False
    for recipe, lock in ((mine / "p40-cu124.yaml", mine), ("p40-cu124", shipped)):  # a copy's own, the shipped one's
        unreadable.clear()
        unreadable.add(lock / "p40-cu124.lock.json")
        with pytest.raises(RecipeError) as error:
            _ = load_recipe(recipe).shipped
        assert str(lock / "p40-cu124.lock.json") in str(error.value)
        assert "cannot be read (Permission denied): it must be readable by whoever runs verlbox" in str(error.value)


def test_null_removes_an_inherited_component(tmp_path: Path) -> None:
    assert load_recipe(child_of_p40(tmp_path, apex=None, vllm=None)).apex is None


@pytest.mark.parametrize(
    ("changes", "key", "expected"),
    [
        ({"torch": {"versoin": "2.6.0"}}, "torch.versoin", "unknown key"),
        ({"target_gpus": "6.1"}, "target_gpus", "list"),
        ({"python": {"version": 3.10}}, "python.version", "quoted string"),
        ({"torch": {"version": ">=2.6"}}, "torch.version", "exact version"),
        ({"vllm": {"version": "latest"}}, "vllm.version", "exact version"),
        ({"base": {"image": "debian:latest"}}, "base.image", "latest"),
        ({"apex": {"commit": "main"}}, "apex.commit", "pattern"),
        ({"verl": {"dependencies": {"ray": "*"}}}, "verl.dependencies.ray", "exact version"),
    ],
)
def test_schema_errors_name_the_file_and_key(tmp_path: Path, changes: dict, key: str, expected: str) -> None:
    path = child_of_p40(tmp_path, **changes)
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    assert error.value.key == key
    assert error.value.path == str(path)
    assert expected in error.value.problem


def test_error_in_an_inherited_key_names_the_file_it_came_from(tmp_path: Path) -> None:
    parent = write(tmp_path, "parent", {"extends": str(REPO / "recipes" / "p40.yaml"), "cuda": {"provided_by": "x"}})
    child = write(tmp_path, "child", {"extends": "parent", "description": "fine"})
    with pytest.raises(RecipeError) as error:
        load_recipe(child)
    assert (error.value.path, error.value.key) == (str(parent), "cuda.provided_by")


def test_extends_that_does_not_exist(tmp_path: Path) -> None:
    path = write(tmp_path, "child", {"extends": "no-such-recipe"})
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    assert (error.value.path, error.value.key) == (str(path), "extends")
    assert "'no-such-recipe' does not exist" in error.value.problem


def test_extends_loop(tmp_path: Path) -> None:
    write(tmp_path, "a", {"extends": "b"})
    write(tmp_path, "b", {"extends": "a"})
    with pytest.raises(RecipeError) as error:
        load_recipe(tmp_path / "a.yaml")
    assert error.value.key == "extends"
    assert "loops" in error.value.problem and "a.yaml -> b.yaml -> a.yaml" in error.value.problem


def test_cli_reports_one_clear_error_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    path = child_of_p40(tmp_path, torch={"version": ">=2.6"})
    output = tmp_path / "Dockerfile"
    result = run_verlbox("render", str(path), "-o", str(output))
    assert result.returncode == 2
    assert result.stderr.strip().startswith(f"verlbox: error: {path}: torch.version: expected an exact version")
    assert "Traceback" not in result.stderr
    assert not output.exists()


def test_cli_keeps_an_existing_output_file_on_error(tmp_path: Path) -> None:
    output = tmp_path / "Dockerfile"
    output.write_text("the user's own file\n")
    result = run_verlbox("render", str(write(tmp_path, "bad", {"extends": "bad"})), "-o", str(output))
    assert result.returncode == 2 and output.read_text() == "the user's own file\n"


def test_recipes_table_lists_both(tmp_path: Path) -> None:
    result = run_verlbox("recipes", env={"COLUMNS": "200"})
    assert result.returncode == 0
    lines = [line for line in result.stdout.splitlines() if "p40" in line]
    assert any("p40-cu124" in line and "2.6.0 " in line and "12.4" in line for line in lines)
    assert any("2.6.0+cu118" in line and "11.8" in line and "0.4.1" in line for line in lines)
