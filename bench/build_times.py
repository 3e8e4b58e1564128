"""Build figures for docs/benchmarks.md: render time, cold build, image size, warm rebuilds.

  python bench/build_times.py [--recipe p40-cu124] [--skip-cold | --cold-without-apex]

Cold means an empty BuildKit cache (`docker builder prune -af`, which also empties the pip and uv
cache mounts) and no previous image; the debootstrapped base is kept and timed on its own when missing.
With Apex in the recipe that includes its compile. --cold-without-apex measures the issue's "cold build,
not counting an Apex compile": the cache mounts are emptied, the `system` stage (Python, torch) and
then the `final` stage run without cache, and Apex's stage comes from the cache of an earlier build.
Warm rebuilds append a comment to the patch set or the entrypoint module, rebuild, and restore the file.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from rich.console import Console

from verlbox.host.building.bootstrap import bootstrapped_reference, choose_mirror, ensure_bootstrapped_base
from verlbox.host.building.build import BuildResult, build_image, run_buildx
from verlbox.host.building.plan import BuildPlan
from verlbox.host.building.render import render_dockerfile
from verlbox.host.building.sources import BuildSources
from verlbox.host.clients.engine import client
from verlbox.host.recipes.recipe import load_recipe

PACKAGE = Path(__file__).resolve().parents[1] / "builder" / "verlbox"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def render_ms(recipe: str, repeats: int = 50) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        render_dockerfile(BuildPlan(load_recipe(recipe)))
    return (time.perf_counter() - started) * 1000 / repeats


def bench_sources() -> BuildSources:
    # archives from $VERLBOX_SOURCES (or the default folder), as `verlbox build` finds them
    return BuildSources.from_options(str(CA_BUNDLE) if CA_BUNDLE.is_file() else None, None, None)


def build(plan: BuildPlan, tag: str, console: Console) -> BuildResult:
    return build_image(plan, [tag], sources=bench_sources(), console=console)


def report(label: str, result: BuildResult, shown: int = 6) -> None:
    ran = sorted((s for s in result.steps if s.seconds), key=lambda s: -(s.seconds or 0))
    print(f"{label}: {result.seconds:.1f} s")
    for step in ran[:shown]:
        print(f"    {step.seconds:7.1f} s  {step.name[:100]}")


def timed_buildx(plan: BuildPlan, arguments: list[str], console: Console) -> BuildResult:
    started = time.monotonic()
    steps = run_buildx(plan, arguments, sources=bench_sources(), progress="auto", console=console, what="building")
    return BuildResult("", [], time.monotonic() - started, steps)


def cold_without_apex(plan: BuildPlan, tag: str, console: Console) -> None:
    subprocess.run(["docker", "builder", "prune", "-f", "--filter", "type=exec.cachemount"], check=True)
    system = timed_buildx(plan, ["--target", "system", "--no-cache"], console)
    report("cold system stage (apt, venv, torch)", system, shown=10)
    final = timed_buildx(plan, ["--load", "--target", "final", "--no-cache-filter", "final", "--tag", tag], console)
    report("cold final stage (Apex's stage from the cache)", final, shown=12)
    compiled = [s for s in final.steps if "apex_build.py" in s.name and not s.cached]
    if compiled:
        print(f"Apex was not in the cache: the figure above includes its compile ({compiled[0].seconds} s)")
    print(f"cold build without the Apex compile: {system.seconds + final.seconds:.1f} s")


def edited_rebuild(path: Path, plan: BuildPlan, tag: str, console: Console) -> BuildResult:
    original = path.read_text()
    try:
        path.write_text(original + f"\n# benchmark edit {time.time_ns()}\n")  # unique: no cache hit
        return build(plan, tag, console)
    finally:
        path.write_text(original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", default="p40-cu124")
    runs = parser.add_mutually_exclusive_group()
    runs.add_argument("--skip-cold", action="store_true")
    runs.add_argument("--cold-without-apex", action="store_true")
    args = parser.parse_args()
    quiet = Console(stderr=True, quiet=True)
    for name in ("p40", "p40-cu124"):
        print(f"render {name}: {render_ms(name):.1f} ms (in-process, mean of 50)")
    recipe = load_recipe(args.recipe)
    engine = client()
    assert recipe.base.bootstrap is not None
    started = time.monotonic()
    had_base = any(bootstrapped_reference(recipe.base.bootstrap) in i.tags for i in engine.images.list())
    base = ensure_bootstrapped_base(engine, recipe.base.bootstrap, choose_mirror(None), quiet)
    if not had_base:
        print(f"debootstrap + docker import of the base: {time.monotonic() - started:.1f} s")
    plan = BuildPlan(recipe, base_override=base)
    tag = f"verlbox-bench/{recipe.name}:bench"
    if args.cold_without_apex:
        cold_without_apex(plan, tag, quiet)
        return
    if not args.skip_cold:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)
        subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True, check=True)
        report("cold build", cold := build(plan, tag, quiet))
        size = engine.images.get(tag).attrs["Size"] / 1e9
        print(f"image size: {size:.2f} GB ({engine.images.get(tag).attrs['Size']} bytes)")
    else:
        cold = None
    report("rebuild, nothing changed", build(plan, tag, quiet))
    for label, path in (
        ("rebuild after editing the verl patch set", PACKAGE / "runtime" / "training" / "patches" / "verl-0.4.1.yaml"),
        ("rebuild after editing the entrypoint", PACKAGE / "runtime" / "training" / "train.py"),
    ):
        result = edited_rebuild(path, plan, tag, quiet)
        share = f" ({100 * result.seconds / cold.seconds:.1f}% of the cold build)" if cold else ""
        print(f"{label}: {result.seconds:.1f} s{share}")


if __name__ == "__main__":
    main()
