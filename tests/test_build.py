"""The build's own reporting, without an engine: what a failed build shows of BuildKit's log."""

from __future__ import annotations

from verlbox.host.building.build import failure_excerpt

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
