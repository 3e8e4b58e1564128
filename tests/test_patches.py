"""The verl patch set, applied to the real verl 0.4.1 wheel from PyPI."""

from __future__ import annotations

import hashlib
import os
import py_compile
import re
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.runtime.training.patches import PatchError, PatchState, apply, patch_set_for, verify

PATCHED_FILES = sorted({patch.file for patch in patch_set_for("0.4.1").patches})


def digest(site: Path) -> dict[str, str]:
    return {file: hashlib.sha256((site / file).read_bytes()).hexdigest() for file in PATCHED_FILES}


def test_applies_every_patch_once_and_the_code_still_compiles(verl_tree: Path) -> None:
    patch_set, before = apply(verl_tree)
    assert {s.state for s in before} == {PatchState.PENDING}
    assert {s.state for s in verify(verl_tree, patch_set)} == {PatchState.APPLIED}
    for file in PATCHED_FILES:
        py_compile.compile(str(verl_tree / file), doraise=True)
    text = (verl_tree / "verl/workers/fsdp_workers.py").read_text()
    # the reward-model worker keeps its own (GSM8K uses a rule reward, no reward model)
    assert text.count('attn_implementation="flash_attention_2"') == 1
    assert text.index('attn_implementation="flash_attention_2"') > text.index("class RewardModelWorker")
    assert 'getattr(self.rollout_sharding_manager, "timing", {})' in text
    assert "dtype=torch.bfloat16):" not in (verl_tree / "verl/workers/actor/dp_actor.py").read_text()


def test_patched_files_get_fresh_bytecode(verl_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Images run with PYTHONDONTWRITEBYTECODE: a patched file without bytecode would compile at every import."""
    import importlib.util

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)  # timestamp .pyc: the header holds the source size
    cached = {file: Path(importlib.util.cache_from_source(str(verl_tree / file))) for file in PATCHED_FILES}
    for file, pyc in cached.items():
        py_compile.compile(str(verl_tree / file), cfile=str(pyc), doraise=True)
    apply(verl_tree)
    for file, pyc in cached.items():
        header = pyc.read_bytes()[:16]
        assert int.from_bytes(header[12:16], "little") == (verl_tree / file).stat().st_size, file


def test_stock_configuration_keeps_stock_behaviour(verl_tree: Path) -> None:
    """Every patched decision defaults to what verl did before when the config says nothing."""
    apply(verl_tree)
    from omegaconf import OmegaConf

    stock = OmegaConf.create({"fsdp_config": {}, "model": {"fsdp_config": {}}})
    for patch in patch_set_for("0.4.1").patches:
        if patch.id.endswith("autocast-follows-param-dtype") or patch.id.endswith("follows-rollout-dtype"):
            expression = patch.replace.split("autocast_on = ", 1)[1].split("  # verlbox", 1)[0]
            assert eval(expression, {"self": type("Stock", (), {"config": stock})()}) is True, patch.id
    attention_patches = [p for p in patch_set_for("0.4.1").patches if "attn_implementation=" in p.replace]
    assert len(attention_patches) == 3
    for patch in attention_patches:
        expression = attn_expression(patch.replace)
        assert "verlbox" not in expression and expression != '"flash_attention_2"', patch.id
        assert evaluate_attention(expression, chosen=None) == "flash_attention_2", patch.id
        assert evaluate_attention(expression, chosen="sdpa") == "sdpa", patch.id


def attn_expression(code: str) -> str:
    """The Python expression a patched line passes as attn_implementation= (up to its closing comma/paren)."""
    start = code.index("attn_implementation=") + len("attn_implementation=")
    depth = 0
    for end in range(start, len(code)):
        char = code[end]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return code[start:end].strip()
            depth -= 1
        elif char == "," and depth == 0:
            return code[start:end].strip()
    raise AssertionError(f"no end to the attn_implementation argument in {code!r}")


def evaluate_attention(expression: str, chosen: str | None) -> object:
    """Evaluate a patched expression as verl would: the user's choice in override config and model config."""
    override = {"attn_implementation": chosen} if chosen else {}
    model_config = type("ModelConfig", (), {"_attn_implementation": chosen})()
    names = {"override_model_config": override, "override_config": override, "model_config": model_config}
    return eval(expression, names)


def test_second_run_changes_nothing_and_says_so(verl_tree: Path) -> None:
    first = run_verlbox("patch-verl", str(verl_tree))
    assert first.returncode == 0 and first.stdout.count("applied ") == len(patch_set_for("0.4.1").patches)
    after_first = digest(verl_tree)
    second = run_verlbox("patch-verl", str(verl_tree))
    assert second.returncode == 0
    assert f"all {len(patch_set_for('0.4.1').patches)} patches already applied" in second.stdout
    assert digest(verl_tree) == after_first


def test_refuses_a_verl_version_it_has_no_patch_set_for(verl_tree: Path) -> None:
    (verl_tree / "verl/version/version").write_text("0.4.0\n")
    before = digest(verl_tree)
    result = run_verlbox("patch-verl", str(verl_tree))
    assert result.returncode == 1
    assert "no patch set for verl 0.4.0" in result.stderr and "nothing was changed" in result.stderr
    assert digest(verl_tree) == before


def test_a_moved_line_stops_everything_and_changes_nothing(verl_tree: Path) -> None:
    critic = verl_tree / "verl/workers/critic/dp_critic.py"
    critic.write_text(
        critic.read_text().replace(
            "with torch.autocast(device_type=self.device_name, dtype=torch.bfloat16):",
            "with torch.autocast(dtype=torch.bfloat16, device_type=self.device_name):",
        )
    )
    before = digest(verl_tree)
    with pytest.raises(PatchError, match="critic-autocast-follows-param-dtype: expected 1 places"):
        apply(verl_tree)
    assert digest(verl_tree) == before


def test_verify_names_a_reverted_patch(verl_tree: Path) -> None:
    patch_set, _ = apply(verl_tree)
    target = next(p for p in patch_set.patches if p.id == "hf-rollout-timing-optional")
    path = verl_tree / target.file
    path.write_text(path.read_text().replace(target.replace, target.find))
    states = {s.patch.id: s.state for s in verify(verl_tree, patch_set)}
    assert states.pop("hf-rollout-timing-optional") is PatchState.PENDING
    assert set(states.values()) == {PatchState.APPLIED}


def test_code_read_keys_are_absent_from_verls_config_but_read_by_its_code(verl_tree: Path, verl_config_dir) -> None:
    """Each key the patch set allows beyond ppo_trainer.yaml must really be read somewhere in verl."""
    apply(verl_tree)
    from omegaconf import OmegaConf

    from verlbox.runtime.training.overrides import compose

    declared = compose(verl_config_dir, [])
    by_name = {path.name: path for path in (verl_tree / "verl").rglob("*.py")}
    for key, where in patch_set_for("0.4.1").code_read_keys.items():
        assert OmegaConf.select(declared, key, default="<missing>") == "<missing>", key
        # the files the patch set says read the key: its last part must be read there, by name
        files = [by_name[name] for name in re.findall(r"[\w]+\.py", where)]
        assert files, f"{key}: the patch set names no file that reads it"
        leaf = key.rsplit(".", 1)[1]
        reads = re.compile(rf"""["']{leaf}["']|\.{leaf}\b""")
        assert any(reads.search(path.read_text()) for path in files), f"{key} is not read in {where}"


def test_a_write_that_fails_midway_leaves_every_file_as_it_was(
    verl_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = digest(verl_tree)
    real_replace = os.replace
    calls = []

    def fail_on_the_third(source: str, target: str) -> None:
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", fail_on_the_third)
    with pytest.raises(PatchError, match="nothing was changed"):
        apply(verl_tree)
    assert len(calls) == 3 and digest(verl_tree) == before
    assert not list(verl_tree.rglob(".*.verlbox-patch"))


def test_a_patched_text_that_would_not_compile_changes_no_file(tmp_path: Path) -> None:
    from verlbox.runtime.training.patches import _replace_all

    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("x = 1\n")
    bad.write_text("y = 2\n")
    with pytest.raises(PatchError, match=r"bad\.py would not compile after patching \(line 1: .*nothing was changed"):
        _replace_all({good: "x = 3\n", bad: "def broken(:\n"})
    assert good.read_text() == "x = 1\n" and bad.read_text() == "y = 2\n"
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["bad.py", "good.py"]
