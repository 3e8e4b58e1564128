"""Tiny Python distributions made in place for tests: the files a hostile or a stand-in index serves."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path


def record_digest(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A wheel of FILES with its dist-info (METADATA, WHEEL, RECORD with each file's hash)."""
    info = f"{name}-{version}.dist-info"
    files = files | {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: verlbox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={record_digest(text.encode())},{len(text.encode())}" for path, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def make_sdist(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """An sdist NAME-VERSION.tar.gz of FILES (paths inside its top folder)."""
    path = folder / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for member, text in files.items():
            info = tarfile.TarInfo(f"{name}-{version}/{member}")
            info.size = len(text.encode())
            archive.addfile(info, io.BytesIO(text.encode()))
    return path
