"""The verl patch set, applied to the real verl 0.4.1 wheel from PyPI."""

from __future__ import annotations

import hashlib
import py_compile
from pathlib import Path

import pytest

from conftest import run_verlbox
from verlbox.runtime.patches import PatchError, PatchState, apply, patch_set_for, verify

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


def test_stock_configuration_keeps_stock_behaviour(verl_tree: Path) -> None:
    """Every patched decision defaults to what verl did before when the config says nothing."""
    apply(verl_tree)
    from omegaconf import OmegaConf

    stock = OmegaConf.create({"fsdp_config": {}, "model": {"fsdp_config": {}}})
    for patch in patch_set_for("0.4.1").patches:
        if patch.id.endswith("autocast-follows-param-dtype") or patch.id.endswith("follows-rollout-dtype"):
            expression = patch.replace.split("autocast_on = ", 1)[1].split("  # verlbox", 1)[0]
            assert eval(expression, {"self": type("Stock", (), {"config": stock})()}) is True, patch.id
    override_config: dict = {}
    assert override_config.get("attn_implementation", "flash_attention_2") == "flash_attention_2"


def test_second_run_changes_nothing_and_says_so(verl_tree: Path) -> None:
    first = run_verlbox("patch-verl", str(verl_tree))
    assert first.returncode == 0 and first.stdout.count("applied ") == len(patch_set_for("0.4.1").patches)
    after_first = digest(verl_tree)
    second = run_verlbox("patch-verl", str(verl_tree))
    assert second.returncode == 0
    assert "all 10 patches already applied" in second.stdout
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

    from verlbox.runtime.overrides import compose

    declared = compose(verl_config_dir, [])
    sources = "".join(p.read_text() for p in (verl_tree / "verl").rglob("*.py"))
    for key in patch_set_for("0.4.1").code_read_keys:
        assert OmegaConf.select(declared, key, default="<missing>") == "<missing>", key
        assert f'"{key.rsplit(".", 1)[1]}"' in sources, key
