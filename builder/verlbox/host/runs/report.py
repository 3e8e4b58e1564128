"""`verlbox report RUN_DIR`: one PNG of a run, from the metrics file `train` writes beside its checkpoints.

Four panels per step: reward (validation points on it), response length, samples per second of training
(a step's validation and save left out) with the achieved fp32 TFLOP/s per GPU against the card's peak
(utilization.py), and GPU memory reserved against the limit the run had (the cap, else the card). Every
later start of `train` and every restart of verl inside one is a dashed line at the first step it logged,
so a jump is seen with its cause.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

from verlbox.errors import UsageError
from verlbox.files import write_atomically
from verlbox.runtime.training import progress, utilization
from verlbox.runtime.training.run_record import Run, read_runs
from verlbox.runtime.training.utilization import training_seconds

REPORT_FILE = "report.png"


@dataclass(frozen=True)
class Series:
    steps: list[int]
    values: list[float]

    @classmethod
    def of(cls, points: list[tuple[int, float]]) -> Series:
        return cls([step for step, _ in points], [value for _, value in points])


@dataclass(frozen=True)
class RunReport:
    """What the picture shows, read from a run folder."""

    name: str
    reward: Series
    validation: Series
    response_length: Series
    samples_per_s: Series
    tflops_per_gpu: Series  # achieved fp32 rate (train's utilization figure), where the run recorded it
    peak_tflops: float | None  # the card's fp32 peak, where known
    memory_gib: Series
    memory_limit_gib: float | None
    restarts: list[tuple[int, str]]  # (first step after it, what it was)
    caption: str


def read_report(folder: Path) -> RunReport:
    metrics_path = folder / progress.METRICS_FILE
    if not metrics_path.is_file():
        raise UsageError(
            f"{folder}: no {progress.METRICS_FILE} (give one run's folder, checkpoints/EXPERIMENT, of a run "
            "started by this verlbox with its progress on)"
        )
    records = progress.read_metrics(metrics_path)
    if not records:
        raise UsageError(f"{metrics_path}: no step recorded yet")
    runs = read_runs(folder)
    last_by_step = {record.step: record for record in records}  # a step done again after a restart: the last
    ordered = [last_by_step[step] for step in sorted(last_by_step)]

    def series(key: str) -> Series:
        return Series.of([(r.step, r.metrics[key]) for r in ordered if key in r.metrics and r.step > 0])

    validation = [(r.step, v) for r in ordered if (v := progress.validation_reward(r.metrics)) is not None]
    samples = [
        (r.step, responses / seconds)
        for r in ordered
        if (seconds := training_seconds(r.metrics)) and (responses := samples_per_step(runs, r.at))
    ]
    last = runs[-1] if runs else None
    return RunReport(
        name=folder.name,
        reward=series(progress.REWARD),
        validation=Series.of(validation),
        response_length=series(progress.RESPONSE_LENGTH),
        samples_per_s=Series.of(samples),
        tflops_per_gpu=series(utilization.TFLOPS_PER_GPU),
        peak_tflops=utilization.PEAK_FP32_TFLOPS.get(last.gpus[0].name) if last and last.gpus else None,
        memory_gib=series(progress.MEMORY_RESERVED),
        memory_limit_gib=memory_limit(last),
        restarts=restart_marks(runs, records),
        caption=caption(last),
    )


def run_at(runs: list[Run], at: str) -> Run | None:
    """The start of `train` that logged a step at time AT."""
    started = [run for run in runs if run.started <= at]
    return started[-1] if started else None


def samples_per_step(runs: list[Run], at: str) -> int:
    run = run_at(runs, at)
    return progress.responses_per_step(run.overrides) if run else 0


def memory_limit(run: Run | None) -> float | None:
    if run is None:
        return None
    if run.memory_cap_gib:
        return run.memory_cap_gib
    return min((gpu.memory_gib for gpu in run.gpus), default=None)


def restart_marks(runs: list[Run], records: list[progress.StepRecord]) -> list[tuple[int, str]]:
    """Each later start and each restart, at the first step logged after it."""
    events = [(run.started, "start") for run in runs[1:]]
    events += [(restart.at, f"restart after {restart.after}") for run in runs for restart in run.restarts]
    marks = []
    for at, what in sorted(events):
        after = [record.step for record in records if record.at >= at]
        if after:
            marks.append((after[0], what))
    return marks


def caption(run: Run | None) -> str:
    if run is None:
        return "no run.json beside the metrics"
    gpus = f"{len(run.gpus)} x {run.gpus[0].name}" if run.gpus else "a Ray cluster"
    return f"{run.recipe} ({run.image or 'image not named'}), profile {run.profile}, {gpus}, verlbox {run.verlbox}"


def render_png(report: RunReport) -> bytes:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file, on a server as on a laptop
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(2, 2, figsize=(12, 7.5), sharex=True, constrained_layout=True)
    reward, length, speed, memory = axes.flat
    reward.plot(report.reward.steps, report.reward.values, marker=".", label="training reward (mean)")
    if report.validation.steps:
        reward.plot(report.validation.steps, report.validation.values, "o", color="tab:red", label="validation")
    reward.set_ylabel("reward")
    reward.legend(loc="best", fontsize="small")
    length.plot(report.response_length.steps, report.response_length.values, marker=".", color="tab:green")
    length.set_ylabel("response length (tokens, mean)")
    speed.plot(report.samples_per_s.steps, report.samples_per_s.values, marker=".", color="tab:purple")
    speed.set_ylabel("samples / s (without validation, saves)")
    if report.tflops_per_gpu.steps:
        rate = speed.twinx()
        rate.plot(report.tflops_per_gpu.steps, report.tflops_per_gpu.values, ".--", color="tab:brown")
        peak = f", peak {report.peak_tflops:g}" if report.peak_tflops else ""
        rate.set_ylabel(f"fp32 TFLOP/s per GPU (dashed{peak})", color="tab:brown")
        finite = [value for value in report.tflops_per_gpu.values if math.isfinite(value)]
        rate.set_ylim(0, max([report.peak_tflops or 0.0, *finite]) * 1.1 or 1.0)
    memory.plot(report.memory_gib.steps, report.memory_gib.values, marker=".", color="tab:orange", label="reserved")
    if report.memory_limit_gib:
        memory.axhline(report.memory_limit_gib, color="tab:red", linestyle=":", label="limit")
        memory.set_ylim(0, report.memory_limit_gib * 1.1)
    memory.set_ylabel("GPU memory (GiB, max per step)")
    memory.legend(loc="lower right", fontsize="small")
    for panel in axes.flat:
        panel.grid(alpha=0.3)
        for step, _ in report.restarts:
            panel.axvline(step - 0.5, color="grey", linestyle="--", linewidth=1)
        panel.xaxis.get_major_locator().set_params(integer=True)
    for step, what in report.restarts:
        reward.annotate(
            what,
            (step - 0.5, 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize="x-small",
            color="grey",
        )
    for panel in axes[1]:
        panel.set_xlabel("step")
    figure.suptitle(f"{report.name}: {report.caption}", fontsize="medium")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    pyplot.close(figure)
    return buffer.getvalue()


def write_report(folder: Path, out: Path | None) -> Path:
    target = out or folder / REPORT_FILE
    if not target.parent.is_dir():  # a typo in --out would otherwise make a tree of folders
        raise UsageError(f"--out {out}: no folder {target.parent}; make it first, or name a file in a folder")
    write_atomically(target, render_png(read_report(folder)))
    return target
