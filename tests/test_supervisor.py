"""The restart policy around verl: real child processes that fail fast, fail late, or are stopped by a signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verlbox.errors import RUN_HALTED, RunHalted, UsageError
from verlbox.runtime.training import supervisor
from verlbox.runtime.training.supervisor import Attempt, RestartPolicy


def counting_command(tmp_path: Path, body: str) -> list[str]:
    """A child that counts its runs in tmp_path/runs (its run number is N) and then runs BODY."""
    counter = tmp_path / "runs"
    script = (
        "import pathlib, sys, time\n"
        f"c = pathlib.Path({str(counter)!r})\n"
        "N = int(c.read_text() or 0) + 1 if c.exists() else 1\n"
        "c.write_text(str(N))\n" + body
    )
    return [sys.executable, "-c", script]


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text())


def test_a_command_that_fails_fast_halts_after_the_policy_s_failures(tmp_path: Path) -> None:
    said: list[str] = []
    prepared: list[int] = []
    policy = RestartPolicy(failures=3, window_s=60, delay_s=0)
    with pytest.raises(RunHalted) as halted:
        supervisor.supervise(
            counting_command(tmp_path, "sys.exit(7)"),
            dict(os.environ),
            policy,
            newest_step=lambda: None,
            before_restart=lambda after, step: prepared.append(1),
            say=said.append,
        )
    assert runs(tmp_path) == 3
    assert len(prepared) == 2  # the tracker is repaired before each restart, not after the last failure
    message = str(halted.value)
    assert "exit 7" in message and "3 failures within 60 s: a crash loop" in message
    assert "resumes from the start" in message
    assert halted.value.exit_code == RUN_HALTED
    assert [line.split(";")[1].strip() for line in said] == [
        "restart 1 in 0 s, resuming from the start (no complete checkpoint)",
        "restart 2 in 0 s, resuming from the start (no complete checkpoint)",
    ]


def test_a_command_that_fails_late_restarts_with_no_lifetime_budget(tmp_path: Path) -> None:
    """Failures further apart than the window, each after a new checkpoint, restart however many there are."""
    said: list[str] = []
    policy = RestartPolicy(failures=2, window_s=0.5, delay_s=0)
    code = supervisor.supervise(
        counting_command(tmp_path, "time.sleep(0.7)\nsys.exit(0 if N == 5 else 1)"),
        dict(os.environ),
        policy,
        newest_step=lambda: runs(tmp_path) * 10 if (tmp_path / "runs").exists() else None,
        before_restart=lambda after, step: None,
        say=said.append,
    )
    assert code == 0
    assert runs(tmp_path) == 5  # four failures, twice the policy's count, and none halted the run
    assert len(said) == 4 and said[-1].endswith("restart 4 in 0 s, resuming from global_step_40")


def test_late_failures_that_never_save_halt_as_a_loop(tmp_path: Path) -> None:
    policy = RestartPolicy(failures=3, window_s=0.2, delay_s=0)
    with pytest.raises(RunHalted, match="3 failures in a row, none after a new checkpoint") as halted:
        supervisor.supervise(
            counting_command(tmp_path, "time.sleep(0.3)\nsys.exit(1)"),
            dict(os.environ),
            policy,
            newest_step=lambda: 25,
            before_restart=lambda after, step: None,
            say=lambda _: None,
        )
    assert runs(tmp_path) == 3
    assert "resumes from global_step_25" in str(halted.value)


@pytest.mark.parametrize(
    ("ends", "progressed", "halts"),
    [
        ([0, 100, 200], [True, True, True], "3 failures within 15 min: a crash loop"),
        ([0, 1000, 2000], [True, True, True], None),
        ([0, 1000, 2000], [True, False, False], None),
        ([0, 1000, 2000], [False, False, False], "3 failures in a row, none after a new checkpoint"),
        ([0, 5000, 5100, 5200], [False, True, True, True], "3 failures within 15 min"),
    ],
)
def test_the_policy_counts_failures_in_the_window_and_without_progress(
    ends: list[float], progressed: list[bool], halts: str | None
) -> None:
    attempts = [Attempt(1, 60.0, end, p) for end, p in zip(ends, progressed, strict=True)]
    reason = RestartPolicy().halt_reason(attempts)
    assert (reason is None) if halts is None else (reason is not None and reason.startswith(halts))


def test_the_policy_is_read_from_the_environment_and_bad_values_are_named() -> None:
    policy = RestartPolicy.from_environment(
        {"VERLBOX_RESTART_FAILURES": "5", "VERLBOX_RESTART_WINDOW_S": "3600", "VERLBOX_RESTART_DELAY_S": "0"}
    )
    assert policy == RestartPolicy(failures=5, window_s=3600, delay_s=0)
    assert RestartPolicy.from_environment({}) == RestartPolicy()
    for name, value in [
        ("VERLBOX_RESTART_FAILURES", "0"),
        ("VERLBOX_RESTART_FAILURES", "2.5"),
        ("VERLBOX_RESTART_WINDOW_S", "15m"),
        ("VERLBOX_RESTART_DELAY_S", "nan"),
    ]:
        with pytest.raises(UsageError, match=f"^{name}={value}: expected"):
            RestartPolicy.from_environment({name: value})


SUPERVISED = """
import os, sys
from verlbox.runtime.training import supervisor
policy = supervisor.RestartPolicy(failures=3, window_s=60, delay_s=0)
child = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"]
code = supervisor.supervise(child, dict(os.environ), policy, newest_step=lambda: None,
                            before_restart=lambda after, step: None,
                            say=lambda t: print(t, file=sys.stderr, flush=True))
sys.exit(code)
"""


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_reaches_verl_and_is_not_restarted(stop: signal.Signals) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", SUPERVISED], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    child = int(process.stdout.readline())
    process.send_signal(stop)
    _, stderr = process.communicate(timeout=10)
    assert process.returncode == 128 + stop
    assert f"verl stopped (killed by {stop.name}) on {stop.name}" in stderr
    assert "restart" not in stderr
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_a_run_that_cannot_start_holds_under_compose_and_exits_with_its_code_when_stopped(tmp_path: Path) -> None:
    """VERLBOX_ON_HALT=wait: the failure is said once, the process stays up (no exit for Docker to restart
    into the same failure), the healthcheck's file holds the reason, and `docker stop` ends it with the code."""
    halt_file = tmp_path / "halted"
    program = (
        "import sys\nfrom pathlib import Path\nfrom verlbox.runtime.training import supervisor\n"
        f"supervisor.HALT_FILE = Path({str(halt_file)!r})\n"
        "from verlbox.cli import main\nsys.exit(main(['train']))\n"
    )
    env = dict(os.environ, VERLBOX_ON_HALT="wait")
    process = subprocess.Popen([sys.executable, "-c", program], env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    first = process.stderr.readline()
    assert first.startswith("verlbox: error: train runs inside the image")  # no torch here
    assert process.stderr.readline().startswith("halted: holding here")
    time.sleep(0.5)
    assert process.poll() is None
    assert halt_file.read_text().startswith("train runs inside the image")
    process.terminate()
    assert process.wait(timeout=10) == 2  # the bad input's own code, as without holding


def test_an_os_error_before_verl_starts_holds_under_compose_naming_the_path(tmp_path: Path) -> None:
    """No space while preparing GSM8K: before, `internal error`, exit 1 and no halt file, so Docker restarted
    the container into the same failure."""
    halt_file = tmp_path / "halted"
    program = (
        "import sys\nfrom pathlib import Path\nfrom verlbox.runtime import commands\n"
        "from verlbox.runtime.training import supervisor\n"
        f"supervisor.HALT_FILE = Path({str(halt_file)!r})\n"
        "def full(args):\n    raise OSError(28, 'No space left on device', '/data/gsm8k/train.parquet')\n"
        "commands._train = full\nfrom verlbox.cli import main\nsys.exit(main(['train']))\n"
    )
    for on_halt, held in (("wait", True), ("exit", False)):
        env = dict(os.environ, VERLBOX_ON_HALT=on_halt)
        process = subprocess.Popen([sys.executable, "-c", program], env=env, stderr=subprocess.PIPE, text=True)
        assert process.stderr is not None
        first = process.stderr.readline()
        assert first == "verlbox: error: /data/gsm8k/train.parquet: No space left on device\n"
        if held:
            assert process.stderr.readline().startswith("halted: holding here")
            time.sleep(0.5)
            assert process.poll() is None and halt_file.read_text().startswith("/data/gsm8k/train.parquet")
            process.terminate()
        assert process.wait(timeout=10) == 1 and "Traceback" not in process.stderr.read()


def test_an_unknown_halt_mode_is_named() -> None:
    with pytest.raises(UsageError, match=r"^VERLBOX_ON_HALT=loop: expected exit"):
        supervisor.holds({"VERLBOX_ON_HALT": "loop"})


REAPER = """
import ctypes, os, sys, pathlib
from verlbox.runtime.training import supervisor
# PR_SET_CHILD_SUBREAPER: orphans come to this process, as to PID 1
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0, "no subreaper: the test would prove nothing"
leftover = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
unmarked = "import time; time.sleep(1)"  # a worker started with a clean environment, ending on its own
verl = [sys.executable, "-c", "import os, subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {leftover!r}]); "
        f"subprocess.Popen([sys.executable, '-c', {unmarked!r}], env={{}}); time.sleep(3)"]
code = supervisor.run_attempt(verl, dict(os.environ), supervisor.StopRequest(), 1.0, None,
                              lambda text: print(text, file=sys.stderr), supervisor.RaySessions({}))
print(code, [p.name for p in pathlib.Path("/proc").iterdir()
             if p.name.isdigit() and (p / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(os.getpid())])
"""


def test_processes_verl_left_are_reaped_when_train_is_the_container_s_first_process() -> None:
    """Without an init (plain `docker run`), `train` is PID 1 and inherits every orphan: one that ignores
    SIGTERM is killed and collected, one without verlbox's marker that ends on its own is collected too;
    neither is left a zombie (a subreaper stands in for PID 1 here)."""
    result = subprocess.run([sys.executable, "-c", REAPER], capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.split("\n")[-2] == "0 []", result.stdout + result.stderr
    assert "ended 1 process(es) verl left running" in result.stderr


def test_restarts_back_off_to_a_cap_and_start_again_after_a_save() -> None:
    policy = RestartPolicy(failures=99, window_s=0, delay_s=30, max_delay_s=200)

    def failed(*progressed: bool) -> list[Attempt]:
        return [Attempt(1, 60, 60.0 * n, saved) for n, saved in enumerate(progressed)]

    assert [policy.delay(failed(*[False] * n)) for n in range(1, 6)] == [30, 60, 120, 200, 200]
    assert policy.delay(failed(False, False, False, True)) == 30  # the last attempt saved: back to the base
    assert policy.delay(failed(False, True, False)) == 30
    assert RestartPolicy(delay_s=300, max_delay_s=60).delay(failed(False, False)) == 300  # the cap never shortens it


def test_the_back_off_and_the_halt_s_retry_are_read_from_the_environment() -> None:
    policy = RestartPolicy.from_environment({"VERLBOX_RESTART_DELAY_MAX_S": "90", "VERLBOX_HALT_RETRY_S": "0"})
    assert (policy.max_delay_s, policy.halt_retry_s) == (90, 0)
    with pytest.raises(UsageError, match="VERLBOX_HALT_RETRY_S"):
        RestartPolicy.from_environment({"VERLBOX_HALT_RETRY_S": "soon"})


def test_a_crash_loop_under_compose_is_tried_again_on_its_own_after_the_pause(tmp_path: Path) -> None:
    """A 4-minute outage (NFS away, a GPU reset) with attempts dying in it must not end a week's run: the halt file
    says when the run is tried again, and it is, until a stop ends the hold with the halt's code."""
    halt_file = tmp_path / "halted"
    program = (
        "import sys\nfrom pathlib import Path\nfrom verlbox.runtime import commands\n"
        "from verlbox.errors import RunHalted\nfrom verlbox.runtime.training import supervisor\n"
        f"supervisor.HALT_FILE = Path({str(halt_file)!r})\n"
        f"count = Path({str(tmp_path / 'runs')!r})\n"
        "def looping(args):\n"
        "    fresh = count.with_suffix('.new')\n"  # written whole, then renamed: the test reads it meanwhile
        "    fresh.write_text(str(int(count.read_text()) + 1 if count.exists() else 1))\n"
        "    fresh.replace(count)\n"
        "    raise RunHalted('verl failed (exit 1 after 1 s); 3 failures within 15 min: a crash loop')\n"
        "commands._train = looping\nfrom verlbox.cli import main\nsys.exit(main(['train']))\n"
    )
    env = dict(os.environ, VERLBOX_ON_HALT="wait", VERLBOX_HALT_RETRY_S="1")
    process = subprocess.Popen([sys.executable, "-c", program], env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        assert process.stderr.readline().startswith("verlbox: error: verl failed")
        assert "tried again on its own in 1 s" in process.stderr.readline()
        deadline = time.monotonic() + 30

        def halt_record() -> str:  # each try clears the halt file, and the next halt writes it again
            try:
                return halt_file.read_text()
            except FileNotFoundError:
                return ""

        while (
            not (tmp_path / "runs").exists() or runs(tmp_path) < 3 or "tried again on its own at " not in halt_record()
        ):
            assert process.poll() is None and time.monotonic() < deadline, halt_record()
            time.sleep(0.05)
        process.terminate()
        assert process.wait(timeout=10) == RUN_HALTED
        assert "the halt's pause is over: starting the run again" in process.stderr.read()
    finally:  # a failed assertion must not leave the holding process behind
        process.kill()
        process.wait()


def test_ray_sessions_of_earlier_attempts_are_removed_and_no_other_s(tmp_path: Path) -> None:
    """A week of restarts piled Ray's session folders up in /tmp; another experiment's live Ray must keep its own."""
    root = tmp_path / "ray"
    other = root / "session_2026-12-01_10-00-00_000000_1"
    (other / "sockets").mkdir(parents=True)
    sessions = supervisor.RaySessions({"RAY_TMPDIR": str(tmp_path)})
    said: list[str] = []
    made = []
    for attempt in range(3):
        sessions.attempt_starts()
        made.append(root / f"session_2026-12-0{attempt + 2}_10-00-00_000000_{attempt + 2}")
        (made[-1] / "logs").mkdir(parents=True)  # what this attempt's Ray made
        sessions.attempt_ended(said.append)
    assert sorted(path.name for path in root.iterdir()) == [other.name, made[-1].name]
    assert said == []  # quiet with room to spare


def test_a_stop_that_comes_while_the_first_is_decided_is_held_with_it() -> None:
    """Deciding reads the disk (slow on NFS): a second stop arriving meanwhile must not find the first half-decided
    and kill verl mid-save."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    asked: list[int] = []

    def saving() -> bool:
        if not asked:  # a second stop, arriving while the first is being decided
            asked.append(1)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return True

    try:
        with supervisor.StopRequest(holds_off=saving) as stop:
            stop.started(child)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            stop.decide()
            assert (stop.signal, stop.repeated) == (signal.SIGTERM, 1)
            assert stop.held_since is not None and child.poll() is None  # held, verl untouched
    finally:
        child.kill()
        child.wait()
