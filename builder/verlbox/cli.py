"""The `verlbox` command: host-side (recipes, render, build, shell, smoke) and image-side (train, ...)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from verlbox.errors import VerlboxError
from verlbox.plan import BuildPlan
from verlbox.recipe import RECIPES_DIR, load_recipe, recipe_names
from verlbox.render import render_dockerfile

DOCKERFILES_DIR = RECIPES_DIR.parent / "dockerfiles"

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def cmd_recipes(args: argparse.Namespace) -> int:
    table = Table("recipe", "target GPU (CC)", "CUDA", "torch", "verl", "what it is for")
    for name in recipe_names():
        recipe = load_recipe(name)
        table.add_row(name, ", ".join(recipe.target_gpus), f"{recipe.cuda.version} ({recipe.cuda.provided_by})",
                      recipe.torch.version, recipe.verl.version, recipe.description)
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
                _write_atomically(target, text)
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
        _write_atomically(Path(args.output), text)
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
    result = build_image(plan, tags, ca_bundle=Path(args.ca_bundle) if args.ca_bundle else None,
                         no_cache=args.no_cache, progress=args.progress, console=err)
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
    build.add_argument("--bootstrap-base", action="store_true",
                       help="make the base locally with debootstrap as the recipe's base.bootstrap says")
    build.add_argument("--ca-bundle", help="extra CA bundle to trust while building (a BuildKit secret, never a layer)")
    build.add_argument("--no-cache", action="store_true")
    build.add_argument("--progress", choices=["auto", "plain"], default="auto")

    patch = command("patch-verl", cmd_patch_verl, "apply verlbox's patch set to a verl tree")
    patch.add_argument("directory", help="the folder that holds the verl/ package (e.g. site-packages)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
