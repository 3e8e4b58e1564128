"""The build's own reporting: what a failed build shows of BuildKit's log, and of a base it cannot fetch."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from conftest import docker, run_verlbox
from verlbox.host.building.build import (
    StepCounts,
    _StepReporter,
    canceled,
    failure_excerpt,
    show_step,
    unreachable_registry,
)

ECHO = 'process "/bin/bash -c bash /tmp/verlbox/steps/steps.sh pip verl ..." did not complete successfully'


def test_a_failed_step_shows_its_own_output_and_error_not_the_echoed_instruction() -> None:
    log = "\n".join(
        ["#13 [final 1/6] RUN steps.sh pip verl --no-deps verl==0.4.1 \\", "#13 0.2 Resolved 1 package"]
        + [f"#14 1.{n} another step's line {n}" for n in range(30)]
        + ["#13 0.3 Hash mismatch for `verl==0.4.1`", f"#13 ERROR: {ECHO}: exit code: 1"]
        + [f"  {n} | >>> a==1 \\" for n in range(40)]
        + [f"ERROR: failed to solve: {ECHO}: exit code: 1"]
    )
    assert failure_excerpt(log).splitlines() == [
        "#13 [final 1/6] RUN steps.sh pip verl --no-deps verl==0.4.1 \\",
        "#13 0.2 Resolved 1 package",
        "#13 0.3 Hash mismatch for `verl==0.4.1`",
        "#13 ERROR: its command did not complete successfully: exit code: 1",
    ]


def test_a_step_that_fails_without_printing_still_says_why() -> None:
    error = '#7 ERROR: failed to compute cache key: "/image-spec.json": not found'
    log = f"#7 [final 4/6] COPY image-spec.json /opt/x\n{error}\n"
    assert failure_excerpt(log).splitlines() == ["#7 [final 4/6] COPY image-spec.json /opt/x", error]


def test_without_a_failed_step_the_last_lines_are_shown() -> None:
    assert failure_excerpt("no step failed\nlast line\n", lines=1) == "last line\n"


@pytest.mark.docker
def test_a_base_whose_registry_cannot_be_reached_names_bootstrap_base(docker_engine: object, sources_dir: Path) -> None:
    """Before: BuildKit's raw "failed to resolve source metadata ... dial tcp ..." excerpt. A closed local port
    stands for a registry this machine cannot reach; nothing is tagged."""
    tags_before = docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    result = run_verlbox(
        "build", "p40-cu124", "--base-image", "127.0.0.1:9/library/debian:bookworm-slim", "--tag", "verlbox-test/x:1"
    )
    assert result.returncode == 1, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("verlbox: error:")]
    assert line.startswith(
        "verlbox: error: the build of p40-cu124 could not fetch its base 127.0.0.1:9/library/debian:bookworm-slim: "
        "127.0.0.1 cannot be reached. On a machine without a registry, build with --bootstrap-base"
    ), line
    assert docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split() == tags_before


def test_the_registry_is_read_from_buildkits_words() -> None:
    lookup = (
        "ERROR: failed to solve: debian:bookworm-slim: failed to resolve source metadata for docker.io/library/"
        'debian:bookworm-slim: failed to do request: Head "https://registry-1.docker.io/v2/library/debian/'
        'manifests/bookworm-slim": dial tcp: lookup registry-1.docker.io on 127.0.0.53:53: no such host'
    )
    assert unreachable_registry(lookup) == "registry-1.docker.io"
    ipv6 = 'failed to do request: Head "https://[2600::1]/v2/": dial tcp [2600::1]:443: connect: network unreachable'
    assert unreachable_registry(ipv6) == "[2600::1]"
    assert unreachable_registry("#5 ERROR: process did not complete successfully: exit code: 1") is None


def test_an_interrupted_build_is_told_from_a_failed_one() -> None:
    """Ctrl-C reaching buildx before verlbox: "interrupted" (130), not "the build failed" with BuildKit's lines.
    A failed step cancels the steps beside it; its own error is still the last word."""
    interrupted = "#12 [apex 3/5] RUN ...\n#12 CANCELED\nERROR: failed to solve: Canceled: context canceled\n"
    failed = (
        "#12 [apex 3/5] RUN ...\n#12 CANCELED\n#9 ERROR: process did not complete successfully: exit code: 1\n"
        'ERROR: failed to solve: process "/bin/bash -c ..." did not complete successfully: exit code: 1\n'
    )
    assert canceled(interrupted) and not canceled(failed)


def test_ci_s_summary_reads_every_kind_of_step_line_verlbox_build_writes() -> None:
    """The end of a CI run lists each build by its steps (tests/phases.py): BuildKit's finished and cached steps
    as the reporter shows them, the clamp's line, and debootstrap's; a change of their wording must fail here,
    not drop them from the summary unseen."""
    import phases

    said = io.StringIO()
    console = Console(file=said, width=200)
    reporter = _StepReporter(console, verbose=False)
    for line in (
        "#5 [system 4/4] RUN steps.sh pip torch torch==2.6.0",
        "#5 DONE 33.9s",
        "#6 [final 1/6] RUN steps.sh pip verl",
        "#6 CACHED",
    ):
        reporter.feed(line)
    show_step(console, "done 118.4s", "clamping file times to SOURCE_DATE_EPOCH=1796234500")
    output = "made base image verlbox-base/debian:bookworm-minbase with debootstrap from http://m/debian in 74 s\n"
    output += said.getvalue()
    builds = len(phases.builds)
    try:
        phases.note_build(output, "a build")
        assert phases.builds[-1] == (
            "a build",
            [
                (74.0, "debootstrap verlbox-base/debian:bookworm-minbase"),
                (33.9, "[system 4/4] RUN steps.sh pip torch torch==2.6.0"),
                (None, "[final 1/6] RUN steps.sh pip verl"),
                (118.4, "clamping file times to SOURCE_DATE_EPOCH=1796234500"),
            ],
        )
        assert phases.build_summary(*phases.builds[-1]).startswith(
            "a build: 3 steps ran (226 s), 1 cached; over 20 s: 118 s clamping"
        )
    finally:
        del phases.builds[builds:]


def test_a_long_step_says_its_elapsed_time_and_downloads_in_a_pipe() -> None:
    """BuildKit's lines of a torch install as recorded: in a pipe (no status line) the running step is one line
    a minute at most, with its elapsed time and what its output counted; the finished line stays as it was."""
    said = io.StringIO()
    console = Console(file=said, width=200)  # a StringIO is no terminal: what a pipe gets
    now = [1000.0]
    reporter = _StepReporter(console, verbose=False, clock=lambda: now[0])
    for at, line in (
        (0, "#8 [system 4/4] RUN --mount=type=cache,target=/root/.cache bash /tmp/verlbox/steps/steps.sh pip torch"),
        (1, "#8 0.603   Downloading torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl (766.7 MB)"),
        (30, "#8 2.963   Downloading torchaudio-2.6.0-cp311-cp311-manylinux1_x86_64.whl (3.4 MB)"),
        (65, "#8 3.116   Downloading fsspec-2026.9.0-py3-none-any.whl (221 kB)"),
        (70, "#8 5.728      ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 664.8/664.8 MB 177.9 MB/s"),
        (100, "#8 70.10 Installing collected packages: torch, torchaudio, fsspec"),
        (130, "#8 100.4 Successfully installed torch-2.6.0"),
        (131, "#8 DONE 131.0s"),
    ):
        now[0] = 1000.0 + at
        reporter.feed(line)
    name = "[system 4/4] RUN steps.sh pip torch"
    assert said.getvalue().splitlines() == [
        f"       running  1m05s  {name}: 3 downloads (770.3 MB)",
        f"       running  2m10s  {name}: 3 downloads (770.3 MB)",
        f"   done 131.0s  {name}",
    ]
    assert reporter.running == {}


def test_apt_s_archives_and_packages_and_compiled_units_are_counted() -> None:
    apt = StepCounts()
    for text in (
        "Get:1 http://mirror.test/debian bookworm InRelease [151 kB]",
        "Get:5 http://mirror.test/debian bookworm/main amd64 python3-minimal amd64 3.11.2-1+b1 [26.3 kB]",
        "Get:6 http://mirror.test/debian bookworm/main amd64 libpython3.11 amd64 3.11.2-6 [1.9 MB]",
        "Setting up python3-minimal (3.11.2-1+b1) ...",
        "Setting up libpython3.11:amd64 (3.11.2-6) ...",
        "Processing triggers for ca-certificates (20230311+deb12u1) ...",
    ):
        apt.feed(text)
    assert apt.describe() == "3 downloads (2.1 MB), 2 packages set up"
    ninja = StepCounts()
    ninja.feed("[12/40] /usr/local/cuda/bin/nvcc -I/src/apex/csrc -c /src/apex/csrc/layer_norm_cuda_kernel.cu -o x.o")
    assert ninja.describe() == "12/40 compiled"
    plain = StepCounts()  # setuptools without ninja: one compiler run a file, the link not counted
    for text in (
        "x86_64-linux-gnu-gcc -Wno-unused-result -fPIC -Icsrc -c csrc/flatten_unflatten.cpp -o build/f.o",
        "/usr/local/cuda/bin/nvcc -Icsrc -c csrc/multi_tensor_adam.cu -o build/m.o --use_fast_math",
        "x86_64-linux-gnu-g++ -shared build/f.o build/m.o -o build/apex_C.so",
    ):
        plain.feed(text)
    assert plain.describe() == "2 compiled"


def test_on_a_terminal_the_status_line_ticks_and_shows_the_step_as_written() -> None:
    said = io.StringIO()
    console = Console(file=said, force_terminal=True, width=200)
    reporter = _StepReporter(console, verbose=False)
    with console.status("starting the build") as reporter.status:
        reporter.feed("#8 [system 4/4] RUN steps.sh pip torch")
        reporter.feed("#8 0.603   Downloading torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl (766.7 MB)")
        reporter.running["8"].started -= 75  # as if it had run 75 s: the status renders the time anew each refresh
        console.print(reporter.running["8"])
        reporter.feed("#8 DONE 75.2s")
    assert "running 1m15s  [system 4/4] RUN steps.sh pip torch: 1 downloads (766.7 MB)" in said.getvalue()
