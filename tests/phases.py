"""Where a test run's time went, in one line at its end: the slow shared fixtures (an image build, a bundle) by
their own setup time, then the tests' own time by file. CI's budget is read from this, not guessed."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator

import pytest

# a shared fixture that takes this long is a phase of its own; the rest is counted with its tests
PHASE_S = 20.0
SHOWN_FILES = 5

fixture_seconds: Counter[str] = Counter()
file_seconds: Counter[str] = Counter()
# the session's builds, step by step as `verlbox build` reports them: BuildKit's own times, the clamp's, and
# the debootstrap of a base it made
_STEP = re.compile(r"^\s+(done ([0-9.]+)s|cached)\s+(.+)$", re.MULTILINE)
_BOOTSTRAP = re.compile(r"^made base image (\S+) with debootstrap from \S+ in (\d+) s$", re.MULTILINE)
Steps = list[tuple[float | None, str]]  # (seconds, or None when cached, the step)
builds: list[tuple[str, Steps]] = []


def note_build(output: str, what: str = "image build") -> None:
    """The steps of a `verlbox build` run's output, the base's debootstrap first when the build made it."""
    steps = [(float(m[2]), f"debootstrap {m[1]}") for m in _BOOTSTRAP.finditer(output)]
    steps += [(float(m[2]) if m[2] else None, " ".join(m[3].split())) for m in _STEP.finditer(output)]
    builds.append((what, steps))


def build_summary(what: str, steps: Steps) -> str:
    ran = sorted(((seconds, step) for seconds, step in steps if seconds is not None), reverse=True)
    slow = "; ".join(f"{seconds:.0f} s {step[:70]}" for seconds, step in ran if seconds >= PHASE_S)
    cached, seconds = len(steps) - len(ran), sum(s for s, _ in ran)
    return f"{what}: {len(ran)} steps ran ({seconds:.0f} s), {cached} cached; over 20 s: {slow or 'none'}"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.monotonic()
    yield
    took = time.monotonic() - started
    if fixturedef.scope in ("session", "module", "package") and took >= PHASE_S:
        # the test that set it up (a session fixture's own node is the session, which names no file)
        user = getattr(request, "_pyfuncitem", None) or request.node
        fixture_seconds[f"{user.nodeid.split('::')[0].rsplit('/', 1)[-1]}:{fixturedef.argname}"] += took


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    file_seconds[report.nodeid.split("::")[0].rsplit("/", 1)[-1]] += report.duration


def summary() -> str:
    """One line: the phases, the files' time less the phases in them, the whole."""
    total = sum(file_seconds.values())
    phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in fixture_seconds.most_common())
    own = Counter(file_seconds)
    for name, seconds in fixture_seconds.items():  # a fixture's setup is in the report of the test that first used it
        own[name.split(":", 1)[0]] -= seconds
    files = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in own.most_common(SHOWN_FILES))
    return f"time: {total:.0f} s in all; shared fixtures: {phases or 'none over 20 s'}; slowest files besides: {files}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if file_seconds:
        terminalreporter.write_line(summary())
    for what, steps in builds:
        terminalreporter.write_line(build_summary(what, steps))
