"""A week unattended (issue 42): a console that dies, lines without bound and torch kept out of `train`, each
driven through the real supervisor and watch with fake verl children (and a fake nvidia-smi for the GPU count)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from verlbox.runtime.training import progress, supervisor, train
from verlbox.runtime.training.progress import Progress, RunWatch, read_metrics

STEP = "\x1b[36m(TaskRunner pid=1)\x1b[0m step:{n} - critic/score/mean:0.5 - timing_s/step:10.0"

# verl: run N (counted in FOLDER/runs) prints NOISE lines of 100 bytes then a step line, and fails but the last
VERL = """
import pathlib, sys
folder = pathlib.Path(sys.argv[1])
runs = folder / "runs"
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
noise, last = int(sys.argv[2]) if n == 1 else 2000, int(sys.argv[3])
for i in range(noise):
    print("x" * 96, f"{i:03d}", flush=True)
if noise:
    print(sys.argv[4].format(n=n), flush=True)
sys.exit(0 if n == last else 1)
"""

# the image's `train` as it supervises verl: the real watch and its rich console on stderr
SUPERVISED = """
import os, sys
from pathlib import Path
from rich.console import Console
from verlbox.runtime.training import supervisor, train
folder = Path(sys.argv[1])
console = Console(stderr=True, highlight=False, soft_wrap=True)
watch = train.run_watch(folder, [], {}, None, console)
policy = supervisor.RestartPolicy(failures=3, window_s=60, delay_s=0)
code = supervisor.supervise([sys.executable, "-c", *sys.argv[2:]], dict(os.environ), policy,
                            newest_step=lambda: None, before_restart=lambda after, step: None,
                            say=lambda text: console.print(text, markup=False), watch=watch)
sys.exit(code)
"""


@pytest.mark.parametrize("first_to_write", ["the reader", "the supervisor"])
def test_a_console_whose_reader_has_gone_ends_neither_the_reader_nor_the_supervisor(
    tmp_path: Path, first_to_write: str
) -> None:
    """stderr to a reader that has closed: rich turns the broken pipe into SystemExit(1). Before, when verl
    wrote first the reader died and verl blocked on the full pipe; when the supervisor said first that verl
    had failed, `supervise` exited 1 and verl was never restarted."""
    noise = 2000 if first_to_write == "the reader" else 0  # 200 KB: more than a pipe holds
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-c", SUPERVISED, str(tmp_path), VERL, str(tmp_path), str(noise), "2", STEP],
            stdout=subprocess.DEVNULL,
            stderr=write_end,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, (tmp_path / "runs").read_text()) == (0, "2")
    logged = (tmp_path / progress.LOG_FILE).read_text().splitlines()
    assert sum(line.startswith("x" * 96) for line in logged) == noise + 2000  # every line of both attempts
    assert [record.step for record in read_metrics(tmp_path / progress.METRICS_FILE)] == ([1, 2] if noise else [2])
    notes = [line for line in logged if "console failed" in line]
    assert len(notes) == 1 and notes[0].startswith("# verlbox: the console failed at ")
    assert "(BrokenPipeError: [Errno 32] Broken pipe) and was not written to again" in notes[0]


class DeadTerminal:
    """A console that fails with EIO (a terminal gone), for verl's lines and the supervisor's alike."""

    def __init__(self) -> None:
        self.tries = 0

    def write(self, text: object) -> None:
        self.tries += 1
        raise OSError(5, "Input/output error")


def test_a_dead_console_is_noted_once_in_verl_log_and_said_on_stderr_at_the_end(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A terminal gone (EIO, which rich does not catch) while verl was quiet: before, the supervisor's own line
    about the failure raised out of `supervise` and verl was not restarted; nothing ever said it afterwards."""
    terminal = DeadTerminal()
    watch = RunWatch(tmp_path, Progress(16, 24), terminal.write)
    code = supervisor.supervise(
        [sys.executable, "-c", VERL, str(tmp_path), "0", "2", STEP],
        dict(os.environ),
        supervisor.RestartPolicy(failures=3, window_s=60, delay_s=0),
        newest_step=lambda: None,
        before_restart=lambda after, step: None,
        say=terminal.write,
        watch=watch,
    )
    assert (code, (tmp_path / "runs").read_text(), terminal.tries) == (0, "2", 1)  # given up on at once
    [note] = [line for line in (tmp_path / progress.LOG_FILE).read_text().splitlines() if "console" in line]
    at = note.split(" at ", 1)[1].split(" (", 1)[0]
    said = (
        f"the console failed at {at} (OSError: [Errno 5] Input/output error) and was not written to again; "
        f"verl's lines are in {tmp_path / progress.LOG_FILE}"
    )
    assert note == f"# verlbox: {said}"
    assert capfd.readouterr().err.splitlines() == [f"verlbox: {said}"]


HUGE = 200_000_000
UPDATES = 200_000

FLOOD = f"""
import sys
out = sys.stdout.buffer
for _ in range({HUGE} // 1_000_000):
    out.write(b"x" * 1_000_000)
out.write(b"\\n" + sys.argv[1].format(n=1).encode() + b"\\n")
out.write(b"\\x1b[36m(TaskRunner pid=1)\\x1b[0m ")
for start in range(0, {UPDATES}, 1000):
    out.write(b"".join(b"\\rTraining Progress: %d/{UPDATES}" % (i + 1) for i in range(start, start + 1000)))
out.write(b"\\ndone\\n")
"""

MEASURED = """
import os, resource, sys
from pathlib import Path
from rich.console import Console
from verlbox.runtime.training import supervisor, train
folder = Path(sys.argv[1])
console = Console(file=open(folder / "console.txt", "w"), highlight=False, soft_wrap=True)
watch = train.run_watch(folder, [], {}, None, console)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
code = supervisor.supervise([sys.executable, "-c", sys.argv[2], sys.argv[3]], dict(os.environ),
                            supervisor.RestartPolicy(), newest_step=lambda: None,
                            before_restart=lambda after, step: None, say=console.print, watch=watch)
print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_a_200_mb_line_and_a_carriage_return_bar_stay_bounded_and_the_next_step_is_recorded(tmp_path: Path) -> None:
    """Before, the 200 MB line was read whole (the supervisor grew to 1.4 GiB) and the step after it never
    reached metrics.jsonl; the bar's 200,000 updates became one 12 MB line in verl.log."""
    result = subprocess.run(
        [sys.executable, "-c", MEASURED, str(tmp_path), FLOOD, STEP],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    code, grew_kib = map(int, result.stdout.split())
    assert code == 0, result.stderr
    assert grew_kib < 32 * 1024, f"the supervisor grew by {grew_kib} KiB"
    [record] = read_metrics(tmp_path / progress.METRICS_FILE)
    assert (record.step, record.metrics) == (1, {"critic/score/mean": 0.5, "timing_s/step": 10.0})
    marker = f"[verlbox: cut, the line has {HUGE} bytes]"
    logged = (tmp_path / progress.LOG_FILE).read_text().splitlines()
    assert logged[1:] == [
        "x" * progress.LOG_LINE_BYTES + marker,
        STEP.format(n=1),
        f"\x1b[36m(TaskRunner pid=1)\x1b[0m Training Progress: {UPDATES}/{UPDATES}",
        "done",
    ]
    shown = (tmp_path / "console.txt").read_text().splitlines()
    assert shown[0] == "x" * progress.SHOWN_LINE_BYTES + marker
    assert shown[1].startswith("step 1  10.0 s/step") and shown[2:] == ["done"]


class Trickle(io.RawIOBase):
    """A pipe that hands over its bytes a few at a time: every line break may fall between two reads."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size = data, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        piece, self.data = self.data[: self.size], self.data[self.size :]
        buffer[: len(piece)] = piece
        return len(piece)


@pytest.mark.parametrize("size", [1, 3, 64])
def test_carriage_returns_keep_the_last_update_behind_ray_s_prefix_in_any_chunking(tmp_path: Path, size: int) -> None:
    """Before, a bar's updates were logged and shown together, carriage returns and all."""
    output = (
        b"\x1b[36m(TaskRunner pid=7)\x1b[0m \rGenerating: 0\rGenerating: 64\n"
        b"a line ended the Windows way\r\n"
        b"bar 50%\rbar 100%\r\n"
        b"\xc3\xbcber\n"
        b"the last words, without a newline"
    )
    expected = [
        "\x1b[36m(TaskRunner pid=7)\x1b[0m Generating: 64",
        "a line ended the Windows way",
        "bar 100%",
        "über",
        "the last words, without a newline",
    ]
    shown: list[str] = []
    watch = RunWatch(tmp_path, Progress(16, 24), lambda text: shown.append(str(text)))
    watch.follow(io.BufferedReader(Trickle(output, size))).join(timeout=10)
    assert (tmp_path / progress.LOG_FILE).read_text().splitlines()[1:] == expected
    assert shown == expected


NVIDIA_SMI = """#!/bin/sh
[ -n "$NVIDIA_SMI_FAILS" ] && { echo "$NVIDIA_SMI_FAILS" >&2; exit 9; }
echo "GPU 0: Tesla P40 (UUID: GPU-aaa11111-0000-0000-0000-000000000000)"
echo "GPU 1: Tesla P40 (UUID: GPU-bbb22222-0000-0000-0000-000000000000)"
echo "  MIG 1g.5gb Device 0: (UUID: MIG-ccc33333-0000-0000-0000-000000000000)"
echo "GPU 2: Tesla P40 (UUID: GPU-ddd44444-0000-0000-0000-000000000000)"
"""


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A driver with three P40s (one holding a MIG device) on PATH; torch is not what counts them."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text(NVIDIA_SMI)
    (folder / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


@pytest.mark.parametrize(
    ("chosen", "gpus", "source"),
    [
        (None, 3, "3 GPU(s) visible here"),
        ("2,0", 2, "2 GPU(s) visible here"),
        ("GPU-bbb", 1, "1 GPU(s) visible here"),
        ("0, 7, 1", 1, "1 GPU(s) visible here"),  # CUDA stops at the first entry it cannot use
        ("1,1", 1, "0 GPU(s) visible here"),  # a GPU named twice: CUDA sees none
        ("", 1, "0 GPU(s) visible here"),
    ],
)
def test_the_gpus_here_are_counted_by_nvidia_smi_as_cuda_visible_devices_narrows_them(
    fake_nvidia_smi: Path, chosen: str | None, gpus: int, source: str
) -> None:
    """compose's path (no GPU count given): before, torch was imported into `train` to count them."""
    environ = {} if chosen is None else {"CUDA_VISIBLE_DEVICES": chosen}
    topology = train.resolve_topology(None, None, [], environ, Console(file=io.StringIO()))
    assert (topology.gpus_per_node, topology.nodes, topology.source) == (gpus, 1, source)


def test_a_driver_nvidia_smi_cannot_ask_is_named_in_the_topology(
    fake_nvidia_smi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVIDIA_SMI_FAILS", "NVIDIA-SMI has failed because it could not communicate with the driver")
    failed = train.resolve_topology(None, None, [], {}, Console(file=io.StringIO()))
    assert (failed.gpus_per_node, failed.source) == (
        1,
        "no GPU counted here: nvidia-smi -L failed (NVIDIA-SMI has failed because it could not communicate with "
        "the driver)",
    )
    monkeypatch.setenv("PATH", str(fake_nvidia_smi.parent))  # no nvidia-smi at all
    missing = train.resolve_topology(None, None, [], {}, Console(file=io.StringIO()))
    assert missing.source.startswith("no GPU counted here: nvidia-smi -L could not run (")


TRAIN = """
import json, sys
from rich.console import Console
from verlbox.host.recipes.recipe import load_recipe
from verlbox.runtime.training import preflight, train
p40 = preflight.GpuFacts([preflight.GpuDevice("Tesla P40", "6.1", 22.4, 22.2)], ["sm_61"], "12.4", "550.54.14")
train.local_gpu_facts = lambda cap: p40
train.run_preflight = lambda *args: [preflight.Check("gpu", True, "a fake P40")]
train.fit_prompt_length = lambda overrides, user, say: overrides
train.train_command = lambda overrides: [sys.executable, "-c", sys.argv[1], sys.argv[2], "1", "1", sys.argv[3]]
spec = load_recipe("p40-cu124").image_spec()
console = Console(stderr=True)
code = train.train(spec, json.loads(sys.argv[4]), dry_run=False, gpu_memory_gib=None, console=console)
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def test_train_supervises_verl_without_torch_in_its_process(tmp_path: Path, fake_nvidia_smi: Path) -> None:
    """`docker compose up train` gives no GPU count: `train` counts them and then supervises verl for the run's
    whole life. A torch that can be imported is on the path here, and must not be."""
    fake_torch = tmp_path / "site" / "torch"
    fake_torch.mkdir(parents=True)
    (fake_torch / "__init__.py").write_text("class cuda:\n    device_count = staticmethod(lambda: 5)\n")
    model = tmp_path / "model"
    user = [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}"]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")])),
        CUDA_VISIBLE_DEVICES="0,2",
        VERLBOX_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
        VERLBOX_EXPERIMENT="run",
        VERLBOX_SKIP_DISK_CHECK="1",
        COLUMNS="200",
    )
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        [sys.executable, "-c", TRAIN, VERL, str(tmp_path), STEP, json.dumps(user)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(result.stdout.splitlines()[-1]) == {"code": 0, "torch": False}, result.stdout + result.stderr
    assert "training on 1 node(s) x 2 GPU(s) (2 GPU(s) visible here): 2 GPU(s)" in result.stderr
    assert [record.step for record in read_metrics(tmp_path / "checkpoints" / "run" / progress.METRICS_FILE)] == [1]


def test_a_second_train_is_refused_at_once_under_compose_and_a_dead_console_still_holds(tmp_path: Path) -> None:
    """A second `train` on a running experiment exits (exit 3) instead of holding with advice that would stop
    the run going on; a halt whose console is a full disk (`2>/dev/full`) still holds instead of exiting 1 into
    Docker's restart of the same failure."""
    from verlbox.runtime.training.run_record import one_train

    halt_file, experiment = tmp_path / "halted", tmp_path / "experiment"
    preamble = (
        "import sys\nfrom pathlib import Path\nfrom verlbox.runtime import commands\n"
        "from verlbox.runtime.training import supervisor\n"
        f"supervisor.HALT_FILE = Path({str(halt_file)!r})\n"
    )
    refused = preamble + (
        "from verlbox.runtime.training.run_record import one_train\n"
        f"def second(args):\n    with one_train(Path({str(experiment)!r}), print):\n        return 0\n"
        "commands._train = second\nfrom verlbox.cli import main\nsys.exit(main(['train']))\n"
    )
    env = dict(os.environ, VERLBOX_ON_HALT="wait")
    with one_train(experiment, print):  # the run going on
        result = subprocess.run([sys.executable, "-c", refused], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and "another `train` runs this experiment" in result.stderr, result.stderr
    assert "holding here" not in result.stderr and not halt_file.exists()
    full = preamble + (
        "def full(args):\n    raise OSError(28, 'No space left on device', '/data/gsm8k/train.parquet')\n"
        "commands._train = full\nfrom verlbox.cli import main\nsys.exit(main(['train']))\n"
    )
    with open("/dev/full", "w") as dead:
        process = subprocess.Popen([sys.executable, "-c", full], env=env, stderr=dead)
        try:
            for _ in range(100):  # the halt file is written as the hold starts
                if halt_file.exists() or process.poll() is not None:
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            assert process.poll() is None, "a dead console ended the hold"
            assert halt_file.read_text().startswith("/data/gsm8k/train.parquet")
        finally:
            process.terminate()
            process.wait(timeout=10)


def test_mig_instances_in_cuda_visible_devices_count_as_one_device() -> None:
    """MIG-... entries counted as no GPU, so a MIG slice got a topology of 0 GPUs; CUDA 11/12 enumerate one."""
    gpus, migs = ["GPU-aaa", "GPU-bbb"], ["MIG-111", "MIG-222"]
    assert train.cuda_visible("MIG-111", gpus, migs) == 1
    assert train.cuda_visible("MIG-111,MIG-222", gpus, migs) == 1
    assert train.cuda_visible("MIG-999", gpus, migs) == 0
    assert train.cuda_visible("0,1", gpus, migs) == 2
