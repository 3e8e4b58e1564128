"""The host side's commands (dispatched by verlbox.cli): recipes, render, build, lock, bundle, verify, smoke."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from verlbox import paths
from verlbox.errors import UsageError, VerlboxError
from verlbox.files import write_atomically
from verlbox.host.building.build import image_for
from verlbox.host.building.plan import BuildPlan, from_users_recipe, users_recipe_note
from verlbox.host.building.render import render_dockerfile
from verlbox.host.recipes.recipe import RecipeHead, load_recipe, looks_like_path, recipe_names

if TYPE_CHECKING:
    from verlbox.host.building.context import OfflineRepository
    from verlbox.host.building.sources import BuildSources
    from verlbox.runtime.checks.smoke import CheckResult

# what an offline build cannot use: its base, packages and sources all come from the bundle
OFFLINE_CLASHES = (
    "base_image",
    "bootstrap_base",
    "apt_mirror",
    "pip_index_url",
    "torch_index_url",
    "ca_bundle",
    "sources",
    "sources_url",
)

# piped output is read by scripts and people alike: tables keep their natural width there (rich's
# default is 80 columns when stdout is no terminal, which cut recipe names)
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 400)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def recipes(args: argparse.Namespace) -> int:
    from verlbox.runtime.gpu import CUDA_MIN_DRIVER

    table = Table("recipe", "target GPU (CC)", "CUDA", "NVIDIA driver", "torch", "verl", "what it is for")
    for name in recipe_names():
        recipe = load_recipe(name)
        floors = CUDA_MIN_DRIVER.get(recipe.cuda.version)
        table.add_row(
            name,
            ", ".join(recipe.target_gpus),
            f"{recipe.cuda.version} ({recipe.cuda.provided_by})",
            # doctor's and preflight's rule: the compatibility floor runs, the full-support floor is advised;
            # each named for what it is, beside a description that may name either
            f">= {floors[0]} (full support); >= {floors[1]} through CUDA's minor-version compatibility"
            if floors
            else "unknown to verlbox",
            recipe.torch.version,
            recipe.verl.version,
            recipe.description,
        )
    out.print(table)
    return 0


def _render_all(sync: bool, names: list[str]) -> int:
    stale = []
    for name in names:
        text = render_dockerfile(BuildPlan(load_recipe(name)))
        target = paths.dockerfiles_dir() / f"{name}.Dockerfile"
        if target.is_file() and target.read_text() == text:
            continue
        if sync:
            write_atomically(target, text)
            err.print(f"wrote {target}")
        else:
            stale.append(target)
    for target in stale:
        err.print(f"{target} differs from what its recipe renders: run `verlbox render --sync`")
    if not stale and not sync:
        out.print(f"{paths.dockerfiles_dir()}: {', '.join(names)} match their recipes")
    return 1 if stale else 0


def render(args: argparse.Namespace) -> int:
    if args.check or args.sync:
        if args.recipe and args.recipe not in recipe_names():
            raise UsageError(f"--check/--sync compare shipped recipes with dockerfiles/; {args.recipe} is not one")
        return _render_all(args.sync, [args.recipe] if args.recipe else recipe_names())
    if not args.recipe:
        raise UsageError("render needs a RECIPE (or --check / --sync)")
    recipe = load_recipe(args.recipe)
    if args.offline:
        from verlbox.host.trust.bundle import bundle_folder, check_manifest, read_manifest

        bundle = bundle_folder(args.offline)
        manifest = read_manifest(bundle)
        plan = BuildPlan(recipe, base_override=manifest.base.reference, offline=True)
        check_manifest(plan, bundle, manifest)
    else:
        plan = BuildPlan(recipe, base_override=args.base_image)
    text = render_dockerfile(plan)
    if args.output:
        write_atomically(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0


def _sources(args: argparse.Namespace) -> BuildSources:
    from verlbox.host.building.sources import BuildSources

    return BuildSources.from_options(
        args.ca_bundle,
        args.pip_index_url,
        args.torch_index_url,
        apt_mirror=args.apt_mirror,
        archives=args.sources,
        archives_url=args.sources_url,
    )


def build(args: argparse.Namespace) -> int:
    from verlbox.host.building.build import build_image, check_tags, default_tag
    from verlbox.host.runs.remembered import remember_build
    from verlbox.host.trust.bundle import bundle_folder

    recipe = load_recipe(args.recipe)
    if args.check:
        return check_pins(args, recipe)
    if args.nvidia_repo_url:
        raise UsageError("--nvidia-repo-url goes with --check: a build reads the base's own NVIDIA repository")
    check_tags(args.tag or [])
    if args.skip_space_check and not args.offline:
        raise UsageError("--skip-space-check goes with --offline: only offline builds check the room first")
    repository = None
    if args.offline:
        bundle = bundle_folder(args.offline)
        (plan, repository), sources = _offline_plan(args, recipe, bundle), _sources(args)
    else:
        plan, sources, bundle = _online_plan(args, recipe), _sources(args), None
    result = build_image(
        plan,
        args.tag or [default_tag(plan)],
        sources=sources,
        bundle=bundle,
        offline_repository=repository,
        no_cache=args.no_cache,
        progress=args.progress,
        console=err,
    )
    err.print(f"built {', '.join(result.tags)} ({result.image_id[:19]}) in {result.seconds:.0f} s")
    if problem := remember_build(result.tags[0], result.image_id):
        err.print(f"note: {problem}", markup=False)
    record_build(result.tags[0], result.image_id)
    return 0


def record_build(tag: str, image_id: str) -> None:
    """The record of TAG's files that `verify` holds it to (host/trust/built.py), written unless this host has one
    of that image ID already (a build the layer cache answered whole)."""
    from verlbox.host.runs.remembered import build_records
    from verlbox.host.trust.built import read_image, record_path, write_record

    if record_path(build_records(), image_id).is_file():
        return
    started = time.monotonic()
    with err.status(f"recording {tag}'s files (read from its saved layers, for verify)"):
        try:
            path = write_record(build_records(), read_image(tag))
        except VerlboxError as exc:
            err.print(f"note: {exc}: `verlbox verify {tag}` has no record of this build to hold it to", markup=False)
            return
    err.print(f"recorded its files in {path} in {time.monotonic() - started:.0f} s")


def check_pins(args: argparse.Namespace, recipe: RecipeHead) -> int:
    from verlbox.host.trust.pins import NVIDIA_CUDA_REPOS, check_recipe, print_findings

    if args.offline or args.tag or args.no_cache or args.base_image or args.bootstrap_base:
        raise UsageError("--check builds nothing: drop --offline, --tag, --no-cache, --base-image, --bootstrap-base")
    sources = _sources(args).with_torch_index(recipe.name, recipe.torch.index)  # type: ignore[attr-defined]
    sources.check_apt_mirror_fits(recipe.name, recipe.base)
    with err.status(f"asking each upstream for the pins of {recipe.name}"):
        findings = check_recipe(
            recipe, sources, nvidia_repo_url=args.nvidia_repo_url or NVIDIA_CUDA_REPOS, timeout=args.check_timeout
        )
    return print_findings(findings, print)


def _online_plan(args: argparse.Namespace, recipe: RecipeHead) -> BuildPlan:
    from verlbox.host.building.bootstrap import choose_mirror, ensure_bootstrapped_base
    from verlbox.host.clients.engine import client
    from verlbox.host.recipes.basetree import canonical_engine_base

    sources = _sources(args).with_torch_index(recipe.name, recipe.torch.index)  # type: ignore[attr-defined]
    sources.check_apt_mirror_fits(recipe.name, recipe.base)
    if recipe.apex:  # type: ignore[attr-defined]
        sources.archive(recipe.apex.archive_pin(), err)  # type: ignore[attr-defined]
    base_override = args.base_image
    if args.bootstrap_base:
        if recipe.base.bootstrap is None:
            raise UsageError(f"recipe {recipe.name} says nothing under base.bootstrap: it has no local base")
        mirror = choose_mirror(sources.apt_mirror)
        base_override = ensure_bootstrapped_base(client(), recipe.base.bootstrap, mirror, err)
    plan = BuildPlan(recipe, base_override=base_override)
    if plan.lock is not None and plan.base_image == plan.lock.base.reference:  # the lock's base, file for file
        with err.status(f"checking base image {plan.base_image} against the lock"):
            canonical_engine_base(plan.base_image, plan.lock.base.tree, recipe.lock_path)
    return plan


def _offline_plan(args: argparse.Namespace, recipe: RecipeHead, bundle: Path) -> tuple[BuildPlan, OfflineRepository]:
    """Room for the build checked, the bundle checked file by file and its base loaded, before any step runs;
    the plan, and the apt repository its signed indexes make."""
    from verlbox.host.building.diskspace import offline_build_need, require_free_space
    from verlbox.host.clients.engine import client
    from verlbox.host.trust.bundle import (
        bundle_bytes,
        check_compiled,
        check_debs,
        check_debs_indexed,
        check_files,
        check_manifest,
        check_wheels,
        index_entries,
        load_base,
        offline_repository,
        read_manifest,
    )

    clashing = [f"--{name.replace('_', '-')}" for name in OFFLINE_CLASHES if getattr(args, name)]
    if clashing:
        raise UsageError(f"--offline builds from the bundle alone: drop {', '.join(clashing)}")
    manifest = read_manifest(bundle)
    plan = BuildPlan(recipe, base_override=manifest.base.reference, offline=True)
    check_manifest(plan, bundle, manifest)  # a bundle for another recipe or lock is bad input, before the room
    if not args.skip_space_check:
        need = offline_build_need(bundle_bytes(bundle, manifest))
        require_free_space(client(), need, f"an offline build of {recipe.name}")
    with err.status(f"checking {bundle} against its manifest"):
        check_files(bundle, manifest)
    assert plan.lock is not None  # an offline plan has a lock
    check_debs(bundle, manifest, plan.lock)  # the manifest is only an index: the lock decides the packages
    entries = index_entries(bundle, manifest)  # the bundle's Packages indexes, read once for both below
    check_debs_indexed(bundle, manifest, entries)  # each .deb's hash as Debian's signed index lists it (apt too)
    check_wheels(bundle, manifest, plan.lock)  # wheels/: the lock's files only, by the lock's sha256
    check_compiled(plan, bundle, manifest, plan.lock)  # and the compiled wheels, by sha256
    repository = offline_repository(bundle, manifest, entries)  # apt's sources, and where each .deb goes
    load_base(bundle, manifest, plan.lock, err, recipe.lock_path)
    return plan, repository


def bundle(args: argparse.Namespace) -> int:
    from verlbox.host.trust.bundle import bundle_bytes, make_bundle

    recipe = load_recipe(args.recipe)
    if recipe.base.distribution != "debian":
        raise UsageError(
            f"recipe {recipe.name} cannot be bundled: its base is {recipe.base.distribution_name}, with NVIDIA's flat "
            "CUDA repository, and an offline build checks each .deb against Debian's signed archive only"
        )
    plan = BuildPlan(recipe)
    if plan.lock is None:
        raise UsageError(f"recipe {recipe.name} has no lock ({recipe.lock_path}): build it and run `verlbox lock`")
    # the base the lock was made on: a bootstrapped base goes by its local reference
    plan = BuildPlan(recipe, base_override=plan.lock.base.reference)
    out_dir = Path(args.out)
    manifest = make_bundle(plan, out_dir, sources=_sources(args), progress=args.progress, console=err)
    size = bundle_bytes(out_dir, manifest)
    err.print(f"wrote {out_dir}: {len(manifest.files)} files, {size / 2**30:.1f} GiB, hashes in manifest.json")
    return 0


def lock(args: argparse.Namespace) -> int:
    from verlbox.host.recipes.lock import lock_from_image, lock_target, write_lock

    recipe = load_recipe(args.recipe)
    target = lock_target(recipe, Path(args.out) if args.out else None)
    if args.layers_of:
        if args.image:
            raise UsageError("--image and --layers-of: give one (--layers-of adds an offline build's layers)")
        return _lock_layers(recipe, target, args.layers_of)
    dockerfile = render_dockerfile(BuildPlan(recipe, use_lock=False))
    lock = lock_from_image(recipe.name, recipe.content_hash, dockerfile, image_for(args))
    write_lock(target, lock)
    counts = {kind: len(lock.packages(kind)) for kind in ("pip", "apt")}
    err.print(f"wrote {target} ({counts['pip']} Python files, {counts['apt']} Debian packages, hashed)")
    return 0


def _lock_layers(recipe: RecipeHead, target: Path, image: str) -> int:
    from verlbox.host.clients.engine import require_image
    from verlbox.host.recipes.lock import image_labels, read_lock, write_lock
    from verlbox.host.runs.remembered import build_records
    from verlbox.host.trust.built import identity, load_record, record_path
    from verlbox.host.trust.layers import offline_layers
    from verlbox.host.trust.verify import differences

    require_image(image, f"build it offline first: verlbox build {recipe.name} --offline BUNDLE")
    if recipe.lock_path is None or not recipe.lock_path.is_file():
        raise UsageError(f"recipe {recipe.name} has no lock ({recipe.lock_path}): run `verlbox lock` first")
    locked = read_lock(recipe.lock_path, recipe)
    labels = image_labels(image)
    if load_record(record_path(build_records(), identity(image)[0])) is None:  # before verify would read it whole
        raise UsageError(f"{image}: no record of its build on this host ({build_records()}): build it here, offline")
    if found := differences(recipe, image, labels, build_records()):
        raise UsageError(
            f"{image} differs from {recipe.lock_path} ({len(found)} difference(s); `verlbox verify {image}` names "
            f"them, the first: {found[0]}): only the layers of an image that matches its lock are recorded"
        )
    layers = offline_layers(image, locked, labels["io.verlbox.base"], build_records())
    if locked.layers and locked.layers.diff_ids != layers.diff_ids:
        kept = sum(a == b for a, b in zip(locked.layers.diff_ids, layers.diff_ids, strict=False))
        err.print(f"note: the lock's {len(locked.layers.layers)} recorded layers replaced ({kept} of them the same)")
    write_lock(target, locked.model_copy(update={"layers": layers}))
    err.print(
        f"wrote {target}: the {len(layers.layers)} layers of {image} above its base (the lock's hash is unchanged)"
    )
    return 0


def verify(args: argparse.Namespace) -> int:
    from verlbox.host.clients.engine import require_image
    from verlbox.host.recipes.lock import image_labels
    from verlbox.host.runs.remembered import build_records
    from verlbox.host.trust.verify import differences

    require_image(args.image, "check the name (`docker image ls`), or build it first: verlbox build RECIPE")
    labels = image_labels(args.image)
    reference = args.recipe or labels.get("io.verlbox.recipe")
    if not reference:
        raise UsageError(f"{args.image} names no recipe (no io.verlbox.recipe label): pass --recipe")
    if not args.recipe and from_users_recipe(labels):
        raise UsageError(f"{users_recipe_note(args.image, reference)}: pass --recipe PATH, that file")
    recipe = load_recipe(reference)
    found = differences(recipe, args.image, labels, build_records())
    for difference in found:
        out.print(difference, markup=False)
    if found:
        err.print(f"{args.image} differs from {recipe.lock_path}: {len(found)} difference(s)")
        return 1
    out.print(f"{args.image} matches {recipe.lock_path}", markup=False)
    return 0


def cpu_tier_advice(args: argparse.Namespace) -> str:
    """Where no GPU can be had: the command for the CPU tier alone, naming what the user gave that needs the
    GPU tier (--model and --learn imply it: "without --gpu" told one who never gave it)."""
    needing = [flag for flag, given in (("--gpu", args.gpu), ("--learn", args.learn), ("--model", args.model)) if given]
    command = " ".join(
        ["verlbox smoke", shlex.quote(args.recipe), *(["--image", shlex.quote(args.image)] if args.image else [])]
    )
    verb = "needs" if len(needing) == 1 else "need"
    return f"; or run the CPU tier alone: `{command}` ({' and '.join(needing)} {verb} the GPU tier)"


def smoke(args: argparse.Namespace) -> int:
    from verlbox.host.clients.engine import require_cli, require_image
    from verlbox.runtime.checks.smoke import CheckResult
    from verlbox.runtime.commands import print_results

    mounts = _real_model_mounts(args.model, args.data)
    cpu_tier = cpu_tier_advice(args)  # before --model and --learn imply the GPU tier
    args.learn = args.learn or bool(args.model)
    args.gpu = args.gpu or args.learn
    image = image_for(args)
    require_image(image, f"build it first: verlbox build {args.recipe}" + ("" if args.image else " (or pass --image)"))
    if args.gpu:
        from verlbox.host.runs.doctor import require_nvidia_runtime

        require_nvidia_runtime(cpu_tier)
    command = [require_cli(), "run", "--rm", "--shm-size", "2g"]
    command += ["--gpus", "all"] if args.gpu else []
    command += [*mounts, image, "smoke-checks", "--json", "-"]
    command += (["--gpu"] if args.gpu else []) + (["--learn"] if args.learn else [])
    command += ["--model", SMOKE_MODEL, "--data", SMOKE_DATA] if args.model else []
    with err.status(f"running smoke checks in {image}"):
        run = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        results = [CheckResult(**row) for row in json.loads(run.stdout)]
    except (json.JSONDecodeError, TypeError):
        raise VerlboxError(
            f"the smoke checks in {image} did not report (exit {run.returncode}): {run.stderr.strip()[-2000:]}"
        ) from None
    results.insert(0, _lock_check(args, image))
    report = json.dumps([asdict(r) for r in results], indent=2) + "\n"
    if args.json == "-":  # the JSON is the output; the table goes to stderr for whoever watches
        sys.stdout.write(report)
        print_results(results, err)
    else:
        if args.json:
            write_atomically(Path(args.json), report)
        print_results(results)
    return 1 if any(r.status == "failed" for r in results) else 0


# where `smoke --model` mounts the user's folders in the container (read-only)
SMOKE_MODEL, SMOKE_DATA = "/verlbox-smoke/model", "/verlbox-smoke/data"


def _real_model_mounts(model: str | None, data: str | None) -> list[str]:
    """`docker run` mounts of --model and --data (checked here: a bad folder is named before anything starts)."""
    if not model:
        if data:
            raise UsageError("--data goes with --model: it is the GSM8K folder for the run on your model")
        return []
    if not Path(model).is_dir():
        raise UsageError(f"--model {model}: no such folder")
    data_folder = Path(data) if data else _run_folder_data()
    if not data_folder.is_dir():
        raise UsageError(f"--data {data_folder}: no such folder")
    folders = {"--model": (Path(model), SMOKE_MODEL), "--data": (data_folder, SMOKE_DATA)}
    return [argument for folder, target in folders.values() for argument in ("-v", f"{folder.resolve()}:{target}:ro")]


def _run_folder_data() -> Path:
    """A run folder's GSM8K: data/gsm8k as train prepared it, else data/gsm8k-raw as `verlbox fetch data` left it
    (the image prepares that itself)."""
    for folder in (Path("data/gsm8k"), Path("data/gsm8k-raw")):
        if folder.is_dir():
            return folder
    raise UsageError(
        "no GSM8K here (neither data/gsm8k, which train prepares, nor data/gsm8k-raw): `verlbox fetch data` "
        "first (smoke prepares it in the image), or --data DIR"
    )


def _lock_check(args: argparse.Namespace, image: str) -> CheckResult:
    """Smoke's host-side row: the image against its recipe's lock (`verlbox verify`)."""
    from verlbox.host.recipes.lock import image_labels
    from verlbox.host.runs.remembered import build_records
    from verlbox.host.trust.verify import differences, other_recipe
    from verlbox.runtime.checks.smoke import CheckResult

    recipe = load_recipe(args.recipe)
    labels = image_labels(image)
    if mismatch := other_recipe(recipe.name, image, labels):  # the in-image checks would pass on its own spec
        return CheckResult("host", "image of this recipe", "failed", mismatch)
    # named by a shipped name, the image of the user's own file would be held to the shipped lock: every edit a fault
    if not looks_like_path(args.recipe) and from_users_recipe(labels):
        why = f"{users_recipe_note(image, recipe.name)}, not the shipped one: name that file's path instead"
        return CheckResult("host", "image of this recipe", "failed", why)
    if recipe.lock_path is None or not recipe.lock_path.is_file():
        return CheckResult("host", "matches its lock", "skipped", f"recipe {recipe.name} has no lock yet")
    if found := differences(recipe, image, labels, build_records()):
        return CheckResult("host", "matches its lock", "failed", "; ".join(found[:10]))
    return CheckResult("host", "matches its lock", "passed", f"verlbox verify: {recipe.lock_path.name} matches")


def overrides(args: argparse.Namespace) -> int:
    from verlbox.runtime.training.profile import Topology, TrainingPlan
    from verlbox.runtime.training.spec import baked_spec
    from verlbox.runtime.training.train import verified_overrides

    extra = list(args.extra)
    recipe = args.recipe
    if recipe and "=" in recipe:  # no recipe name holds "=": inside an image the recipe is the image's own
        extra.insert(0, recipe)
        recipe = None
    baked = baked_spec()
    profile = args.profile
    if recipe is None and baked is None:
        recipe, profile = _run_folder_recipe(profile)
    # an image carries its own recipe's spec, not the recipe files: its name is enough
    spec = baked if baked and recipe in (None, baked.name) else load_recipe(recipe).image_spec() if recipe else None
    if spec is None:
        raise UsageError("name a recipe (`verlbox overrides p40 KEY=VALUE ...`): this is not a verlbox image")
    topology = Topology(args.gpus_per_node or 1, args.nodes or 1, "given")
    plan = TrainingPlan(spec, topology=topology, profile=profile)
    # checked against the installed verl's config, else (on a host) the copy verlbox ships
    out.print("\n".join(verified_overrides(plan, extra)), markup=False)
    return 0


def _run_folder_recipe(profile: str | None) -> tuple[str | None, str | None]:
    """In a run folder: the recipe its .env's image was built from (the image's label) and its .env's profile,
    so that `verlbox overrides` there checks what `docker compose up train` would run; else (None, PROFILE)."""
    from verlbox.host.recipes.lock import image_labels
    from verlbox.host.runs.runfolder import RECIPE_LABEL
    from verlbox.run_folder import find_run_folder

    run = find_run_folder(None)
    image = run.setting("VERLBOX_IMAGE") if run else None
    if run is None or image is None:
        return None, profile
    try:
        recipe = image_labels(image).get(RECIPE_LABEL)
    except VerlboxError as exc:
        raise UsageError(f"{run.described}: cannot read {image}'s recipe ({exc}); name a recipe instead") from None
    if not recipe:
        raise UsageError(f"{run.described}: {image} carries no verlbox recipe label; name a recipe instead")
    err.print(f"{run.described}: recipe {recipe} of {image}", markup=False)
    return recipe, profile or run.setting("VERLBOX_PROFILE")


def runs(args: argparse.Namespace) -> int:
    """Every start recorded in FOLDER/*/run.json (or FOLDER/run.json), oldest first, as one table. A run
    folder is read through the checkpoints folder its .env names; a damaged record is one row saying so,
    the others are still listed, and the exit is 1."""
    from rich.table import Table

    from verlbox.runtime.training.run_record import RUN_FILE, read_runs

    folder = _checkpoints_folder(args)

    def recorded(where: Path) -> list[Path]:
        return [where] if (where / RUN_FILE).is_file() else sorted(p.parent for p in where.glob(f"*/{RUN_FILE}"))

    experiments = recorded(folder)
    if not experiments and (folder / "checkpoints").is_dir():  # a run folder whose .env is gone
        folder = folder / "checkpoints"
        experiments = recorded(folder)
        err.print(f"runs under {folder}", markup=False)
    if not experiments:
        out.print(f"no runs recorded under {folder} (a start of `train` writes EXPERIMENT/{RUN_FILE})", markup=False)
        return 0
    table = Table("experiment", "started", "ended", "outcome", "last step", "restarts", "profile", "GPUs", "model")
    damaged = 0
    for experiment in experiments:
        try:
            entries = read_runs(experiment)
        except UsageError as error:
            damaged += 1
            table.add_row(experiment.name, "-", "-", f"unreadable: {error}", "-", "-", "-", "-", "-")
            continue
        for run in entries:
            gpus = f"{len(run.gpus)} x {run.gpus[0].name}" if run.gpus else "(cluster)"
            model = f"{Path(run.model).name} {run.model_commit[:12] if run.model_commit else '(by hand)'}"
            table.add_row(
                experiment.name,
                run.started,
                run.ended or "-",
                run.outcome or "running, or ended with its container",
                "-" if run.last_step is None else str(run.last_step),
                str(len(run.restarts)),
                run.profile,
                gpus,
                model,
            )
    out.print(table)
    return 1 if damaged else 0


def _checkpoints_folder(args: argparse.Namespace) -> Path:
    """FOLDER as given; for a run folder (FOLDER, --run DIR, or the current one) the checkpoints its .env
    names (VERLBOX_CHECKPOINTS); else ./checkpoints."""
    from verlbox.run_folder import find_run_folder, is_run_folder

    if args.folder and args.run:
        raise UsageError("give a checkpoints FOLDER or --run DIR, not both")
    run = None
    if args.folder and not is_run_folder(Path(args.folder)):
        folder = Path(args.folder)
    else:
        run = find_run_folder(args.folder or args.run, named_by="" if args.folder else "--run ")
        folder = run.checkpoints if run else Path("checkpoints")
        if run is None and not folder.is_dir() and _records_runs(Path.cwd()):  # in checkpoints/ or one run's
            folder = Path.cwd()
        if run is None and not folder.is_dir():
            raise UsageError(
                f"no run folder here ({Path.cwd()} has no .env or compose.yaml) and no ./checkpoints: give a "
                "checkpoints FOLDER, or --run DIR"
            )
    if not folder.is_dir():
        raise UsageError(f"{folder}: not a folder; give the checkpoints folder of a run folder")
    if run:
        err.print(run.described, markup=False)
    return folder


def _records_runs(folder: Path) -> bool:
    """FOLDER is a checkpoints folder, or one run's in it: a start of `train` recorded there."""
    from verlbox.runtime.training.run_record import RUN_FILE

    return (folder / RUN_FILE).is_file() or any(folder.glob(f"*/{RUN_FILE}"))


def _report_folder(args: argparse.Namespace) -> Path:
    """One run's folder: FOLDER as a path, else an EXPERIMENT of the run folder, else the run that logged last."""
    from verlbox.run_folder import find_run_folder
    from verlbox.runtime.training.progress import METRICS_FILE

    named = args.folder is not None and "/" not in args.folder  # an EXPERIMENT's name, or a folder here
    if args.folder and not (args.run and named) and Path(args.folder).is_dir():
        return Path(args.folder)
    run = find_run_folder(args.run) if named or args.folder is None else None
    if run is None and args.folder is None and (Path.cwd() / METRICS_FILE).is_file():  # in checkpoints/EXPERIMENT
        return Path.cwd()
    if run is None:
        what = f"{args.folder}: not a folder" if args.folder else "no run folder here (no .env or compose.yaml)"
        raise UsageError(f"{what}; give one run's folder (checkpoints/EXPERIMENT), or --run DIR and an EXPERIMENT")
    if args.folder:
        folder = run.checkpoints / args.folder
        if not folder.is_dir():
            raise UsageError(f"{folder}: not a folder; `verlbox runs` lists the run folder's experiments")
    else:
        # the run that logged a step last: a start that failed before its first step has no metrics to draw
        logged = sorted(run.checkpoints.glob(f"*/{METRICS_FILE}"), key=lambda path: path.stat().st_mtime)
        if not logged:
            raise UsageError(f"no run under {run.checkpoints} has logged a step yet (EXPERIMENT/{METRICS_FILE})")
        folder = logged[-1].parent
    err.print(f"{run.described}, experiment {folder.name}", markup=False)
    return folder


def report(args: argparse.Namespace) -> int:
    from verlbox.host.runs.report import write_report

    folder = _report_folder(args)
    written = write_report(folder, Path(args.out) if args.out else None)
    out.print(f"wrote {written}", markup=False)
    return 0
