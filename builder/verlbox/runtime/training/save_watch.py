"""A save verl is writing, as the checkpoint folder shows it, whatever verl has printed.

verl's TaskRunner prints `local_global_step_folder: ...` as a save begins and a worker makes the step folder about
2 ms later; under Ray the line reaches train's console through Ray's log monitor, which polls every 0.1 s, so the
folder is on disk 50-100 ms before the line is read (39 of 40 saves measured). A stop held only from the line loses
every save it meets in that window. So the disk speaks first: a step folder made or written into since this attempt
of verl started, and neither written whole nor passed by the tracker since, is a save under way (whatever step the
tracker named before: a run resumed from an older path or started over writes below it). Nothing here reads a clock: the
tracker counts as rewritten when its inode, size or mtime differ from what they were as the attempt started, so
an NFS server whose clock runs behind confirms a save as soon as any other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from verlbox.runtime.training.checkpoints import ROLE_FOLDERS, STEP_FOLDER, TRACKER, is_complete, read_tracker

# (inode, size, mtime in ns) of a file or folder: changed by any write, read without trusting a clock
Stamp = tuple[int, int, int]


def stamp(path: Path) -> Stamp | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def folder_signature(step_folder: Path) -> frozenset[tuple[str, Stamp]]:
    """What a step folder holds, two levels down (the role folders' files): any file verl makes or rewrites changes
    it. A step folder holds a dozen entries, so this is read at every check."""
    entries: set[tuple[str, Stamp]] = set()
    pending = [(step_folder, 0)]
    while pending:
        folder, depth = pending.pop()
        try:
            children = list(os.scandir(folder))
        except OSError:
            continue
        for child in children:
            if (found := stamp(Path(child.path))) is not None:
                entries.add((os.path.relpath(child.path, step_folder), found))
            if depth == 0 and child.name in ROLE_FOLDERS and child.is_dir(follow_symlinks=False):
                pending.append((Path(child.path), 1))
    return frozenset(entries)


@dataclass
class SaveWatch:
    """The checkpoint FOLDER of one run, marked as each attempt of verl starts."""

    folder: Path
    load_contents: dict[str, tuple[str, ...]]

    def __post_init__(self) -> None:
        self._tracker: Stamp | None = None
        self._before: dict[Path, frozenset[tuple[str, Stamp]]] = {}

    def mark(self) -> None:
        """What the folder holds as an attempt starts: saves cut short by an earlier attempt are not under way."""
        self._tracker = stamp(self.folder / TRACKER)
        self._before = {path: folder_signature(path) for _, path in self._step_folders()}

    def written(self, step_folder: Path) -> bool:
        """verl has finished writing STEP_FOLDER: the tracker, written last, names its step and was rewritten during
        this attempt (a tracker already naming the step says nothing of this save), and its files are whole."""
        match = STEP_FOLDER.fullmatch(step_folder.name)
        if match is None or read_tracker(step_folder.parent) != int(match[1]):
            return False
        if stamp(step_folder.parent / TRACKER) == self._tracker:
            return False
        return is_complete(step_folder, self.load_contents)

    def under_way(self) -> Path | None:
        """The step folder verl is writing now, if any: made, or given a file it did not hold, since the mark, and
        neither written (written) nor passed by a tracker rewritten since (a save done before the last one). A
        folder that only lost files is verl's rotation emptying an older save: no save."""
        tracked = read_tracker(self.folder)
        moved_on = tracked if isinstance(tracked, int) and stamp(self.folder / TRACKER) != self._tracker else None
        for step, path in reversed(self._step_folders()):
            if path.is_symlink() or not self._written_into(path):
                continue
            if (moved_on is not None and step <= moved_on) or self.written(path):
                continue
            return path
        return None

    def _written_into(self, step_folder: Path) -> bool:
        before = self._before.get(step_folder)
        return before is None or bool(folder_signature(step_folder) - before)

    def _step_folders(self) -> list[tuple[int, Path]]:
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return []
        found = [(int(m[1]), Path(e.path)) for e in entries if (m := STEP_FOLDER.fullmatch(e.name)) and e.is_dir()]
        return sorted(found)
