"""Check Hydra overrides against verl's real ppo_trainer.yaml and what its code reads.

Hydra rejects a plain override of an undeclared key, but `+`/`++` add anything silently, and verl
0.4.1 has no schema of its own. So every key is looked up in the composed config; an undeclared one
passes only if the patch set lists it as read by verl's code. The config is the installed verl's (in
the image) or, where verl is not installed (the host), the copy verlbox ships, taken byte for byte
from the locked wheel by bench/ship_verl_config.py.
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from verlbox.errors import UsageError
from verlbox.runtime.gpu import capability_for, rollout_backend
from verlbox.runtime.training.patches import PatchSet, detect_verl_version

# verl's ppo_trainer.yaml has no defaults list, so it is all main_ppo composes
CONFIG_FILES = ("ppo_trainer.yaml",)
WHEEL_CONFIG_DIR = "verl/trainer/config"
SHIPPED_CONFIGS = Path(__file__).parent / "verl_config"
SOURCE_RECORD = "source.json"

# What the blogs set, and what verl 0.4.1 really reads instead.
REAL_KEYS = {
    "actor_rollout_ref.fsdp_config.cpu_offload": "actor_rollout_ref.actor.fsdp_config.param_offload "
    "and .optimizer_offload (critic: critic.model.fsdp_config.param_offload / .optimizer_offload)",
    "actor_rollout_ref.fsdp_config.offload_params": "actor_rollout_ref.actor.fsdp_config.param_offload "
    "(ref: actor_rollout_ref.ref.fsdp_config.param_offload; critic: critic.model.fsdp_config.param_offload)",
    "actor_rollout_ref.fsdp_config.param_offload": "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.fsdp_config.optimizer_offload": "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.model.override_config._attn_implementation": "+actor_rollout_ref.model.override_config."
    "attn_implementation (verlbox's patch set reads it for actor, ref and rollout)",
    "critic.model.override_config._attn_implementation": "+critic.model.override_config.attn_implementation",
}


class OverrideError(UsageError):
    pass


@dataclass(frozen=True)
class Override:
    raw: str
    prefix: str
    key: str
    value: str

    @classmethod
    def parse(cls, raw: str) -> Override:
        name, equals, value = raw.partition("=")
        if not equals or not name.lstrip("+~"):
            raise OverrideError(f"{raw!r} is not a Hydra override (expected key=value)")
        key = name.lstrip("+")
        return cls(raw, name[: len(name) - len(key)], key, value)


def override_value(overrides: list[str], key: str) -> str | None:
    """The value a list of overrides gives `key`, with or without a `+` (the last one wins, as in Hydra)."""
    values = [override.value for override in map(Override.parse, overrides) if override.key == key]
    return values[-1] if values else None


def merge_overrides(profile: list[str], user: list[str]) -> list[str]:
    """The user's value wins for a key the profile sets, keeping the profile's `+` where it needed one."""
    merged: dict[str, Override] = {}
    for raw in profile:
        override = Override.parse(raw)
        merged[override.key] = override
    for raw in user:
        override = Override.parse(raw)
        previous = merged.get(override.key)
        prefix = override.prefix or (previous.prefix if previous else "")
        merged[override.key] = Override(
            f"{prefix}{override.key}={override.value}", prefix, override.key, override.value
        )
    return [override.raw for override in merged.values()]


def override_int(overrides: list[str], key: str, default: int) -> int:
    """An integer the overrides give `key`; verlbox reads a few before Hydra runs, so no interpolation."""
    value = override_value(overrides, key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise OverrideError(
            f"{key}={value}: expected a whole number (verlbox reads it before Hydra would resolve it)"
        ) from None


def installed_verl_config_dir() -> Path | None:
    """verl's trainer/config folder, found without importing verl (which would import torch)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def shipped_verl_versions() -> list[str]:
    return sorted(folder.name.removeprefix("verl-") for folder in SHIPPED_CONFIGS.glob("verl-*"))


def verl_config_dir(verl_version: str) -> Path:
    """The installed verl's config when it is this version (the image), else the copy verlbox ships (the host)."""
    installed = installed_verl_config_dir()
    # a host may have some other verl installed: its keys would not be the image's
    if installed is not None and detect_verl_version(installed.parents[2]) == verl_version:
        return installed
    shipped = SHIPPED_CONFIGS / f"verl-{verl_version}"
    if not shipped.is_dir():
        raise OverrideError(
            f"verl {verl_version} is not installed here and verlbox ships no config for it "
            f"(it has: {', '.join(shipped_verl_versions())}), so the overrides cannot be checked"
        )
    return shipped


def compose(config_dir: Path, overrides: list[str]) -> object:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
            return hydra_compose(config_name="ppo_trainer", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise OverrideError(f"verl's Hydra config rejects the overrides: {exc}") from None


def check_overrides(
    raw_overrides: list[str],
    config_dir: Path,
    patch_set: PatchSet,
    target_gpu: str,
    flash_attn_installed: bool,
    vllm_kernels_for: list[str] | None = None,
) -> object:
    """Return the composed config, or raise one error that lists every problem found."""
    from omegaconf import OmegaConf

    overrides = [Override.parse(raw) for raw in raw_overrides]
    declared = compose(config_dir, [])
    missing = object()
    problems = []
    for override in overrides:
        if override.key in REAL_KEYS:
            problems.append(
                f"{override.key}: verl {patch_set.verl_version} never reads it, so it would be "
                f"silently ignored; the real key: {REAL_KEYS[override.key]}"
            )
        elif (
            OmegaConf.select(declared, override.key, default=missing) is missing
            and override.key not in patch_set.code_read_keys
        ):
            problems.append(
                f"{override.key}: verl {patch_set.verl_version} does not declare it in "
                "ppo_trainer.yaml and its code never reads it, so it would be silently ignored"
                + _did_you_mean(override.key, declared, patch_set)
            )
    problems += type_problems(declared, [override for override in overrides if override.key not in REAL_KEYS])
    if problems:
        raise OverrideError("\n".join(problems))
    config = compose(config_dir, raw_overrides)
    problems = _semantic_problems(config, overrides, target_gpu, flash_attn_installed, vllm_kernels_for)
    if problems:
        raise OverrideError("\n".join(problems))
    return config


def _kind(value: object) -> str | None:
    """The kind of a config value a type check can hold an override to (None: anything goes)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list | tuple):
        return "list"
    return None


KIND_NAMES = {"bool": "true or false", "int": "a number", "float": "a number", "list": "a list ([a,b])"}


def _did_you_mean(key: str, declared: object, patch_set: PatchSet) -> str:
    """The declared keys closest to KEY (a typo's likely meaning), as "; did you mean ...?", or nothing."""
    known = [*_leaf_keys(declared), *patch_set.code_read_keys]
    close = difflib.get_close_matches(key, known, n=2, cutoff=0.85)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _leaf_keys(config: object, prefix: str = "") -> list[str]:
    from omegaconf import DictConfig

    keys = []
    for name in config.keys() if isinstance(config, DictConfig) else []:
        path = f"{prefix}{name}"
        child = config._get_node(name)
        keys += _leaf_keys(child, f"{path}.") if isinstance(child, DictConfig) else [path]
    return keys


def type_problems(declared: object, overrides: list[Override]) -> list[str]:
    """Each override whose value, as Hydra parses it, is not of the kind ppo_trainer.yaml declares for its key
    (verl's config is plain YAML with no schema, so Hydra itself lets `trainer.total_epochs=two` through and
    verl fails hours later). A null default, a string default or an interpolation checks nothing."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    parser = OverridesParser.create()
    problems = []
    for override in overrides:
        if override.prefix == "~" or override.value.strip().startswith("${"):
            continue
        try:
            default = OmegaConf.select(declared, override.key, default=None)
            (parsed,) = parser.parse_overrides([f"{override.key}={override.value}"])
        except (HydraException, OmegaConfBaseException):
            continue  # Hydra's own compose names what is wrong with it
        if parsed.is_sweep_override():
            continue
        value = parsed.value()
        wanted, given = _kind(OmegaConf.to_object(default) if OmegaConf.is_config(default) else default), _kind(value)
        if wanted is None or value is None or given == wanted:
            continue
        if {wanted, given} <= {"int", "float"} or (wanted == "list" and isinstance(value, str)):
            # numbers pass either way (entropy_coeff: 0 and top_p: 1 are floats written whole); verl takes one
            # name where it takes a list of names (trainer.logger)
            continue
        problems.append(
            f"{override.key}={override.value}: verl's ppo_trainer.yaml declares {KIND_NAMES[wanted]} here "
            f"(default {OmegaConf.to_yaml(default).strip() if OmegaConf.is_config(default) else default!r})"
        )
    return problems


def _semantic_problems(
    config: object,
    overrides: list[Override],
    target_gpu: str,
    flash_attn_installed: bool,
    vllm_kernels_for: list[str] | None,
) -> list[str]:
    from omegaconf import OmegaConf

    def get(key: str) -> object:
        return OmegaConf.select(config, key, default=None)

    capability = capability_for(target_gpu)
    given = {override.key for override in overrides}
    problems = []
    kl_in_use = get("algorithm.use_kl_in_reward") or get("actor_rollout_ref.actor.use_kl_loss")
    if "algorithm.kl_ctrl.kl_coef" in given and not kl_in_use:
        problems.append(
            "algorithm.kl_ctrl.kl_coef: no KL is in use, so it does nothing; also set "
            "algorithm.use_kl_in_reward=True or actor_rollout_ref.actor.use_kl_loss=True"
        )
    for key in ("actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding"):
        if get(key) and not flash_attn_installed:
            problems.append(
                f"{key}=True needs flash-attn, which this image does not have (and cannot "
                f"use on compute capability {target_gpu}); keep it False"
            )
    if get("actor_rollout_ref.actor.use_torch_compile") and not capability.torch_compile:
        problems.append(
            f"actor_rollout_ref.actor.use_torch_compile=True: Triton refuses compute capability "
            f"{target_gpu} ({capability.generation}); keep it False"
        )
    if get("actor_rollout_ref.rollout.dtype") == "bfloat16" and not capability.bf16:
        problems.append(
            f"actor_rollout_ref.rollout.dtype=bfloat16: {capability.generation} GPUs have no bf16; use float32"
        )
    if get("actor_rollout_ref.rollout.name") == "vllm" and rollout_backend(target_gpu, vllm_kernels_for) != "vllm":
        problems.append(
            f"actor_rollout_ref.rollout.name=vllm: the installed vLLM has no kernels for compute "
            f'capability {target_gpu} ("no kernel image is available"); use hf'
        )
    if get("actor_rollout_ref.rollout.name") == "hf" and get("actor_rollout_ref.rollout.micro_batch_size") is None:
        problems.append(
            "actor_rollout_ref.rollout.name=hf without +actor_rollout_ref.rollout.micro_batch_size: "
            "validation would generate every prompt in one batch"
        )
    return problems
