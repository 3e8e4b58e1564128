"""A console that blocks rather than fails (an attached `docker compose up` whose terminal stalls, Ctrl-S,
`train | less`) must stall nothing: verl's output is drained into verl.log whatever the console does, a stop during
a save is still held until the save is whole, and SIGTERM ends `train` within its grace."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from test_save_hold import CONTENTS, start_train, whole_saves_only
from verlbox.runtime.training import checkpoints, progress

LINES = 20_000  # some 4 MB: sixty times what a pipe holds

# verl printing a great deal, then saving global_step_1 as under Ray (the folder first, the files over a second)
NOISY_VERL = f"""
import os, signal, sys, time, zipfile
from pathlib import Path
out, folder = Path(sys.argv[1]), Path(sys.argv[2])
signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))
for number in range({LINES}):
    print(f"(WorkerDict pid=2) noise {{number:06d}} " + "x" * 180)
sys.stdout.flush()
(out / "printed").touch()
step_folder = folder / "global_step_1"
step_folder.mkdir(parents=True)
print(f"(TaskRunner pid=1) local_global_step_folder: {{step_folder}}", flush=True)
for role in ("actor", "critic"):
    time.sleep(0.5)
    for prefix in ("model", "optim", "extra_state"):
        path = step_folder / role / f"{{prefix}}_world_size_1_rank_0.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("data.pkl", b"weights")
with zipfile.ZipFile(step_folder / "data.pt", "w") as archive:
    archive.writestr("data.pkl", b"loader")
(folder / "latest_checkpointed_iteration.txt").write_text("1")
(out / "saved").write_text(str(time.monotonic()))
time.sleep(600)
"""


def test_a_console_that_blocks_stalls_neither_verl_nor_the_hold_nor_the_stop(tmp_path: Path) -> None:
    (tmp_path / "verl.py").write_text(NOISY_VERL)
    folder = tmp_path / "checkpoints" / "run"
    # the console is a pipe nobody reads until train has ended: it fills after a few lines and then blocks
    process = start_train(tmp_path, [sys.executable, str(tmp_path / "verl.py"), str(tmp_path), str(folder)])
    deadline = time.monotonic() + 60
    while not (folder / "global_step_1").is_dir():
        assert process.poll() is None, "train ended on its own"
        assert time.monotonic() < deadline, "verl never got past its output: the blocked console stalled it"
        time.sleep(0.01)
    assert (tmp_path / "printed").exists()
    asked = time.monotonic()
    process.send_signal(signal.SIGTERM)
    while process.poll() is None:
        assert time.monotonic() - asked < 30, "SIGTERM did not end train: it waits on the console"
        time.sleep(0.05)
    output = process.stdout.read() if process.stdout else ""
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert (tmp_path / "saved").exists(), "the stop cut the save: the hold waited on the console"
    whole_saves_only(folder, 1)
    log = (folder / progress.LOG_FILE).read_text()
    assert sum(" noise " in line for line in log.splitlines()) == LINES
    assert "# verlbox: the console stopped taking lines at " in log
    assert checkpoints.is_complete(folder / "global_step_1", CONTENTS)
