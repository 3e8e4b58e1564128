"""Write .device/apex/ for bench/apex_gpu.sh: p40-cu124's Apex plan retargeted to ARCH, and its archive.

python bench/apex_gpu_plan.py 9.0 SOURCES_DIR
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from verlbox.host.building.sources import BuildSources
from verlbox.host.recipes.recipe import load_recipe


def main(arch: str, sources: str) -> None:
    apex = load_recipe("p40-cu124").apex
    target = Path(".device/apex")
    target.mkdir(parents=True, exist_ok=True)
    archive = BuildSources(archives=Path(sources)).archive(apex.archive_pin())
    (target / "plan.json").write_text(apex.build_plan_json([arch], archive.sha256))
    shutil.copyfile(archive.path, target / apex.archive_name)
    print(f"wrote {target}/plan.json (arch {arch}) and {apex.archive_name}")


if __name__ == "__main__":
    main(*sys.argv[1:])
