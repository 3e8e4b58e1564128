"""verl 0.4.1's checkpoint folder, made safe to resume from before verl starts.

verl's FSDP trainer saves step N to `{trainer.default_local_dir}/global_step_N/` (ray_trainer.py,
`_save_checkpoint`): `actor/` and, with a critic, `critic/`, each holding every rank's
`model_world_size_W_rank_R.pt`, `optim_...` and `extra_state_...` plus rank 0's `huggingface/` and
`fsdp_config.json` (fsdp_checkpoint_manager.py, `save_checkpoint`), then `data.pt` (the dataloader),
then `latest_checkpointed_iteration.txt` beside the step folders (opened with "w": truncated, then
written). With resume_mode=auto it resumes from the folder that file names (checkpoint_manager.py,
`find_latest_ckpt_path`, which calls int() on its text). Four things go wrong over a long run:

- a crash between truncating and writing leaves the tracker empty, and int("") fails every start;
  a crash mid-save, or a folder deleted by hand, leaves it naming a folder that cannot be loaded;
- verl rotates `max_*_ckpt_to_keep` saves through a list held in memory, so every restart forgets
  the earlier saves and they stay on disk for good (its rotation also deletes only `actor/` and
  `critic/`, leaving a folder with just `data.pt`);
- a disk that fills mid-save kills the run hours in, with a half-written step folder;
- verl saves no config, so a restart with another GPU count, batch, learning rate or model resumes
  wrongly or fails inside verl (see RUN_RECORD).

So, before verl starts: a resume whose settings changed is refused, this run's settings are recorded,
the tracker is made to name the newest complete save (or removed), stale step folders are removed, and
the room is checked against what a restart will need (the saves it keeps and those verl writes until the
next one), by one rule at the start and at every restart. Only folders verl wrote here are saves: a link
(another run's) or a folder holding files verl never writes (someone's own) is never resumed from,
removed or counted as room.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verlbox.errors import PreflightFailed
from verlbox.files import unreadable_folder, write_atomically
from verlbox.runtime.training import hub
from verlbox.runtime.training.overrides import OverrideError, merge_overrides, override_int, override_value

TRACKER = "latest_checkpointed_iteration.txt"
# verl names step folders with f"global_step_{int}" (ray_trainer.py _save_checkpoint), so no sign and no
# leading zeros: any other name is not verl's and is never touched
STEP_FOLDER = re.compile(r"global_step_(0|[1-9][0-9]*)")
# written by the driver only after every rank of the actor and the critic has saved (their save_checkpoint
# calls return after a barrier). Its presence says the ranks finished writing, not that the bytes reached the
# disk: verl never fsyncs, so after a power cut each file is checked whole as well (whole_file)
DATALOADER_FILE = "data.pt"
# torch.save's format (a ZIP archive since torch 1.6): a local header first, the end-of-central-directory
# record last (22 bytes, then a comment torch never writes)
ZIP_START, ZIP_END, ZIP_END_MAX = b"PK\x03\x04", b"PK\x05\x06", 22 + 65535
PICKLE_START = b"\x80"  # a pickle's protocol opcode: how torch.save's older format begins
# load_contents/save_contents entry -> the prefix of its per-rank file (fsdp_checkpoint_manager.py,
# save_checkpoint: f"{prefix}_world_size_{world_size}_rank_{rank}.pt")
SHARD_PREFIXES = {"model": "model", "optimizer": "optim", "extra": "extra_state"}
SHARD_FILE = re.compile(r"(model|optim|extra_state)_world_size_([1-9][0-9]*)_rank_(0|[1-9][0-9]*)\.pt")
# what verl writes in a step folder (ray_trainer.py, _save_checkpoint) and in each role's folder beside the rank
# files (fsdp_checkpoint_manager.py, save_checkpoint): name -> a folder (True) or a file (False)
ROLE_FOLDERS = ("actor", "critic")
KEEP_KEYS = tuple(f"trainer.max_{role}_ckpt_to_keep" for role in ROLE_FOLDERS)
STEP_ENTRIES = {**dict.fromkeys(ROLE_FOLDERS, True), DATALOADER_FILE: False}
ROLE_ENTRIES = {"huggingface": True, "fsdp_config.json": False, "lora_adapter": True}  # lora_rank > 0: the adapter
# verl's default for both roles (ppo_trainer.yaml: checkpoint.save_contents; load_contents follows it)
DEFAULT_CONTENTS = ("model", "optimizer", "extra")
SKIP_DISK_CHECK = "VERLBOX_SKIP_DISK_CHECK"

# The size of one save, from the model (measured for Qwen2.5-0.5B: actor 6.03 GiB = weights 2.35 GiB
# with the tied embedding saved twice + optimizer 3.68 GiB; critic 5.5 GiB; about 11.5 GiB per step):
# verl loads actor and critic weights in fp32 unless fsdp_config.model_dtype says otherwise
# (fsdp_workers.py: actor default float32, critic default "fp32"), and the profile keeps fp32
WEIGHT_BYTES = 4
# AdamW (fsdp_workers.py) keeps exp_avg and exp_avg_sq per parameter, in the parameters' fp32
OPTIMIZER_BYTES = 8
# per role: extra_state (RNG, LR scheduler), fsdp_config.json and huggingface/ (config and tokenizer, 11 MiB
# for Qwen2.5), and the step's data.pt: a generous round figure beside gigabytes of shards
ROLE_ALLOWANCE_BYTES = 64 * 2**20
# safetensors' own bound on its JSON header (the format's specification: 100 MB)
SAFETENSORS_HEADER_LIMIT = 100_000_000


@dataclass(frozen=True)
class Settings:
    """What verl will do with its checkpoint folder, read from the merged overrides (before Hydra runs)."""

    folder: Path
    resume_mode: str
    resume_from: Path | None
    keep: int | None  # None: verl keeps every save
    save_freq: int
    # role -> what verl loads from its folder on resume ("model", "optimizer", "extra")
    load_contents: dict[str, tuple[str, ...]]
    save_contents: dict[str, tuple[str, ...]]
    actor_model: Path
    critic_model: Path | None

    @property
    def local_folder(self) -> Path | None:
        """The folder as verl resolves it (relative to its working directory); None: Hydra resolves it later."""
        if "${" in str(self.folder):
            return None
        return self.folder if self.folder.is_absolute() else Path.cwd() / self.folder

    @classmethod
    def from_overrides(cls, overrides: list[str]) -> Settings:
        # verl 0.4.1 uses a critic exactly for GAE (ray_trainer.py, RayPPOTrainer.__init__), the yaml's default
        with_critic = (override_value(overrides, "algorithm.adv_estimator") or "gae") == "gae"
        sections = {"actor": "actor_rollout_ref.actor", **({"critic": "critic"} if with_critic else {})}
        save = {
            role: _contents(overrides, f"{s}.checkpoint.save_contents", DEFAULT_CONTENTS)
            for role, s in sections.items()
        }
        load = {role: _contents(overrides, f"{s}.checkpoint.load_contents", save[role]) for role, s in sections.items()}
        keeps = [_optional_int(overrides, f"trainer.max_{role}_ckpt_to_keep") for role in sections]
        resume_from = override_value(overrides, "trainer.resume_from_path")
        return cls(
            folder=Path(override_value(overrides, "trainer.default_local_dir") or ""),
            resume_mode=override_value(overrides, "trainer.resume_mode") or "auto",
            resume_from=Path(resume_from) if resume_from and resume_from != "null" else None,
            # whole step folders go, so the role that keeps more decides; verl keeps all when a role has no bound
            keep=None if None in keeps else max(k for k in keeps if k is not None),
            save_freq=override_int(overrides, "trainer.save_freq", -1),
            load_contents=load,
            save_contents=save,
            actor_model=Path(override_value(overrides, "actor_rollout_ref.model.path") or ""),
            critic_model=Path(override_value(overrides, "critic.model.path") or "") if with_critic else None,
        )


def keep_two_at_least(overrides: list[str], say: Callable[[str], None]) -> list[str]:
    """OVERRIDES with a bound of one kept save raised to two, said in one line: verl 0.4.1 removes the kept save
    before it writes the next (checkpoint_manager.py, save_checkpoint), so with one, a save cut short leaves no save
    at all and the next start begins again at step 0."""
    raised = [key for key in KEEP_KEYS if _optional_int(overrides, key) == 1]
    if not raised:
        return overrides
    say(
        f"{', '.join(f'{key}=1' for key in raised)} raised to 2: verl removes the kept save before it writes the "
        "next, so with one a save cut short (a stop, a crash, a full disk) would leave nothing to resume from"
    )
    return merge_overrides(overrides, [f"{key}=2" for key in raised])


def _optional_int(overrides: list[str], key: str) -> int | None:
    """verl's bound on kept saves: null, or 0 and below, means none (checkpoint_manager.py save_checkpoint)."""
    if (override_value(overrides, key) or "null").lower() in ("null", "none"):
        return None
    value = override_int(overrides, key, 0)
    return value if value > 0 else None


def _contents(overrides: list[str], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = override_value(overrides, key)
    if value is None or value.startswith("${"):  # load_contents interpolates save_contents in verl's yaml
        return default
    if not (value.startswith("[") and value.endswith("]")):
        raise OverrideError(f"{key}={value}: expected a list such as [model,optimizer,extra]")
    return tuple(item.strip().strip("'\"") for item in value[1:-1].split(",") if item.strip())


@dataclass(frozen=True)
class StepFolder:
    step: int
    path: Path
    complete: bool


@dataclass(frozen=True)
class Foreign:
    """A folder named as verl names a save that verl did not write here: never resumed from, removed or counted."""

    step: int
    path: Path
    why: str


def _named_steps(folder: Path) -> list[tuple[int, Path]]:
    """The folders (or links) in FOLDER named as verl names a step folder, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = STEP_FOLDER.fullmatch(entry.name)
        if match and (entry.is_dir() or entry.is_symlink()):  # a dangling link is named too, never followed
            found.append((int(match[1]), entry))
    return sorted(found)


def scan(folder: Path, load_contents: dict[str, tuple[str, ...]]) -> list[StepFolder]:
    """This run's step folders in FOLDER, oldest first, each marked complete when verl could resume from it; the
    foreign ones (foreign_folders) are not among them."""
    return [
        StepFolder(step, path, is_complete(path, load_contents))
        for step, path in _named_steps(folder)
        if foreign_reason(path) is None
    ]


def foreign_folders(folder: Path) -> list[Foreign]:
    """The step folders in FOLDER that verl did not write here, oldest first, each with why."""
    return [Foreign(step, path, why) for step, path in _named_steps(folder) if (why := foreign_reason(path))]


def foreign_reason(step_folder: Path) -> str | None:
    """Why STEP_FOLDER is not a save verl wrote here; None: it holds nothing but what verl writes.

    By the structure verl writes, not by a marker: saves written before verlbox (or by verl alone) carry none, and
    a marker written after verl's save would leave the folder unmarked across a crash mid-save. A link is another
    run's folder, and a file or folder verl never writes is someone's own (notes beside the weights). A link under
    a name verl never writes is passed over: verl never loads it and removing the folder leaves its target."""
    if step_folder.is_symlink():
        return f"a link to {os.readlink(step_folder)}"
    try:
        reasons = (_unexpected(entry, step_folder, expected) for entry, expected in _entries(step_folder))
        return next(filter(None, reasons), None)
    except OSError as exc:  # what cannot be read cannot be told apart from someone's own folder
        return f"cannot be read ({exc.strerror or exc})"


def _entries(step_folder: Path) -> Iterator[tuple[Path, bool | None]]:
    """Each entry of STEP_FOLDER and of its role folders, with whether verl writes a folder (True), a file (False)
    or nothing (None) under its name there."""
    for entry in sorted(step_folder.iterdir()):
        yield entry, STEP_ENTRIES.get(entry.name)
        if entry.name in ROLE_FOLDERS and entry.is_dir() and not entry.is_symlink():
            for inner in sorted(entry.iterdir()):
                yield inner, ROLE_ENTRIES.get(inner.name, False if SHARD_FILE.fullmatch(inner.name) else None)


def _unexpected(entry: Path, step_folder: Path, folder_expected: bool | None) -> str | None:
    """Why ENTRY is not what verl writes there (FOLDER_EXPECTED as _entries gives it); None: it is, or it is a link
    that verl never loads."""
    shown = entry.relative_to(step_folder)
    if folder_expected is None:
        return None if entry.is_symlink() else f"holds {shown}, which verl never writes"
    if entry.is_symlink():  # verl would load through it: another run's weights
        return f"its {shown} is a link to {os.readlink(entry)}"
    if entry.is_dir() != folder_expected:
        return f"its {shown} is not the {'folder' if folder_expected else 'file'} verl writes"
    return None


def whole_file(path: Path) -> bool:
    """PATH as torch.save leaves it when the write finished: not empty, and a ZIP archive ending with its
    end-of-central-directory record (a tail read, nothing loaded). A power cut leaves 0 bytes or a cut tail."""
    try:
        size = path.stat().st_size
        if size == 0:
            return False
        with path.open("rb") as handle:
            start = handle.read(len(ZIP_START))
            handle.seek(max(0, size - ZIP_END_MAX))
            tail = handle.read()
    except OSError:
        return False
    if start.startswith(PICKLE_START):  # an older, non-ZIP torch.save: its length is all there is to check
        return True
    return start == ZIP_START and ZIP_END in tail  # zeros where data never reached the disk are not a save


def is_complete(step_folder: Path, load_contents: dict[str, tuple[str, ...]]) -> bool:
    """Every role holds every rank's files, each whole, for one world size (the one verl saved with), and a
    whole data.pt is there."""
    if not whole_file(step_folder / DATALOADER_FILE):
        return False
    sizes = saved_world_sizes(step_folder, load_contents)
    return sizes is None or bool(sizes)


def saved_world_sizes(step_folder: Path, load_contents: dict[str, tuple[str, ...]]) -> set[int] | None:
    """The world sizes W for which every role holds every rank's files; None: nothing is loaded from the roles."""
    common: set[int] | None = None
    for role, contents in load_contents.items():
        complete = _complete_world_sizes(
            step_folder / role, {SHARD_PREFIXES[c] for c in contents if c in SHARD_PREFIXES}
        )
        if complete is not None:
            common = complete if common is None else common & complete
    return common


def _complete_world_sizes(role_folder: Path, prefixes: set[str]) -> set[int] | None:
    """The world sizes W for which ROLE_FOLDER has each prefix's file of every rank 0..W-1; None: nothing asked."""
    if not prefixes:
        return None
    found: dict[int, set[tuple[str, int]]] = {}
    if role_folder.is_dir():
        for entry in role_folder.iterdir():
            match = SHARD_FILE.fullmatch(entry.name)
            if match and entry.is_file() and whole_file(entry):
                found.setdefault(int(match[2]), set()).add((match[1], int(match[3])))
    return {size for size, files in found.items() if {(p, r) for p in prefixes for r in range(size)} <= files}


def folder_size(path: Path) -> int:
    """Bytes of the regular files under PATH; symlinks are neither followed nor counted."""
    total = 0
    for root, _, files in os.walk(path, followlinks=False):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def show_size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"


def read_tracker(folder: Path) -> int | str | None:
    """The step the tracker names, read as find_latest_ckpt_path reads it; a str says what is wrong with it;
    None: there is none (verl's "train from scratch")."""
    try:
        raw = (folder / TRACKER).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"could not be read ({exc.strerror or exc})"
    try:
        return int(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return "was empty" if not raw.strip() else f"held {raw[:20]!r}, not a step number"


@dataclass(frozen=True)
class TrackerFix:
    problem: str
    step: int | None  # the step the tracker should name; None: remove it


def tracker_fix(
    tracked: int | str | None, steps: list[StepFolder], foreign: Sequence[Foreign] = ()
) -> TrackerFix | None:
    """How to make the tracker name the newest complete save, when what it says cannot be resumed from (a FOREIGN
    folder is another run's, or someone's own). A tracker naming a complete save is left alone, even an older one:
    it is verl's own record."""
    newest = next((s.step for s in reversed(steps) if s.complete), None)
    if tracked is None:
        # with a complete save here, a first save was cut short between data.pt and the tracker
        return TrackerFix("was missing", newest) if newest is not None else None
    if isinstance(tracked, str):
        return TrackerFix(tracked, newest)
    named = next((s for s in steps if s.step == tracked), None)
    if named is None:
        other = next((f.why for f in foreign if f.step == tracked), None)
        problem = f"is not this run's save ({other})" if other else "is missing"
        return TrackerFix(f"named global_step_{tracked}, which {problem}", newest)
    if not named.complete:
        return TrackerFix(f"named global_step_{tracked}, which is incomplete (a save cut short)", newest)
    return None


def stale_folders(steps: list[StepFolder], keep: int | None, protected: set[Path]) -> list[tuple[StepFolder, str]]:
    """Step folders to remove, oldest first, with why: complete ones beyond the KEEP newest, and incomplete
    ones older than the newest complete save. Never the newest complete one, a PROTECTED one or a symlink."""
    complete = [s for s in steps if s.complete]
    if not complete:
        return []
    newest = complete[-1]
    kept = {s.path for s in complete[-keep:]} if keep else {s.path for s in complete}
    stale = []
    for folder in steps:
        if folder.path in protected or folder.path == newest.path or folder.path.is_symlink():
            continue
        if folder.complete and folder.path not in kept:
            stale.append((folder, f"beyond the {keep} newest complete saves (trainer.max_*_ckpt_to_keep={keep})"))
        elif not folder.complete and folder.step < newest.step:
            stale.append((folder, f"incomplete and older than {newest.path.name}, the newest complete save"))
    return stale


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    # parameters a tied embedding adds to the actor's saved state dict (it holds embed_tokens and lm_head)
    tied_embedding: int
    # parameters of an untied lm_head, which the critic (a token-classification model) does not have
    lm_head: int


def safetensors_header(file: Path) -> dict[str, Any]:
    """FILE's JSON header; ValueError where the first 8 bytes give a length the format does not allow (a damaged
    or foreign file: read as it stands, random bytes ask for exabytes)."""
    with file.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if length > SAFETENSORS_HEADER_LIMIT:
            raise ValueError(f"a header of {length} bytes")
        return json.loads(handle.read(length))


def model_size(model_folder: Path) -> ModelSize | None:
    """Parameter counts from the safetensors headers (exact, nothing loaded); None without safetensors."""
    shapes: dict[str, list[int]] = {}
    try:
        for file in sorted(model_folder.glob("*.safetensors")):
            header = safetensors_header(file)
            shapes |= {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}
        config = json.loads((model_folder / "config.json").read_text())
        tied = bool(config.get("tie_word_embeddings")) and "lm_head.weight" not in shapes
        tied_embedding = config["vocab_size"] * config["hidden_size"] if tied else 0
        parameters = sum(math.prod(shape) for shape in shapes.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not shapes:
        return None
    return ModelSize(parameters, tied_embedding, math.prod(shapes.get("lm_head.weight", [0])))


def estimate_step_bytes(actor: ModelSize, critic: ModelSize | None, save_contents: dict[str, tuple[str, ...]]) -> int:
    """Bytes one verl save takes: per role, fp32 weights ("model"; the actor's tied embedding twice), AdamW's
    two fp32 moments ("optimizer"), a full fp32 HF copy ("hf_model"), plus ROLE_ALLOWANCE_BYTES."""
    total = 0
    for role, size in (("actor", actor), ("critic", critic)):
        if size is None or role not in save_contents:
            continue
        contents = save_contents[role]
        parameters = size.parameters if role == "actor" else size.parameters - size.lm_head
        # FSDP's sharded state dict holds a tied embedding under both names; AdamW and an HF copy hold it once
        sharded = parameters + (size.tied_embedding if role == "actor" else 0)
        total += ROLE_ALLOWANCE_BYTES
        total += sharded * WEIGHT_BYTES * ("model" in contents)
        total += parameters * WEIGHT_BYTES * ("hf_model" in contents)
        total += parameters * OPTIMIZER_BYTES * ("optimizer" in contents)
    return total


class DiskFull(PreflightFailed):
    """The disk filled while verl saved: the machine is short of room, the input is not wrong (exit 3, as for a disk
    too small at the start)."""


@dataclass(frozen=True)
class Room:
    """What this run's saves can use on their disk: its free space and what this run's step folders hold there (a
    restart prunes them, or verl writes a cut one again), and the complete saves a restart keeps now."""

    free: int
    held: int
    kept: int
    cut: Path | None  # the newest save cut short, which verl writes again
    cut_bytes: int  # what it holds

    @property
    def total(self) -> int:
        return self.free + self.held


def saves_needed(keep: int | None, kept: int) -> int:
    """The saves the disk must hold at once: those a restart keeps, and those verl writes until the next restart
    prunes. verl's rotation list starts empty at every start (checkpoint_manager.py: previous_saved_paths), so it
    writes up to KEEP saves of its own on top of the KEPT here, and every later restart keeps KEEP again. So the
    start asks for what its first restart will: a start that passes is not held at a crash days in. Without a
    bound verl keeps every save: those here and the next one."""
    return kept + 1 if keep is None else max(kept, keep) + keep


def measure_room(folder: Path, steps: list[StepFolder], removed: list[StepFolder]) -> Room:
    """FOLDER's room once the REMOVED step folders are gone (a dry run has left them: their bytes count as room
    either way, as they are free space after a real removal)."""
    left = [s for s in steps if s not in removed]
    cut = [s for s in left if not s.complete]
    existing = next(parent for parent in (folder, *folder.parents) if parent.exists())
    return Room(
        free=shutil.disk_usage(existing).free,
        held=sum(folder_size(s.path) for s in steps),  # a removed folder is gone: nothing under it is counted
        kept=sum(s.complete for s in left),
        cut=cut[-1].path if cut else None,
        cut_bytes=folder_size(cut[-1].path) if cut else 0,
    )


def check_free_space(
    settings: Settings, step_bytes: int, room: Room, environ: Mapping[str, str], *, dry_run: bool
) -> str:
    """One line on the room for the saves; PreflightFailed when it is short (DiskFull when a save was cut short
    for want of it), unless SKIP_DISK_CHECK=1 or a dry run. One rule for the start and every restart."""
    saves = saves_needed(settings.keep, room.kept)
    need = saves * step_bytes
    bound = (
        f"a restart keeps {max(room.kept, settings.keep)} save(s) and verl writes up to {settings.keep} more until "
        f"the next one (trainer.max_*_ckpt_to_keep={settings.keep})"
        if settings.keep
        else f"verl keeps every save, so this counts the {room.kept} here and the next one"
    )
    figures = (
        f"{settings.folder} has {show_size(room.free)} free and {show_size(room.held)} in this run's saves, room for "
        f"{show_size(room.total)}; {bound}: {saves} saves of about {show_size(step_bytes)} need {show_size(need)}"
    )
    if room.total >= need:
        return f"checkpoints: {figures}"
    if environ.get(SKIP_DISK_CHECK) == "1":
        return f"checkpoints: {figures}; starting anyway ({SKIP_DISK_CHECK}=1)"
    error: type[PreflightFailed] = PreflightFailed
    sentence = f"{figures}: free some space, keep fewer saves, or set {SKIP_DISK_CHECK}=1 to start anyway"
    # a save cut short where its free space and its own bytes are less than a save: the disk filled under it
    if room.cut is not None and room.free + room.cut_bytes < step_bytes:
        error, sentence = DiskFull, disk_full(settings.folder, room.cut.name, room, step_bytes)
    if dry_run:
        return f"checkpoints: would refuse to start: {sentence}"
    raise error(f"checkpoints: {sentence}")


def disk_full(folder: Path, cut: str, room: Room, step_bytes: int) -> str:
    return (
        f"the disk filled while verl wrote {cut}: {folder} has {show_size(room.free)} free and {cut} holds "
        f"{show_size(room.cut_bytes)}, less than the {show_size(step_bytes)} of a save; free some space on that "
        f"disk (verl writes {cut} again), or set {SKIP_DISK_CHECK}=1 to start anyway"
    )


def prepare(overrides: list[str], environ: Mapping[str, str], say: Callable[[str], None], *, dry_run: bool) -> None:
    """Repair the tracker, remove stale step folders and check the room for the saves, one line each; a dry run
    changes nothing and says what it would do."""
    settings = Settings.from_overrides(overrides)
    folder = settings.local_folder
    if folder is None:
        say(f"checkpoints: trainer.default_local_dir={settings.folder} is resolved by Hydra later; not checked")
        return
    steps = scan(folder, settings.load_contents)
    target = repair_tracker(settings, folder, steps, say, dry_run=dry_run)
    protected = {folder / f"global_step_{target}"} if isinstance(target, int) else set()
    if settings.resume_mode == "resume_path" and settings.resume_from:
        protected |= {s.path for s in steps if s.path.resolve() == settings.resume_from.resolve()}
    removed = remove_stale(steps, settings.keep, protected, say, dry_run=dry_run)
    if settings.save_freq <= 0:  # verl saves only with save_freq > 0 (ray_trainer.py, fit)
        return
    step_bytes = size_a_save(settings, say)
    if step_bytes is not None:
        room = measure_room(folder, steps, removed)
        say(check_free_space(settings, step_bytes, room, environ, dry_run=dry_run))


def repair_tracker(
    settings: Settings, folder: Path, steps: list[StepFolder], say: Callable[[str], None], *, dry_run: bool
) -> int | str | None:
    """Point the tracker at the newest complete save, or remove it, when verl could not resume from what it names;
    the step verl will resume from (a str: what is wrong with a tracker that resume_mode leaves alone)."""
    tracked = read_tracker(folder)
    fix = tracker_fix(tracked, steps, foreign_folders(folder)) if settings.resume_mode == "auto" else None
    if fix and fix.step is None:
        action = "would remove" if dry_run else "removed"
        say(f"checkpoints: {TRACKER} {fix.problem}; {action} it: no complete save here, so verl starts from step 0")
        if not dry_run:
            try:
                (folder / TRACKER).unlink()
            except OSError as exc:
                raise PreflightFailed(
                    f"checkpoints: cannot remove {folder / TRACKER} ({exc.strerror or exc})"
                ) from None
    elif fix:
        action = "would point" if dry_run else "pointed"
        say(f"checkpoints: {TRACKER} {fix.problem}; {action} it at global_step_{fix.step}, the newest complete save")
        if not dry_run:
            write_atomically(folder / TRACKER, str(fix.step))  # no newline, as verl writes it
    return fix.step if fix else tracked


def remove_stale(
    steps: list[StepFolder],
    keep: int | None,
    protected: set[Path],
    say: Callable[[str], None],
    *,
    dry_run: bool,
) -> list[StepFolder]:
    """Remove the stale step folders, one line each; those removed (a dry run: those it would remove)."""
    removed = []
    for step_folder, reason in stale_folders(steps, keep, protected):
        size = folder_size(step_folder.path)
        if not dry_run:
            try:
                shutil.rmtree(step_folder.path)
            except OSError as exc:
                say(f"checkpoints: could not remove {step_folder.path} ({exc.strerror or exc}); left as it is")
                continue
        removed.append(step_folder)
        action = "would remove" if dry_run else "removed"
        say(f"checkpoints: {action} {step_folder.path.name} ({show_size(size)}): {reason}")
    return removed


def size_a_save(settings: Settings, say: Callable[[str], None]) -> int | None:
    """The bytes one save takes, from the models' safetensors headers; None (said) when they cannot be read."""
    actor = model_size(settings.actor_model)
    critic = model_size(settings.critic_model) if settings.critic_model else None
    if actor is None or (settings.critic_model and critic is None):
        unsized = settings.actor_model if actor is None else settings.critic_model
        why = unreadable_folder(Path(unsized)) or unsized_reason(Path(unsized))
        say(f"checkpoints: {why}; free space not checked")
        return None
    return estimate_step_bytes(actor, critic, settings.save_contents)


def unsized_reason(model_folder: Path) -> str:
    """Why model_size could not count MODEL_FOLDER's parameters."""
    if not any(model_folder.glob("*.safetensors")):
        return f"no safetensors weights in {model_folder} to size a save from"
    if not (model_folder / "config.json").is_file():
        return f"{model_folder} has safetensors weights but no config.json (verl cannot load it without one)"
    for file in sorted(model_folder.glob("*.safetensors")):
        try:
            safetensors_header(file)
        except (OSError, ValueError):
            return f"{file} is not a readable safetensors file (damaged, cut short, or another format)"
    return f"the safetensors headers or config.json in {model_folder} cannot be read"


# Resuming. verl saves no config beside its checkpoints and takes the run's settings from the new start, so a
# restart with other settings resumes wrongly or not at all: verl loads only its own world size's rank files
# (FileNotFoundError .../model_world_size_2_rank_0.pt with two GPUs over a one-GPU save); torch's
# Optimizer.load_state_dict puts back the saved param_groups (lr, weight_decay) and the scheduler its own, so a
# new lr is silently ignored; the step comes from the folder's name while the total is counted again from the
# new batch and epochs (64 -> 128 prompts after step 50 ends the run early). So verlbox records the settings a
# resume must keep, beside the tracker, at every start, and compares them before verl resumes.
RUN_RECORD = "verlbox-run.json"
RUN_RECORD_FORMAT = 1
WORLD_SIZE = "trainer.n_gpus_per_node x trainer.nnodes"
# the settings a resume must keep, with why, for the refusal; optim keys as verl 0.4.1's workers read them
# (fsdp_workers.py: lr_warmup_steps also for the critic, through .get); total_training_steps under optim is
# injected by the trainer from trainer.total_*, so it is not a setting of its own
KEPT: dict[str, str] = {
    WORLD_SIZE: "verl loads only the rank files of its own world size",
    "data.train_batch_size": "the saved step counts batches of the old size, the run's total those of the new",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "the PPO updates per step would change midway through the run",
    "critic.ppo_mini_batch_size": "the PPO updates per step would change midway through the run",
    "actor_rollout_ref.rollout.n": "the samples per prompt would change midway through the run",
    "trainer.total_epochs": "the saved step and the LR schedule count towards the old total",
    "trainer.total_training_steps": "the saved step and the LR schedule count towards the old total",
    "algorithm.adv_estimator": "GAE saves a critic and GRPO none",
    "profile": "the saved state was trained under another profile's precision and sizes",
    **{
        f"{section}.optim.{key}": "the saved optimizer and LR scheduler state would win over the new value"
        for section in ("actor_rollout_ref.actor", "critic")
        for key in (
            "lr",
            "lr_warmup_steps",
            "lr_warmup_steps_ratio",
            "min_lr_ratio",
            "num_cycles",
            "warmup_style",
            "weight_decay",
        )
    },
    "actor_rollout_ref.model.path": "the saved weights are another model's",
    "critic.model.path": "the saved weights are another model's",
}
# a fetched model is the same model wherever its folder is: its commit, when both records have one, decides
MODEL_COMMITS = {"actor_rollout_ref.model.path": "actor model commit", "critic.model.path": "critic model commit"}


def run_record(overrides: list[str], profile: str) -> dict[str, str | None]:
    """The settings a resume must keep, as this run gives them; None: not set, so verl's default."""
    record: dict[str, str | None] = {key: override_value(overrides, key) for key in KEPT}
    world_size = override_int(overrides, "trainer.n_gpus_per_node", 1) * override_int(overrides, "trainer.nnodes", 1)
    record |= {WORLD_SIZE: str(world_size), "profile": profile}
    for path_key, commit_key in MODEL_COMMITS.items():
        fetched = hub.recorded(Path(record[path_key] or ""))
        if fetched is not None:
            record[commit_key] = fetched.commit
    return record


def resumed_step(settings: Settings, folder: Path) -> StepFolder | None:
    """The complete save verl will load at this start (after prepare's tracker repair); None: it starts afresh."""
    if settings.resume_mode == "resume_path" and settings.resume_from:
        path = settings.resume_from if settings.resume_from.is_absolute() else Path.cwd() / settings.resume_from
        match = STEP_FOLDER.fullmatch(path.name)
        if match and path.is_dir() and is_complete(path, settings.load_contents):
            return StepFolder(int(match[1]), path, True)
        return None
    if settings.resume_mode != "auto":
        return None
    steps = scan(folder, settings.load_contents)
    tracked = read_tracker(folder)
    fix = tracker_fix(tracked, steps)
    target = fix.step if fix else tracked
    return next((s for s in steps if s.step == target and s.complete), None)


def newest_step(overrides: list[str]) -> int | None:
    """The step verl would resume from now (None: none, or a folder Hydra resolves later)."""
    settings = Settings.from_overrides(overrides)
    saved = resumed_step(settings, settings.local_folder) if settings.local_folder else None
    return saved.step if saved else None


def read_run_record(path: Path) -> dict[str, str | None] | None:
    """The settings a record holds; None: no record (saved before verlbox kept one), or one that cannot be read."""
    try:
        settings = json.loads(path.read_text())["settings"]
        return {str(key): None if value is None else str(value) for key, value in settings.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def resume_changes(
    saved: StepFolder,
    old: dict[str, str | None] | None,
    new: dict[str, str | None],
    load_contents: dict[str, tuple[str, ...]],
) -> list[tuple[str, str, str]]:
    """(setting, saved value, this run's value) for each setting that differs; a setting an older record lacks
    is not compared. The world size comes from the save's own rank files, which are there without a record."""
    changes = []
    sizes = saved_world_sizes(saved.path, load_contents)
    if sizes and int(new[WORLD_SIZE] or 1) not in sizes:
        changes.append((WORLD_SIZE, " or ".join(map(str, sorted(sizes))), new[WORLD_SIZE] or "1"))
    if old is None:
        return changes
    same_model = {key for key, commit in MODEL_COMMITS.items() if old.get(commit) and new.get(commit)}
    for key in [*KEPT, *MODEL_COMMITS.values()]:
        if key == WORLD_SIZE or key in same_model or key not in old:
            continue
        if key in MODEL_COMMITS.values() and not new.get(key):
            continue  # the model folder is now one filled by hand: its path is compared instead
        if not _same(old[key], new.get(key)):
            changes.append((key, _show(old[key]), _show(new.get(key))))
    return changes


def _same(old: str | None, new: str | None) -> bool:
    if old is None or new is None:
        return old == new
    try:  # overrides are text: 1e-6 and 0.000001 are one learning rate
        return float(old) == float(new)
    except ValueError:
        return old == new


def _show(value: str | None) -> str:
    return "unset (verl's default)" if value is None else value


def next_free(folder: Path) -> Path:
    """FOLDER-2, FOLDER-3, ...: the first that does not exist, for a new experiment beside the old one."""
    return next(path for n in range(2, 10**6) if not (path := folder.with_name(f"{folder.name}-{n}")).exists())


def check_resume(
    overrides: list[str], profile: str, environ: Mapping[str, str], say: Callable[[str], None], *, dry_run: bool
) -> None:
    """Name the step folders that are not this run's saves; refuse a start that would resume a save made with other
    settings (PreflightFailed, one sentence naming what changed and the two ways on); then record this run's
    settings beside the tracker for the next start. A dry run says what it would refuse and writes nothing."""
    settings = Settings.from_overrides(overrides)
    folder = settings.local_folder
    if folder is None:  # prepare says so; Hydra resolves it later
        return
    foreign = foreign_folders(folder)
    if foreign:
        named = ", ".join(f"{f.path.name} ({f.why})" for f in foreign)
        say(f"checkpoints: not this run's saves, so never resumed from, removed or counted as room: {named}")
    new = run_record(overrides, profile)
    saved = resumed_step(settings, folder)
    if saved is not None:
        old = read_run_record(saved.path.parent / RUN_RECORD)
        changes = resume_changes(saved, old, new, settings.load_contents)
        if changes:
            sentence = refusal(saved, changes, folder, override_value(overrides, "trainer.experiment_name"), environ)
            if not dry_run:
                raise PreflightFailed(f"checkpoints: {sentence}")
            say(f"checkpoints: would refuse to start: {sentence}")
            return
        checked = "its settings match this run's" if old else f"it has no readable {RUN_RECORD}: only its world size"
        say(f"checkpoints: verl resumes from {saved.path.name}; {checked} ({WORLD_SIZE}={new[WORLD_SIZE]})")
    if not dry_run:
        record = {"format": RUN_RECORD_FORMAT, "settings": new}
        write_atomically(folder / RUN_RECORD, json.dumps(record, indent=2) + "\n")


def refusal(
    saved: StepFolder,
    changes: list[tuple[str, str, str]],
    folder: Path,
    experiment: str | None,
    environ: Mapping[str, str],
) -> str:
    """What changed, why it matters, and the two ways on: the old settings, or a fresh folder beside this one."""
    fresh = next_free(folder)
    # the profile puts the run in {checkpoints}/{experiment}: VERLBOX_EXPERIMENT moves both, for every restart
    uses_experiment = experiment == folder.name and (environ.get("VERLBOX_EXPERIMENT") or folder.name) == folder.name
    way = f"VERLBOX_EXPERIMENT={fresh.name}" if uses_experiment else f"trainer.default_local_dir={fresh}"
    reasons = dict.fromkeys(KEPT.get(key, KEPT["actor_rollout_ref.model.path"]) for key, _, _ in changes)
    return (
        f"{saved.path} was saved with {' and '.join(f'{key}={old}' for key, old, _ in changes)} and this run asks "
        f"for {' and '.join(new for _, _, new in changes)} ({'; '.join(reasons)}): restore the "
        f"setting{'s' if len(changes) > 1 else ''}, or start a new experiment in a fresh folder with {way} "
        "(nothing is deleted)"
    )
