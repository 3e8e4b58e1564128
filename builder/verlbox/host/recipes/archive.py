"""A source archive a recipe pins (Apex's): its name, its hashes, where it comes from and how a user makes it
by hand. building/archives.py finds, fetches and accepts it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchivePin:
    name: str
    sha256: str
    # sha256 of the decompressed tar stream; None: only the exact file is accepted
    tar_sha256: str | None
    upstream_url: str
    # how a user makes the archive by hand, for the one-line error when it cannot be fetched
    how_to_make: str
