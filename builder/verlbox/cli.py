"""The `verlbox` command: parses arguments and hands each command to its side.

Host commands (recipes, render, build, lock, bundle, verify, smoke, overrides) live in verlbox.host.commands,
doctor, init, shell, images and clean in their own modules under verlbox.host.runs, completion in
verlbox.host.completion; image commands (train, smoke-checks, prepare-data, fetch,
patch-verl) in verlbox.runtime.commands (fetch also runs on the host). Each is
imported only when it runs, so the image never loads the host side. Every failure is one line and an
exit code (errors.py); VERLBOX_DEBUG=1 adds the traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from verlbox import __version__
from verlbox.errors import BAD_INPUT, FAILED, INTERRUPTED, UsageError, VerlboxError

err = Console(stderr=True, highlight=False, soft_wrap=True)

RUNTIME = "verlbox.runtime.commands"
# the image side's commands that a user also runs on the host
HOST_TOO = {"fetch"}

# command -> (module, function, help)
HANDLERS = {
    "recipes": ("verlbox.host.commands", "recipes", "list the shipped recipes"),
    "render": ("verlbox.host.commands", "render", "print the Dockerfile a recipe renders"),
    "build": ("verlbox.host.commands", "build", "build a recipe's image on the local Docker engine"),
    "lock": (
        "verlbox.host.commands",
        "lock",
        "record a built image's exact packages as STEM.lock.json (hashed, per step) beside its recipe",
    ),
    "bundle": (
        "verlbox.host.commands",
        "bundle",
        "collect everything a locked recipe's build needs (base, wheels, .debs, compiled Apex) for --offline",
    ),
    "verify": (
        "verlbox.host.commands",
        "verify",
        "compare a built image with its recipe's lock and every file with its build's record; name every difference",
    ),
    "images": (
        "verlbox.host.runs.images",
        "images",
        "list the verlbox images on this engine: recipe, age, size, whether current (--verify: verify each)",
    ),
    "clean": (
        "verlbox.host.runs.clean",
        "clean",
        "list (and with --yes remove) what verlbox's builds left: logs, cached sources, staging tags, cache mounts",
    ),
    "smoke": ("verlbox.host.commands", "smoke", "run the image's smoke checks in a container and print the table"),
    "shell": ("verlbox.host.runs.shell", "shell", "a shell (or one command) in the image, set up as `train` is"),
    "doctor": (
        "verlbox.host.runs.doctor",
        "doctor",
        "check this host (Docker, buildx, compose, NVIDIA runtime, GPUs, disk) and say which recipe to build",
    ),
    "init": (
        "verlbox.host.runs.runfolder",
        "init",
        "write a run folder (compose.yaml, .env, folders) for `docker compose up train`",
    ),
    "overrides": ("verlbox.host.commands", "overrides", "print the Hydra overrides a recipe's profile passes to verl"),
    "runs": ("verlbox.host.commands", "runs", "list the runs a checkpoints folder records (run.json), one row each"),
    "report": (
        "verlbox.host.commands",
        "report",
        "draw one run's reward, response length, speed and memory per step into a PNG",
    ),
    "completion": (
        "verlbox.host.completion",
        "completion",
        "print a shell completion script (bash or zsh) for verlbox's commands, options and recipes",
    ),
    "train": ("verlbox.runtime.commands", "train", "(in the image) preflight, then verl PPO with the profile"),
    "smoke-checks": (
        "verlbox.runtime.commands",
        "smoke_checks",
        "(in the image, or any env with the stack) run the checks",
    ),
    "prepare-data": (
        "verlbox.runtime.commands",
        "prepare_data",
        "turn a local GSM8K download into verl's parquet rows",
    ),
    "fetch": (
        "verlbox.runtime.commands",
        "fetch",
        "download the model or GSM8K from the Hugging Face hub into a folder, recording its revision and hashes",
    ),
    "patch-verl": ("verlbox.runtime.commands", "patch_verl", "apply verlbox's patch set to a verl tree"),
    "tensorboard": (
        "verlbox.runtime.commands",
        "tensorboard",
        "(in the image) TensorBoard over the runs' event files, saying the address it is reached at",
    ),
}

RECIPE_HELP = "a shipped recipe's name, or a path to a YAML file (with a '/' or a .yaml suffix)"

# the end of each command's --help: real command lines (tests/test_help.py parses every one)
EXAMPLES = {
    "": [
        "verlbox doctor                          # can this host build and run? which recipe to build?",
        "verlbox build p40-cu124",
        "verlbox init run && cd run && docker compose up train",
    ],
    "recipes": ["verlbox recipes"],
    "render": [
        "verlbox render p40-cu124                # the Dockerfile, to stdout",
        "verlbox render p40 -o p40.Dockerfile",
        "verlbox render --check                  # dockerfiles/ still what the recipes render?",
    ],
    "build": [
        "verlbox build p40-cu124                 # the recipe `verlbox doctor` recommends for a P40",
        "verlbox build p40 --check               # seconds: is every pin still served upstream?",
        "verlbox build p40-cu124 --offline bundle/",
    ],
    "lock": [
        "verlbox lock p40-cu124",
        "verlbox lock ./mine.yaml --image mine/p40:1",
        "verlbox lock p40-cu124 --layers-of verlbox/p40-cu124:offline",
    ],
    "bundle": ["verlbox bundle p40-cu124 --out bundle/"],
    "verify": [f"verlbox verify verlbox/p40-cu124:{__version__}", "verlbox verify mine/p40:1 --recipe ./mine.yaml"],
    "images": [
        "verlbox images",
        "verlbox images --verify                 # also verify each image (seconds each it built)",
        "verlbox images --json",
    ],
    "clean": [
        "verlbox clean                           # a dry run: what would go, and its size",
        "verlbox clean --yes",
        "verlbox clean --images --yes            # tagged images too, but not the one your .env names",
    ],
    "smoke": [
        "verlbox smoke p40-cu124",
        "verlbox smoke p40-cu124 --gpu --learn   # PPO and GRPO must learn (minutes)",
        "verlbox smoke p40-cu124 --json -",
    ],
    "shell": [
        "verlbox shell                           # bash in the run folder's image, as train runs",
        "verlbox shell p40-cu124 --no-gpu",
        "verlbox shell -- nvidia-smi             # one command instead of bash",
    ],
    "doctor": ["verlbox doctor"],
    "init": ["verlbox init run", f"verlbox init run --image verlbox/p40-cu124:{__version__}"],
    "overrides": [
        "verlbox overrides p40-cu124",
        "verlbox overrides p40-cu124 --profile grpo",
        "verlbox overrides p40-cu124 trainer.total_epochs=2 --gpus-per-node 2",
    ],
    "runs": ["verlbox runs", "verlbox runs --run ~/run", "verlbox runs checkpoints/"],
    "report": ["verlbox report", "verlbox report qwen2.5-0.5b-gsm8k-ppo --out ppo.png"],
    "completion": [
        "verlbox completion bash > ~/.local/share/bash-completion/completions/verlbox",
        "verlbox completion zsh > ~/.zfunc/_verlbox   # a folder on your $fpath",
    ],
    "train": ["verlbox train --dry-run", "verlbox train --profile grpo trainer.total_epochs=2"],
    "smoke-checks": ["verlbox smoke-checks", "verlbox smoke-checks --gpu --json -"],
    "prepare-data": ["verlbox prepare-data gsm8k --source data/gsm8k-raw --out data/gsm8k"],
    "fetch": [
        "verlbox fetch model",
        "verlbox fetch data --run ~/run",
        "verlbox fetch model --from ~/.cache/huggingface/hub   # offline: the Hugging Face cache",
    ],
    "patch-verl": ["verlbox patch-verl /opt/venv/lib/python3.11/site-packages"],
    "tensorboard": ["verlbox tensorboard --logdir /checkpoints   # what `docker compose up -d tensorboard` runs"],
}


def _examples(command: str) -> str:
    return "examples:\n" + "\n".join(f"  {example}" for example in EXAMPLES[command])


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `--imag foo` taken for `--image foo` reached compose as an image nobody asked for: whole names only
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(BAD_INPUT, f"verlbox: error: {message} (see `{self.prog} --help`)\n")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _add_build_sources(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--ca-bundle", help="extra CA bundle to trust while building (a BuildKit secret, never a layer)")
    sub.add_argument("--pip-index-url", help="pip index for this build only (default: $VERLBOX_PIP_INDEX_URL)")
    sub.add_argument(
        "--torch-index-url",
        help="URL of the wheel index a recipe's torch.index names (default: $VERLBOX_TORCH_INDEX_URL, else "
        "the index's upstream, e.g. PyTorch's own cu118 index)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="verlbox",
        description="Reproducible verl images for old GPUs.",
        epilog=_examples(""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"verlbox {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    sub = {
        name: commands.add_parser(
            name,
            help=text,
            description=text,
            epilog=_examples(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for name, (_, _, text) in HANDLERS.items()
    }

    sub["render"].add_argument("recipe", nargs="?", help=f"{RECIPE_HELP}; with --check/--sync, only this one")
    sub["render"].add_argument("-o", "--output", help="write the Dockerfile to this file instead of stdout")
    sub["render"].add_argument("--base-image", help="replace the recipe's base image")
    sub["render"].add_argument("--offline", metavar="BUNDLE", help="the Dockerfile of a build from this bundle")
    sub["render"].add_argument("--check", action="store_true", help="exit 1 if dockerfiles/ differs from the recipes")
    sub["render"].add_argument("--sync", action="store_true", help="rewrite dockerfiles/ from the recipes")

    build = sub["build"]
    build.add_argument("recipe", help=RECIPE_HELP)
    build.add_argument("--tag", "-t", action="append", help="image tag (repeatable; default verlbox/NAME:VERSION)")
    build.add_argument("--base-image", help="replace the recipe's base (a mirror, a local copy)")
    build.add_argument(
        "--bootstrap-base", action="store_true", help="make the base locally with debootstrap (recipe's base.bootstrap)"
    )
    build.add_argument(
        "--apt-mirror",
        help="Debian mirror for --bootstrap-base and Debian toolkits (default: $VERLBOX_APT_MIRROR, else the "
        "host's apt sources for the base, the base's own sources in the build)",
    )
    _add_build_sources(build)
    build.add_argument(
        "--offline",
        metavar="BUNDLE",
        help="build from a `verlbox bundle` folder: no network in any step, file times clamped to the lock's date",
    )
    build.add_argument("--no-cache", action="store_true", help="build every step again (BuildKit's --no-cache)")
    build.add_argument(
        "--check",
        action="store_true",
        help="build nothing: ask each upstream whether every pin is still served (one line each; exit 0 or 1)",
    )
    build.add_argument(
        "--nvidia-repo-url",
        help="with --check: NVIDIA's CUDA apt repositories or a mirror of them (default: NVIDIA's own)",
    )
    build.add_argument(
        "--check-timeout", type=_positive, default=20, help="with --check: seconds each upstream has to answer"
    )
    build.add_argument(
        "--skip-space-check",
        action="store_true",
        help="with --offline: start even when Docker's data folder has less free room than the build is "
        "estimated to need",
    )

    bundle = sub["bundle"]
    bundle.add_argument("recipe", help=RECIPE_HELP)
    bundle.add_argument("--out", required=True, help="a new (or empty) folder for the bundle")
    bundle.add_argument(
        "--apt-mirror", help="Debian mirror to fetch from (default: $VERLBOX_APT_MIRROR, else the base's sources)"
    )
    _add_build_sources(bundle)
    for name in ("build", "bundle"):
        sub[name].add_argument(
            "--sources",
            help="folder of pinned source archives, filled on first use (default: $VERLBOX_SOURCES, else "
            "~/.cache/verlbox/sources)",
        )
        sub[name].add_argument(
            "--sources-url",
            help="a mirror serving source archives by name (URL/NAME) instead of their upstream (default: "
            "$VERLBOX_SOURCES_URL, else GitHub's archive of the pinned commit)",
        )
        sub[name].add_argument(
            "--progress",
            choices=["auto", "plain"],
            default="auto",
            help="auto: one line per finished step; plain: BuildKit's whole log as it comes",
        )

    sub["overrides"].add_argument("recipe", nargs="?", help=f"{RECIPE_HELP} (default: in an image, its own)")
    sub["overrides"].add_argument("extra", nargs="*", help="user overrides to merge and check, as train takes them")
    for name in ("overrides", "train"):
        sub[name].add_argument(
            "--gpus-per-node", type=_positive, help="GPUs per node (default: those visible, or the Ray cluster's)"
        )
        sub[name].add_argument(
            "--nodes", type=_positive, help="nodes (default: 1, or the Ray cluster's at RAY_ADDRESS)"
        )
        sub[name].add_argument(
            "--profile", help="the training profile: p40 (PPO) or grpo (default: $VERLBOX_PROFILE, else the recipe's)"
        )

    sub["verify"].add_argument("image", help="a built image (its labels name the recipe)")
    sub["verify"].add_argument("--recipe", help=f"default: the recipe the image's labels name; {RECIPE_HELP}")
    for name in ("lock", "smoke"):
        sub[name].add_argument("recipe", help=RECIPE_HELP)
        sub[name].add_argument("--image", help="default: verlbox/NAME:VERSION")
    sub["lock"].add_argument("--out", help="write the lock here (default: beside a recipe file of yours)")
    sub["lock"].add_argument(
        "--layers-of",
        metavar="IMAGE",
        help="add to the recipe's lock the layers of IMAGE, an offline build of it made and verified on this host "
        "(the lock's hash stays): verify of an image with those layers then reads nothing",
    )
    sub["smoke"].add_argument("--gpu", action="store_true", help="also run the GPU tier (docker run --gpus all)")
    sub["smoke"].add_argument(
        "--learn",
        action="store_true",
        help="with the GPU tier (implied): PPO and GRPO must learn a tiny task (minutes)",
    )
    sub["smoke"].add_argument(
        "--model", help="implies --learn: also a short GSM8K PPO on this model folder, validated before and after"
    )
    sub["smoke"].add_argument(
        "--data",
        help="with --model: the GSM8K folder (default: ./data/gsm8k, else ./data/gsm8k-raw, prepared in the image)",
    )
    sub["smoke"].add_argument("--json", help="also write the results as JSON to FILE, or to stdout with -")

    shell = sub["shell"]
    shell.add_argument("recipe", nargs="?", help=f"{RECIPE_HELP} (default: VERLBOX_IMAGE from .env)")
    shell.add_argument("--image", help="run this image (default: the recipe's verlbox/NAME:VERSION, else .env)")
    shell.add_argument(
        "--no-gpu", action="store_true", help="start without a GPU (no NVIDIA runtime needed): inspect, smoke on CPU"
    )
    shell.set_defaults(one_command=[])

    images = sub["images"]
    images.add_argument(
        "--verify", action="store_true", help="also run `verlbox verify` on each image (seconds for each built here)"
    )
    images.add_argument("--json", action="store_true", help="print the rows as JSON (for scripts)")

    clean = sub["clean"]
    clean.add_argument("--yes", action="store_true", help="remove what is listed (default: only list it)")
    clean.add_argument(
        "--images",
        action="store_true",
        help="also the tagged verlbox images, except one a run folder's .env names (this one's, --run DIR's, or a "
        "compose project's on the engine) or a container uses",
    )
    clean.add_argument(
        "--all-build-cache",
        action="store_true",
        help="prune every BuildKit record not in use, build layers and other projects' too (`docker buildx prune "
        "--all`), not only verlbox's cache mounts",
    )

    sub["completion"].add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")

    sub["runs"].add_argument(
        "folder", nargs="?", help="a checkpoints folder, or one run's (default: the run folder's checkpoints)"
    )

    sub["report"].add_argument(
        "folder",
        nargs="?",
        help="one run's folder (checkpoints/EXPERIMENT: metrics.jsonl, run.json), or an EXPERIMENT of the run "
        "folder (default: its newest)",
    )
    sub["report"].add_argument("--out", help="the PNG to write (default: FOLDER/report.png)")

    train = sub["train"]
    train.add_argument("overrides", nargs="*", help="extra Hydra overrides (key=value); the profile's are checked too")
    train.add_argument("--recipe", help="outside an image: the recipe whose profile to use")
    train.add_argument("--dry-run", action="store_true", help="print the exact command and stop")
    train.add_argument(
        "--on-halt",
        choices=["exit", "wait"],
        help="a run that cannot go on: exit with its code (the default: one-off commands), or wait with its "
        "reason (compose's train service, which Docker would restart into the same failure)",
    )
    train.add_argument(
        "--gpu-memory-gib", help="cap every process's CUDA memory, e.g. 24 (default: $VERLBOX_GPU_MEMORY_GIB)"
    )

    checks = sub["smoke-checks"]
    checks.add_argument("--recipe", help="outside an image: the recipe to check against")
    checks.add_argument("--gpu", action="store_true", help="also run the GPU tier (CUDA, Apex, 2 PPO + 2 GRPO steps)")
    checks.add_argument(
        "--learn",
        action="store_true",
        help="with the GPU tier (implied): PPO and GRPO must learn a tiny task (minutes)",
    )
    checks.add_argument(
        "--model", help="implies --learn: also a short GSM8K PPO on this model folder, validated before and after"
    )
    checks.add_argument(
        "--data", help="with --model: the GSM8K parquet folder (default: $VERLBOX_DATA_DIR, else /data/gsm8k)"
    )
    checks.add_argument("--json", help="write results as JSON to FILE, or to stdout with -")

    prepare = sub["prepare-data"]
    prepare.add_argument("dataset", choices=["gsm8k"], help="the dataset's shape (GSM8K only, for now)")
    prepare.add_argument("--source", required=True, help="hub layout, datasets.save_to_disk folder, or JSONL folder")
    prepare.add_argument("--out", required=True, help="the folder for {train,test,validation}.parquet")
    prepare.add_argument("--validation-size", type=int, default=256, help="test rows kept for validation")
    prepare.add_argument(
        "--model",
        help="also record every prompt's length with this model's tokenizer, as `train` does on first start "
        "(train lowers data.max_prompt_length to the longest; needs transformers: the image has it)",
    )
    prepare.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="with --model: load its tokenizer as verl does with data.trust_remote_code=True (the folder's own "
        "Python code runs), so that a train run with that setting finds the lengths recorded",
    )

    init = sub["init"]
    init.add_argument("directory", nargs="?", default=".", help="the run folder (default: the current one)")
    init.add_argument(
        "--image",
        help="the image to train with (default: the one the last `verlbox build` made, else the newest verlbox "
        "image on this engine)",
    )
    init.add_argument("--force", action="store_true", help="overwrite files you changed (compose.yaml, .env)")

    fetch = sub["fetch"]
    fetch.add_argument("what", choices=["model", "data"], help="model: Qwen/Qwen2.5-0.5B-Instruct; data: openai/gsm8k")
    fetch.add_argument("--out", help="the folder to fill (default: the run folder's models/NAME, or data/gsm8k-raw)")
    fetch.add_argument("--repo", help="another hub repository (default: the profile's model, or openai/gsm8k)")
    fetch.add_argument(
        "--revision",
        help="a branch, tag or commit (default: $VERLBOX_MODEL_REVISION / $VERLBOX_DATA_REVISION, else main)",
    )
    fetch.add_argument(
        "--from",
        dest="source_folder",
        metavar="DIR",
        help="no hub: copy from a folder here, checked: one `fetch` filled, the Hugging Face cache "
        "(~/.cache/huggingface/hub, its models--ORG--NAME or a snapshot) or a plain model folder",
    )

    for name in ("shell", "fetch", "runs", "report", "clean"):
        sub[name].add_argument(
            "--run",
            metavar="DIR",
            help="the run folder to read (its .env and folders; default: the current folder, if it is one)",
        )

    sub["patch-verl"].add_argument("directory", help="the folder that holds the verl/ package (e.g. site-packages)")
    sub["tensorboard"].add_argument("--logdir", default="/checkpoints", help="the runs' folder (default /checkpoints)")
    return parser


def _unknown_command(word: str) -> UsageError:
    """A mistyped command: the nearest names, then the commands a user runs on the host (the image's own
    ones, such as train, are listed by `verlbox --help`)."""
    near = difflib.get_close_matches(word, HANDLERS, n=2, cutoff=0.6)
    guess = f" (did you mean {' or '.join(f'`verlbox {name}`' for name in near)}?)" if near else ""
    host = [name for name, (module, _, _) in HANDLERS.items() if module != RUNTIME or name in HOST_TOO]
    return UsageError(f"no command {word!r}{guess}; the commands: {', '.join(host)} (see `verlbox --help`)")


def _split_one_command(words: list[str]) -> tuple[list[str], list[str]]:
    # argparse would take the command's first word for shell's optional RECIPE: split at `--` first
    if words[:1] == ["shell"] and "--" in words:
        split = words.index("--")
        return words[:split], words[split + 1 :]
    return words, []


def main(argv: Sequence[str] | None = None) -> int:
    try:
        words, one_command = _split_one_command(list(sys.argv[1:] if argv is None else argv))
        parser = build_parser()
        if not words:  # what to do first, as `git` alone says, not a usage error
            parser.print_help()
            return 0
        if not words[0].startswith("-") and words[0] not in HANDLERS:
            raise _unknown_command(words[0])
        args = parser.parse_args(words)
        if one_command:
            args.one_command = one_command
        module, function, _ = HANDLERS[args.command]
        if module == RUNTIME and getattr(args, "recipe", None):
            # the image side reads specs, never recipe files: the host side turns a named recipe into one
            from verlbox.host.recipes.recipe import load_recipe

            args.spec = load_recipe(args.recipe).image_spec()
        return getattr(importlib.import_module(module), function)(args)
    except VerlboxError as exc:
        if os.environ.get("VERLBOX_DEBUG") == "1":
            traceback.print_exc()
        err.print(f"verlbox: error: {exc}", markup=False)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        # a command that kept something for the next attempt says where, on the same line
        err.print(f"verlbox: interrupted{f': {exc}' if str(exc) else ''}", markup=False)
        return INTERRUPTED
    except Exception as exc:  # a bug, not bad input: still one line unless asked for more
        if os.environ.get("VERLBOX_DEBUG") == "1":
            traceback.print_exc()
        err.print(
            f"verlbox: internal error: {type(exc).__name__}: {exc} (VERLBOX_DEBUG=1 shows the traceback)", markup=False
        )
        return FAILED


if __name__ == "__main__":
    sys.exit(main())
