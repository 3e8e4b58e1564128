"""The P40 profile's overrides, checked against verl 0.4.1's real Hydra config."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, run_verlbox
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training import overrides
from verlbox.runtime.training.overrides import OverrideError, check_overrides, override_value
from verlbox.runtime.training.patches import patch_set_for
from verlbox.runtime.training.profile import TrainingPlan
from verlbox.runtime.training.train import merge_overrides

PATCH_SET = patch_set_for("0.4.1")


def check(overrides: list[str], config_dir: Path, gpu: str = "6.1", vllm: list[str] | None = None) -> object:
    return check_overrides(overrides, config_dir, PATCH_SET, gpu, flash_attn_installed=False, vllm_kernels_for=vllm)


@pytest.fixture
def p40_plan() -> TrainingPlan:
    return TrainingPlan(load_recipe("p40").image_spec(), environ={})


def test_the_p40_profile_composes_with_verls_config(p40_plan: TrainingPlan, verl_config_dir: Path) -> None:
    config = check(p40_plan.overrides, verl_config_dir, vllm=load_recipe("p40").vllm.kernels_for)
    rollout, actor, critic = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor, config.critic
    assert (rollout.name, rollout.dtype, rollout.micro_batch_size, rollout.tensor_model_parallel_size) == (
        "hf",
        "float32",
        64,
        1,
    )
    assert actor.fsdp_config.mixed_precision.param_dtype == "fp32" and actor.use_torch_compile is False
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert critic.model.fsdp_config.param_offload and critic.model.fsdp_config.optimizer_offload
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert critic.model.override_config.attn_implementation == "sdpa"
    assert config.data.train_batch_size == 64 and config.data.val_files.endswith("validation.parquet")
    assert actor.ppo_mini_batch_size == 16 and actor.ppo_micro_batch_size_per_gpu == 4
    assert (config.trainer.n_gpus_per_node, config.trainer.nnodes) == (1, 1)
    assert config.trainer.resume_mode == "auto" and config.trainer.default_local_dir.startswith("/checkpoints/")
    assert config.trainer.save_freq > 0 and config.trainer.test_freq > 0
    assert not config.algorithm.use_kl_in_reward and not actor.use_kl_loss


def test_profile_values_come_from_the_capability_table_and_environment() -> None:
    plan = TrainingPlan(
        load_recipe("p40-cu124").image_spec(), environ={"VERLBOX_MODEL_DIR": "/m/qwen", "VERLBOX_DATA_DIR": "/d"}
    )
    assert override_value(plan.overrides, "actor_rollout_ref.model.path") == "/m/qwen"
    assert override_value(plan.overrides, "data.train_files") == "/d/train.parquet"
    assert override_value(plan.overrides, "actor_rollout_ref.rollout.name") == "hf"
    assert override_value(plan.overrides, "actor_rollout_ref.actor.use_torch_compile") == "False"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("++actor_rollout_ref.fsdp_config.cpu_offload=true", "the real key: actor_rollout_ref.actor.fsdp_config"),
        ("++actor_rollout_ref.fsdp_config.offload_params=true", "never reads it"),
        ("+trainer.not_a_key=1", "trainer.not_a_key: verl 0.4.1 does not declare it"),
        ("algorithm.kl_ctrl.kl_coef=0.001", "no KL is in use"),
        ("actor_rollout_ref.rollout.name=vllm", "no kernels for compute capability 6.1"),
        ("actor_rollout_ref.actor.use_torch_compile=True", "Triton refuses compute capability 6.1"),
        ("actor_rollout_ref.model.use_remove_padding=True", "needs flash-attn"),
        ("actor_rollout_ref.rollout.dtype=bfloat16", "have no bf16"),
        ("data.not_declared=1", "data.not_declared: verl 0.4.1 does not declare it"),
        ("trainer.logger=[console", "verl's Hydra config rejects the overrides"),
        ("+trainer.total_epoch=2", "it would be silently ignored; did you mean trainer.total_epochs?"),
        ("+actor_rollout_ref.rollout.graph_decod=True", "did you mean actor_rollout_ref.rollout.graph_decode?"),
    ],
)
def test_the_blogs_no_ops_and_wrong_settings_are_refused(
    p40_plan: TrainingPlan, verl_config_dir: Path, extra: str, message: str
) -> None:
    with pytest.raises(OverrideError, match=message.replace("(", r"\(").replace("'", ".")):
        check(merge_overrides(p40_plan.overrides, [extra]), verl_config_dir)


def test_kl_coef_is_fine_once_kl_is_in_use(p40_plan: TrainingPlan, verl_config_dir: Path) -> None:
    merged = merge_overrides(p40_plan.overrides, ["algorithm.kl_ctrl.kl_coef=0.001", "algorithm.use_kl_in_reward=True"])
    assert check(merged, verl_config_dir).algorithm.kl_ctrl.kl_coef == 0.001


def test_user_overrides_replace_the_profiles_value_and_keep_its_plus() -> None:
    merged = merge_overrides(["a.b=1", "+c.d=2"], ["a.b=3", "c.d=4", "e=5"])
    assert merged == ["a.b=3", "+c.d=4", "e=5"]


def test_overrides_cli_prints_exactly_the_profile_lines(verl_config_dir: Path, p40_plan: TrainingPlan) -> None:
    site = verl_config_dir.parents[2]
    result = run_verlbox("overrides", "p40", env={"PYTHONPATH": f"{site}:{Path(__file__).parents[1] / 'builder'}"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == p40_plan.overrides
    refused = run_verlbox(
        "overrides",
        "p40",
        "++actor_rollout_ref.fsdp_config.cpu_offload=true",
        env={"PYTHONPATH": f"{site}:{Path(__file__).parents[1] / 'builder'}"},
    )
    assert refused.returncode == 2 and "actor_rollout_ref.fsdp_config.cpu_offload" in refused.stderr


ISSUE_COMMAND = ("overrides", "p40", "trainer.total_epochs=2", "actor_rollout_ref.fsdp_config.param_offload=True")
REAL_KEY = "the real key: actor_rollout_ref.actor.fsdp_config.param_offload"


def without(folder: Path, *modules: str, before: str = "") -> dict[str, str]:
    """An environment where `modules` do not import: a None in sys.modules makes `import` fail and
    find_spec answer None. BEFORE goes ahead of the current PYTHONPATH (an unpacked verl, say)."""
    blocked = " = ".join(f"sys.modules[{module!r}]" for module in modules)
    (folder / "sitecustomize.py").write_text(f"import sys\n\n{blocked} = None\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), before, os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def host_without_verl(tmp_path: Path) -> dict[str, str]:
    return without(tmp_path, "verl")


def test_blocked_modules_really_do_not_import(tmp_path: Path) -> None:
    probe = "import importlib.util as u; print(u.find_spec('verl')); import docker"
    env = os.environ | without(tmp_path, "verl", "docker")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False)
    assert result.stdout == "None\n" and "ModuleNotFoundError" in result.stderr


def test_the_issues_command_is_refused_without_verl_naming_the_real_key(host_without_verl: dict[str, str]) -> None:
    result = run_verlbox(*ISSUE_COMMAND, env=host_without_verl)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("verlbox: error: actor_rollout_ref.fsdp_config.param_offload: ") and line.endswith(REAL_KEY)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("+trainer.not_a_key=1", "trainer.not_a_key: verl 0.4.1 does not declare it"),
        ("++actor_rollout_ref.fsdp_config.cpu_offload=true", "the real key: actor_rollout_ref.actor.fsdp_config"),
        ("actor_rollout_ref.rollout.dtype=bfloat16", "have no bf16"),
    ],
)
def test_unknown_and_wrong_keys_are_refused_without_verl(
    host_without_verl: dict[str, str], extra: str, message: str
) -> None:
    result = run_verlbox("overrides", "p40", extra, env=host_without_verl)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and message in result.stderr


def test_user_overrides_are_applied_and_printed_without_verl(host_without_verl: dict[str, str]) -> None:
    result = run_verlbox("overrides", "p40", "trainer.total_epochs=2", env=host_without_verl)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "trainer.total_epochs=2" in lines and "trainer.total_epochs=1" not in lines
    plan = TrainingPlan(load_recipe("p40").image_spec())  # the CLI's environment, as the subprocess has it
    assert lines == merge_overrides(plan.overrides, ["trainer.total_epochs=2"])


def test_overrides_runs_without_the_docker_sdk_as_in_the_image(verl_config_dir: Path, tmp_path: Path) -> None:
    """The image installs verlbox with --no-deps: verl is there, the docker SDK is not."""
    env = without(tmp_path, "docker", before=str(verl_config_dir.parents[2]))
    refused = run_verlbox(*ISSUE_COMMAND, env=env)
    assert refused.returncode == 2 and refused.stderr.strip().endswith(REAL_KEY), refused.stderr
    applied = run_verlbox("overrides", "p40", "trainer.total_epochs=2", env=env)
    assert applied.returncode == 0 and "trainer.total_epochs=2" in applied.stdout.splitlines(), applied.stderr


def test_the_installed_verl_config_wins_only_for_its_own_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = tmp_path / "verl" / "trainer" / "config"
    installed.mkdir(parents=True)
    version = tmp_path / "verl" / "version" / "version"
    version.parent.mkdir()
    monkeypatch.setattr(overrides, "installed_verl_config_dir", lambda: installed)
    version.write_text("0.4.1\n")
    assert overrides.verl_config_dir("0.4.1") == installed
    version.write_text("0.5.0\n")  # some other verl on a host: its keys are not the image's
    assert overrides.verl_config_dir("0.4.1") == overrides.SHIPPED_CONFIGS / "verl-0.4.1"
    monkeypatch.setattr(overrides, "installed_verl_config_dir", lambda: None)
    assert overrides.verl_config_dir("0.4.1") == overrides.SHIPPED_CONFIGS / "verl-0.4.1"
    with pytest.raises(OverrideError, match=r"verl 9\.9 is not installed here and verlbox ships no config for it"):
        overrides.verl_config_dir("9.9")


def test_the_shipped_config_is_the_locked_wheels(verl_wheel: Path, tmp_path: Path) -> None:
    """bench/ship_verl_config.py rerun on the wheel the images install gives exactly the shipped files."""
    lock = REPO / "recipes" / "p40-cu124.lock.json"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "ship_verl_config.py"),
            str(verl_wheel),
            "--lock",
            str(lock),
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    shipped = overrides.SHIPPED_CONFIGS / "verl-0.4.1"
    assert sorted(p.name for p in shipped.iterdir()) == sorted(p.name for p in (tmp_path / "verl-0.4.1").iterdir())
    for generated in (tmp_path / "verl-0.4.1").iterdir():
        assert generated.read_bytes() == (shipped / generated.name).read_bytes(), generated.name
    with zipfile.ZipFile(verl_wheel) as wheel:
        assert (shipped / "ppo_trainer.yaml").read_bytes() == wheel.read("verl/trainer/config/ppo_trainer.yaml")
    source = json.loads((shipped / "source.json").read_text())
    assert source["sha256"] == hashlib.sha256(verl_wheel.read_bytes()).hexdigest()


def test_a_value_of_the_wrong_kind_is_refused_naming_the_key_and_what_verl_declares(
    p40_plan: TrainingPlan, verl_config_dir: Path
) -> None:
    """verl's config is schema-less YAML: Hydra alone takes `trainer.total_epochs=two` and verl fails later."""
    wrong = ["trainer.total_epochs=two", "trainer.save_freq=abc", "algorithm.use_kl_in_reward=yes"]
    with pytest.raises(OverrideError) as refused:
        check([*p40_plan.overrides, *wrong], verl_config_dir)
    assert str(refused.value).splitlines() == [
        "trainer.total_epochs=two: verl's ppo_trainer.yaml declares a number here (default 30)",
        "trainer.save_freq=abc: verl's ppo_trainer.yaml declares a number here (default -1)",
        "algorithm.use_kl_in_reward=yes: verl's ppo_trainer.yaml declares true or false here (default False)",
    ]
    # the same kinds written as Hydra reads them pass: a whole number for a float, one name for a list
    # entropy_coeff and top_p are floats written whole in verl's file (0, 1): a float there is right
    right = ["trainer.total_epochs=2", "actor_rollout_ref.actor.optim.lr=1", "trainer.logger=console"]
    right += ["actor_rollout_ref.actor.entropy_coeff=0.001", "actor_rollout_ref.rollout.top_p=0.9"]
    check([*p40_plan.overrides, *right, "algorithm.use_kl_in_reward=false"], verl_config_dir)
