"""The `verlbox` command: host-side (recipes, render, build, shell, smoke) and image-side (train, ...)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from verlbox.errors import VerlboxError
from verlbox.files import write_atomically
from verlbox.plan import BuildPlan
from verlbox.recipe import RECIPES_DIR, load_recipe, recipe_names, resolve_recipe_path
from verlbox.render import render_dockerfile

DOCKERFILES_DIR = RECIPES_DIR.parent / "dockerfiles"

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def cmd_recipes(args: argparse.Namespace) -> int:
    table = Table("recipe", "target GPU (CC)", "CUDA", "torch", "verl", "what it is for")
    for name in recipe_names():
        recipe = load_recipe(name)
        table.add_row(
            name,
            ", ".join(recipe.target_gpus),
            f"{recipe.cuda.version} ({recipe.cuda.provided_by})",
            recipe.torch.version,
            recipe.verl.version,
            recipe.description,
        )
    out.print(table)
    return 0


def dockerfile_path(name: str) -> Path:
    return DOCKERFILES_DIR / f"{name}.Dockerfile"


def cmd_render(args: argparse.Namespace) -> int:
    if args.check or args.sync:
        stale = []
        for name in recipe_names():
            text = render_dockerfile(BuildPlan(load_recipe(name)))
            target = dockerfile_path(name)
            if target.is_file() and target.read_text() == text:
                continue
            if args.sync:
                write_atomically(target, text)
                err.print(f"wrote {target}")
            else:
                stale.append(target)
        for target in stale:
            err.print(f"{target} differs from what its recipe renders: run `verlbox render --sync`")
        return 1 if stale else 0
    if not args.recipe:
        raise VerlboxError("render needs a RECIPE (or --check / --sync)")
    text = render_dockerfile(BuildPlan(load_recipe(args.recipe), base_override=args.base_image))
    if args.output:
        write_atomically(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from verlbox.bootstrap import ensure_bootstrapped_base
    from verlbox.build import build_image, default_tag
    from verlbox.engine import client

    recipe = load_recipe(args.recipe)
    base_override = args.base_image
    if args.bootstrap_base:
        if recipe.base.bootstrap is None:
            raise VerlboxError(f"recipe {recipe.name} says nothing under base.bootstrap: it has no local base")
        base_override = ensure_bootstrapped_base(client(), recipe.base.bootstrap, err)
    plan = BuildPlan(recipe, base_override=base_override)
    tags = args.tag or [default_tag(plan)]
    result = build_image(
        plan,
        tags,
        ca_bundle=Path(args.ca_bundle) if args.ca_bundle else None,
        no_cache=args.no_cache,
        progress=args.progress,
        console=err,
    )
    err.print(f"built {', '.join(result.tags)} ({result.image_id[:19]}) in {result.seconds:.0f} s")
    return 0


def cmd_patch_verl(args: argparse.Namespace) -> int:
    from verlbox.patches import PatchState, apply

    patch_set, statuses = apply(Path(args.directory))
    pending = [s for s in statuses if s.state is PatchState.PENDING]
    if not pending:
        out.print(f"verl {patch_set.verl_version} in {args.directory}: all {len(statuses)} patches already applied")
    else:
        for status in pending:
            out.print(f"applied {status.patch.id} ({status.patch.file}, {status.patch.count}x)")
    return 0


def cmd_overrides(args: argparse.Namespace) -> int:
    from verlbox.overrides import installed_verl_config_dir
    from verlbox.profile import TrainingPlan
    from verlbox.train import verified_overrides

    plan = TrainingPlan(load_recipe(args.recipe))
    if installed_verl_config_dir() is None:
        overrides = plan.overrides
        err.print(
            "note: verl is not installed here, so these were not checked against its config "
            "(the image checks them at every start)"
        )
    else:
        overrides = verified_overrides(plan, args.extra)
    out.print("\n".join(overrides), markup=False)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from verlbox.train import image_recipe, train

    return train(
        image_recipe(args.recipe), args.overrides, dry_run=args.dry_run, gpu_memory_gib=args.gpu_memory_gib, console=err
    )


def cmd_prepare_data(args: argparse.Namespace) -> int:
    from verlbox.data import prepare_gsm8k

    written = prepare_gsm8k(Path(args.source), Path(args.out), validation_size=args.validation_size)
    for name, (rows, changed) in written.items():
        out.print(f"{Path(args.out) / name}.parquet: {rows} rows{'' if changed else ' (unchanged)'}")
    return 0


def _print_results(results: list) -> None:
    table = Table("tier", "check", "result", "detail")
    colours = {"passed": "green", "failed": "red", "skipped": "yellow"}
    for result in results:
        table.add_row(result.tier, result.name, f"[{colours[result.status]}]{result.status}[/]", result.detail)
    out.print(table)


def cmd_smoke_checks(args: argparse.Namespace) -> int:
    from verlbox.smoke import results_json, run_smoke
    from verlbox.train import image_recipe

    recipe = image_recipe(args.recipe)
    if args.json == "-":
        # verl and transformers print to stdout; keep it clean for the JSON the host reads
        sys.stdout.flush()
        json_out = os.dup(1)
        os.dup2(2, 1)
        try:
            results = run_smoke(recipe, gpu=args.gpu)
        finally:
            sys.stdout.flush()
            os.dup2(json_out, 1)
        sys.stdout.write(results_json(results) + "\n")
    else:
        results = run_smoke(recipe, gpu=args.gpu)
        if args.json:
            write_atomically(Path(args.json), results_json(results) + "\n")
        _print_results(results)
    return 1 if any(r.status == "failed" for r in results) else 0


def _image(args: argparse.Namespace) -> str:
    """--image, else the tag `verlbox build` gives the recipe's image."""
    from verlbox.build import default_tag

    return args.image or default_tag(BuildPlan(load_recipe(args.recipe)))


def cmd_smoke(args: argparse.Namespace) -> int:
    import json
    import subprocess

    from verlbox.engine import require_cli
    from verlbox.smoke import CheckResult

    image = _image(args)
    command = [require_cli(), "run", "--rm", "--shm-size", "2g"]
    command += ["--gpus", "all"] if args.gpu else []
    command += [image, "smoke-checks", "--json", "-"] + (["--gpu"] if args.gpu else [])
    with err.status(f"running smoke checks in {image}"):
        run = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        results = [CheckResult(**row) for row in json.loads(run.stdout)]
    except (json.JSONDecodeError, TypeError):
        raise VerlboxError(
            f"the smoke checks in {image} did not report (exit {run.returncode}): {run.stderr.strip()[-2000:]}"
        ) from None
    if args.json:
        write_atomically(Path(args.json), run.stdout)
    _print_results(results)
    return 1 if any(r.status == "failed" for r in results) else 0


def cmd_lock(args: argparse.Namespace) -> int:
    import subprocess

    from verlbox.engine import require_cli

    recipe = load_recipe(args.recipe)
    image = _image(args)
    run = subprocess.run(
        [require_cli(), "run", "--rm", "--entrypoint", "pip", image, "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise VerlboxError(f"pip freeze in {image} failed: {run.stderr.strip()[-1000:]}")
    # verlbox itself is installed from the build context on every build: never a constraint
    frozen = [line for line in run.stdout.splitlines() if line and not line.startswith("verlbox ")]
    target = resolve_recipe_path(args.recipe).with_name(f"{recipe.name}.lock.txt")
    header = (
        f"# pip freeze of {image} (recipe {recipe.name}, hash {recipe.content_hash[:12]}), written by\n"
        f"# `verlbox lock {recipe.name}`. Builds install with these as pip constraints.\n"
    )
    write_atomically(target, header + "\n".join(frozen) + "\n")
    err.print(f"wrote {target} ({len(frozen)} packages)")
    return 0


def cmd_shell(args: argparse.Namespace) -> int:
    from verlbox.engine import require_cli

    # compose.yaml's `train` service is the one definition of GPU, mounts, user and environment
    image = _image(args)
    compose_file = RECIPES_DIR.parent / "compose.yaml"
    command = [require_cli(), "compose", "-f", str(compose_file), "run", "--rm"]
    if args.one_command:
        command += ["--entrypoint", args.one_command[0], "train", *args.one_command[1:]]
    else:
        command += ["--entrypoint", "bash", "train"]
    environment = {"VERLBOX_IMAGE": image, "VERLBOX_UID": str(os.getuid()), "VERLBOX_GID": str(os.getgid())}
    os.execvpe(command[0], command, os.environ | environment)
    return 0  # not reached: exec replaces this process


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verlbox", description="Reproducible verl images for old GPUs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    command("recipes", cmd_recipes, "list the recipes")

    render = command("render", cmd_render, "print the Dockerfile a recipe renders")
    render.add_argument("recipe", nargs="?", help="a name under recipes/ or a path to a YAML file")
    render.add_argument("-o", "--output", help="write the Dockerfile to this file instead of stdout")
    render.add_argument("--base-image", help="replace the recipe's base image")
    render.add_argument("--check", action="store_true", help="exit 1 if dockerfiles/ differs from the recipes")
    render.add_argument("--sync", action="store_true", help="rewrite dockerfiles/ from the recipes")

    build = command("build", cmd_build, "build a recipe's image on the local Docker engine")
    build.add_argument("recipe")
    build.add_argument("--tag", "-t", action="append", help="image tag (repeatable; default verlbox/NAME:VERSION)")
    build.add_argument("--base-image", help="replace the recipe's base (a mirror, a local copy)")
    build.add_argument(
        "--bootstrap-base",
        action="store_true",
        help="make the base locally with debootstrap as the recipe's base.bootstrap says",
    )
    build.add_argument("--ca-bundle", help="extra CA bundle to trust while building (a BuildKit secret, never a layer)")
    build.add_argument("--no-cache", action="store_true")
    build.add_argument("--progress", choices=["auto", "plain"], default="auto")

    overrides = command("overrides", cmd_overrides, "print the Hydra overrides a recipe's profile passes to verl")
    overrides.add_argument("recipe")
    overrides.add_argument("extra", nargs="*", help="user overrides to merge and check, as train takes them")

    train = command("train", cmd_train, "(in the image) preflight, then verl PPO with the profile's overrides")
    train.add_argument("overrides", nargs="*", help="extra Hydra overrides (key=value); the profile's are checked too")
    train.add_argument("--recipe", help="default: the recipe the image was built from")
    train.add_argument("--dry-run", action="store_true", help="print the exact command and stop")
    train.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=float(os.environ.get("VERLBOX_GPU_MEMORY_GIB") or 0) or None,
        help="cap every process's CUDA memory (emulate a smaller GPU, e.g. 24 for a P40)",
    )

    prepare = command("prepare-data", cmd_prepare_data, "turn a local GSM8K download into verl's parquet rows")
    prepare.add_argument("dataset", choices=["gsm8k"])
    prepare.add_argument("--source", required=True, help="hub layout, datasets.save_to_disk folder, or JSONL folder")
    prepare.add_argument("--out", required=True)
    prepare.add_argument("--validation-size", type=int, default=256, help="test rows kept for validation")

    smoke = command("smoke", cmd_smoke, "run the image's smoke checks in a container and print the table")
    smoke.add_argument("recipe")
    smoke.add_argument("--image", help="default: verlbox/NAME:VERSION")
    smoke.add_argument("--gpu", action="store_true", help="also run the GPU tier (docker run --gpus all)")
    smoke.add_argument("--json", help="also write the results as JSON to this file")

    checks = command("smoke-checks", cmd_smoke_checks, "(in the image, or any env with the stack) run the checks")
    checks.add_argument("--recipe", help="default: the recipe the image was built from")
    checks.add_argument("--gpu", action="store_true")
    checks.add_argument("--json", help="write results as JSON to FILE, or to stdout with -")

    lock = command("lock", cmd_lock, "record a built image's exact packages as NAME.lock.txt beside its recipe")
    lock.add_argument("recipe")
    lock.add_argument("--image", help="default: verlbox/NAME:VERSION")

    shell = command("shell", cmd_shell, "a shell (or one command) in the image, set up as `train` is")
    shell.add_argument("recipe", nargs="?", default="p40")
    shell.add_argument("--image", help="default: verlbox/NAME:VERSION")
    shell.set_defaults(one_command=[])
    shell.epilog = "verlbox shell [RECIPE] -- CMD ARGS...  runs one command instead of bash"

    patch = command("patch-verl", cmd_patch_verl, "apply verlbox's patch set to a verl tree")
    patch.add_argument("directory", help="the folder that holds the verl/ package (e.g. site-packages)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    one_command: list[str] = []
    # argparse would take the command's first word for the optional RECIPE: split at `--` first
    if words[:1] == ["shell"] and "--" in words:
        split = words.index("--")
        words, one_command = words[:split], words[split + 1 :]
    args = _parser().parse_args(words)
    if one_command:
        args.one_command = one_command
    try:
        return args.handler(args)
    except VerlboxError as exc:
        err.print(f"verlbox: error: {exc}", markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("verlbox: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
