"""The compose stop/up cycle for real (issue 42): a run folder `verlbox init` wrote (the shipped compose.yaml and its
.env), the built image, `docker compose` itself, and the image's `verlbox train` supervising a fake verl
(tests/fixtures/compose-cycle) on a small disk, with a console that dies.

compose.override.yaml, written beside compose.yaml as a user would, changes only what this machine needs: no GPU
to reserve, the harness as the entrypoint (train.py: the GPU and preflight faked as tests/test_progress.py's TRAIN
fakes them), a healthcheck every second, and /checkpoints on a tmpfs of two and a half saves. A tmpfs mount of the
service itself is empty again after `docker compose stop` and `up` (Docker unmounts it with the container's
mounts), and so is a tmpfs volume that no other container holds; so the small disk is a tmpfs volume that a second
service, small-disk, keeps mounted: its bytes survive the stop and the restart of train's own container, as a
disk does. Through small-disk the test reads the checkpoints too.

The cycle: (a) `up -d`, then `stop` while verl saves global_step_1: the stop is held until the save is on disk, then
ends the run (143); (b) `up -d` starts the same container again, and verl resumes from global_step_1; the console's
reader leaves there, and the run goes on: verl crashes once and is restarted from its save, saves global_step_2;
(c) global_step_3 fills the disk mid-save: train halts with the disk's reason, holds (unhealthy in `docker compose
ps`), and `stop` ends it at once with the halt's exit code, 3.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import REPO, run_verlbox
from verlbox.runtime.training import checkpoints, progress, run_record, supervisor

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FIXTURES = REPO / "tests" / "fixtures"
EXPERIMENT = "qwen2.5-0.5b-gsm8k-ppo"  # the profile's run name: compose's VERLBOX_EXPERIMENT is left empty
FOLDER = f"/checkpoints/{EXPERIMENT}"
MODEL_NAME = "tiny-model"
PARAMETERS = 1024  # the fake model's: a save is then about 128 MiB, almost all of it verlbox's per-role allowance
FIRST_SAVE_S = 8  # global_step_1's save lasts this long: the stop comes during it
SAVE_GRACE_S = 60  # ten times that save: a stop that ends sooner than this was not let go by the grace
STOP_GRACE_S = 300  # compose.yaml's stop_grace_period (tests/test_compose.py checks it)
SUDO_CALLER = (4321, 4322)  # root runs `verlbox init` as `sudo` does: the folder is for the user behind it

OVERRIDE = """\
# tests/test_compose_cycle.py: no GPU here, a small disk under the checkpoints, `train` over a fake verl
services:
  train:
    # in place of `verlbox`: the harness, which runs verlbox's own main with the service's command
    entrypoint: ["python", "/harness/train.py"]
    environment:
      VERLBOX_RESTART_DELAY_S: "1"
      VERLBOX_SAVE_GRACE_S: "{save_grace_s}"
      FAKE_VERL_SHARD_BYTES: "{shard_bytes}"
      FAKE_VERL_FIRST_SAVE_S: "{first_save_s}"
      FAKE_VERL_CRASH_MARK: /tmp/fake-verl-crashed
    volumes:
      - {{type: volume, source: small-disk, target: /checkpoints}}
      - {{type: bind, source: "{harness}", target: /harness, read_only: true}}
    healthcheck:
      interval: 1s
      retries: 2
    deploy: !reset {{}}
  # keeps the small disk mounted while train's container is stopped
  small-disk:
    image: ${{VERLBOX_IMAGE}}
    pull_policy: never
    user: "${{VERLBOX_UID}}:${{VERLBOX_GID}}"
    entrypoint: ["sleep", "infinity"]
    init: true
    volumes:
      - {{type: volume, source: small-disk, target: /checkpoints}}
volumes:
  small-disk:
    driver_opts: {{type: tmpfs, device: tmpfs, o: "size={disk_bytes},uid={uid},gid={gid},mode=0755"}}
"""


def compose_environment() -> dict[str, str]:
    # a VERLBOX_* variable in the test's own environment would win over the run folder's .env
    return {key: value for key, value in os.environ.items() if not key.startswith("VERLBOX_")}


class RunFolder:
    """A run folder and `docker compose` in it, as its user types it."""

    def __init__(self, path: Path, caller: tuple[int, int], image: str) -> None:
        self.path, self.caller, self.image = path, caller, image
        self.project = path.name

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["docker", "compose", *args],
            cwd=self.path,
            env=compose_environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert result.returncode == 0, f"docker compose {' '.join(args)}: {result.stderr[-3000:]}"
        return result

    def logs(self) -> str:
        """train's container log: its stderr, the console train writes to."""
        return self.compose("logs", "--no-color", "--no-log-prefix", "train").stdout

    def read(self, path: str) -> str:
        """A file on the small disk, read by the service that keeps it mounted."""
        return self.compose("exec", "-T", "small-disk", "cat", path).stdout

    def container(self) -> str:
        return self.compose("ps", "-aq", "train").stdout.strip()

    def inspect(self, container: str) -> dict:
        result = subprocess.run(["docker", "inspect", container], capture_output=True, text=True, check=True)
        return json.loads(result.stdout)[0]

    def state(self, container: str) -> dict:
        return self.inspect(container)["State"]

    def left(self) -> dict[str, str]:
        """The project's containers, networks and volumes still on the engine."""
        label = f"label=com.docker.compose.project={self.project}"
        kinds = {"containers": ["ps", "-aq"], "networks": ["network", "ls", "-q"], "volumes": ["volume", "ls", "-q"]}
        found = {
            kind: subprocess.run(["docker", *words, "--filter", label], capture_output=True, text=True).stdout.strip()
            for kind, words in kinds.items()
        }
        return {kind: ids for kind, ids in found.items() if ids}


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float, explain: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s:\n{explain()[-6000:]}"
        time.sleep(0.25)


def logged(run: RunFolder, text: str, since: int = 0) -> bool:
    """TEXT in train's log after its first SINCE characters; a halt before it fails at once."""
    console = run.logs()[since:]
    assert text in console or "halted: holding here" not in console, f"halted before {text!r}:\n{console[-6000:]}"
    return text in console


def tiny_model(folder: Path) -> None:
    """A model folder whose safetensors header is all verlbox reads to size a save (nothing loads the weights)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 32, "hidden_size": 32, "tie_word_embeddings": False}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [PARAMETERS], "data_offsets": [0, 4 * PARAMETERS]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4 * PARAMETERS))


def owned_by(folder: Path, uid: int, gid: int) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)


def timestamp(text: str, pattern: str) -> float:
    match = re.search(pattern + r" at ([0-9.]+)", text)
    assert match, f"no {pattern!r} in:\n{text[-6000:]}"
    return float(match[1])


@pytest.fixture
def run_folder(tmp_path: Path, image: str, compose_cli: None) -> Iterator[tuple[RunFolder, int]]:
    """`verlbox init` with the built image, the fake model, the harness and compose.override.yaml; the size of one
    save as verlbox estimates it. Everything compose made is removed afterwards."""
    caller = SUDO_CALLER if os.getuid() == 0 else (os.getuid(), os.getgid())
    sudo = {"SUDO_UID": str(caller[0]), "SUDO_GID": str(caller[1])} if os.getuid() == 0 else {}
    path = tmp_path / f"cycle-{uuid.uuid4().hex[:8]}"  # the compose project is named after it
    result = run_verlbox("init", str(path), "--image", image, env=sudo)
    assert result.returncode == 0, result.stderr
    env_file = path / ".env"
    text = env_file.read_text()
    assert f"VERLBOX_UID={caller[0]}\nVERLBOX_GID={caller[1]}\n" in text and "\nVERLBOX_MODEL_NAME=" in text
    env_file.write_text(re.sub(r"(?m)^VERLBOX_MODEL_NAME=.*$", f"VERLBOX_MODEL_NAME={MODEL_NAME}", text))
    tiny_model(path / "models" / MODEL_NAME)
    size = checkpoints.model_size(path / "models" / MODEL_NAME)
    assert size is not None
    save_bytes = checkpoints.estimate_step_bytes(
        size, size, {role: checkpoints.DEFAULT_CONTENTS for role in ("actor", "critic")}
    )
    harness = tmp_path / "harness"
    harness.mkdir()
    for name in ("train.py", "fake_verl.py"):
        shutil.copy(FIXTURES / "compose-cycle" / name, harness / name)
    shutil.copy(FIXTURES / "verl-run" / "console.txt", harness / "console.txt")
    (path / "compose.override.yaml").write_text(
        OVERRIDE.format(
            save_grace_s=SAVE_GRACE_S,
            # each role's model file: a save is then a little less than the estimate
            shard_bytes=save_bytes // 2 - 2**16,
            first_save_s=FIRST_SAVE_S,
            harness=harness,
            # room for two saves and half of a third: the start's rule (a save more than those kept) passes at both
            # starts, and global_step_3 fills the disk
            disk_bytes=save_bytes * 5 // 2,
            uid=caller[0],
            gid=caller[1],
        )
    )
    if os.getuid() == 0:
        owned_by(path, *caller)
    run = RunFolder(path, caller, image)
    try:
        yield run, save_bytes
    finally:
        run.compose("down", "-v", "--remove-orphans", "--timeout", "5", check=False)


def test_stop_during_a_save_restart_a_dead_console_and_a_full_disk_under_compose(
    run_folder: tuple[RunFolder, int],
) -> None:
    run, save_bytes = run_folder
    uid, gid = run.caller
    shipped = json.loads(run.compose("-f", "compose.yaml", "config", "--format", "json").stdout)["services"]["train"]
    train = json.loads(run.compose("config", "--format", "json").stdout)["services"]["train"]
    assert "deploy" in shipped and "deploy" not in train and train["entrypoint"] == ["python", "/harness/train.py"]
    # the rest as shipped: the service's own command (a halt holds), its stop grace, restarts and user
    for key in ("command", "stop_grace_period", "restart", "user", "init"):
        assert train[key] == shipped[key], key
    assert train["user"] == f"{uid}:{gid}" and train["stop_grace_period"] == "5m0s"

    # (a) up, and a stop while verl writes global_step_1: held until the save is on disk
    run.compose("up", "-d", "small-disk")
    run.compose("up", "-d", "train")
    container = run.container()
    # on the disk, not on verl's line: under Ray the line comes 50-100 ms after the folder (the stand-in's too)
    saving = f"{FOLDER}/global_step_1"
    wait_for(
        lambda: run.compose("exec", "-T", "small-disk", "test", "-d", saving, check=False).returncode == 0,
        "save",
        180,
        run.logs,
    )
    asked = time.time()
    run.compose("stop", "train", timeout=STOP_GRACE_S + 60)
    stopped = time.time()
    console_a = run.logs()
    state = run.state(container)
    assert (state["Status"], state["ExitCode"]) == ("exited", 143), console_a[-3000:]
    log = run.read(f"{FOLDER}/{progress.LOG_FILE}")
    written = timestamp(log, "fake verl: global_step_1 written")
    signalled = timestamp(log, "fake verl: stopped by SIGTERM")
    assert asked < written <= signalled, "the stop came before the save ended, and reached verl after it"
    assert "the tracker names 1\n" in log
    assert stopped - written < 15, f"the container ran on {stopped - written:.0f} s after the save was written"
    assert stopped - asked < SAVE_GRACE_S < STOP_GRACE_S
    assert f"stopping once verl has written the checkpoint it is saving (at most {SAVE_GRACE_S} s)" in console_a
    assert "verl stopped (exit 143) on SIGTERM" in console_a
    assert run.read(f"{FOLDER}/{checkpoints.TRACKER}") == "1"
    [first] = json.loads(run.read(f"{FOLDER}/{run_record.RUN_FILE}"))["runs"]
    assert (first["outcome"], first["last_step"], first["restarts"]) == ("stopped (exit 143)", 1, [])
    assert first["image"] == run.image and "trainer.max_critic_ckpt_to_keep=null" in first["overrides"]

    # (b) up again: the same container starts again on the same disk, and verl resumes from global_step_1
    run.compose("up", "-d", "train")
    assert run.container() == container
    wait_for(lambda: logged(run, "console's reader has gone", len(console_a)), "dead console", 120, run.logs)
    console_b = run.logs()[len(console_a) :]
    assert "checkpoints: verl resumes from global_step_1; its settings match this run's" in console_b, console_b
    assert f"Load from checkpoint folder: {FOLDER}/global_step_1" in console_b

    # (c) the dead console ends nothing: verl is restarted after its crash and saves on until the disk is full
    wait_for(lambda: run.state(container).get("Health", {}).get("Status") == "unhealthy", "halt", 120, run.logs)
    [listed] = [json.loads(line) for line in run.compose("ps", "--format", "json", "train").stdout.splitlines()]
    assert (listed["State"], listed["Health"]) == ("running", "unhealthy")
    assert "(unhealthy)" in run.compose("ps", "train").stdout
    halted = run.compose("exec", "-T", "train", "cat", str(supervisor.HALT_FILE)).stdout
    assert halted.startswith(f"checkpoints: the disk filled while verl wrote global_step_3: {FOLDER} has "), halted
    assert f"less than the {checkpoints.show_size(save_bytes)} of a save; free some space on that disk" in halted
    assert run.read(f"{FOLDER}/{checkpoints.TRACKER}") == "2"
    log = run.read(f"{FOLDER}/{progress.LOG_FILE}")
    notes = [line for line in log.splitlines() if "console failed" in line]
    assert len(notes) == 1 and notes[0].startswith("# verlbox: the console failed at "), notes
    assert notes[0].endswith(
        f"(BrokenPipeError: [Errno 32] Broken pipe) and was not written to again; verl's lines are in "
        f"{FOLDER}/{progress.LOG_FILE}"
    )
    after = log[log.index(notes[0]) :]
    assert (
        "# verlbox: verl attempt 2 started" in after and f"Load from checkpoint folder: {FOLDER}/global_step_1" in after
    )
    assert "fake verl: global_step_2 written at" in after
    metrics = [json.loads(line) for line in run.read(f"{FOLDER}/{progress.METRICS_FILE}").splitlines()]
    assert [(entry["step"], entry["attempt"]) for entry in metrics] == [(1, 1), (2, 2)]
    runs = json.loads(run.read(f"{FOLDER}/{run_record.RUN_FILE}"))["runs"]
    assert len(runs) == 2 and [(r["after"], r["from_step"]) for r in runs[1]["restarts"]][:1] == [("exit 1", 1)]
    # every file on the disk is the run folder's user's (compose's user: the .env's VERLBOX_UID/GID)
    strangers = ["(", "!", "-user", str(uid), "-o", "!", "-group", str(gid), ")", "-print"]
    assert run.compose("exec", "-T", "small-disk", "find", "/checkpoints", *strangers).stdout == ""

    asked = time.monotonic()
    run.compose("stop", "train", timeout=STOP_GRACE_S + 60)
    assert time.monotonic() - asked < 15, "the hold did not end at the stop"
    halt_exit = run.state(container)["ExitCode"]
    time.sleep(2)  # restart: on-failure brings back nothing that was stopped
    assert (run.state(container)["Status"], run.inspect(container)["RestartCount"]) == ("exited", 0)
    # nothing in the bind-mounted folders belongs to anyone but the run folder's user
    assert [p for p in [run.path, *run.path.rglob("*")] if (p.lstat().st_uid, p.lstat().st_gid) != run.caller] == []

    run.compose("down", "-v", "--remove-orphans", "--timeout", "5")
    assert run.left() == {}
    # last, so that everything above has been checked: the stop ends the hold with the halt's exit code (the disk's,
    # 3), not with the 120 Python gives when it cannot flush stderr at exit (what the dead console left in its buffer)
    assert halt_exit == 3, f"the held run ended with exit {halt_exit} at the stop"
