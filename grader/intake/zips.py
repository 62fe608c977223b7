"""Zip submissions, unpacked safely: caps on members and sizes, no links, no paths out.

``check_zip`` says whether a zip may be unpacked (``ZipRejected`` with the reason
otherwise); ``unpack_zip`` unpacks one into an empty folder, enforcing the caps again on
the bytes actually decompressed. Used by ``grader grade`` and ``grader batch`` alike.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import zipfile
from pathlib import Path

from grader.errors import ZipRejected

ZIP_MAX_MEMBERS = 200
ZIP_MAX_TOTAL_BYTES = 20 << 20
ZIP_MAX_MEMBER_BYTES = 2 << 20


def _member_parts(name: str) -> list[str]:
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        raise ZipRejected(f"member {name!r} has an absolute path")
    parts = [p for p in re.split(r"[\\/]", name) if p not in ("", ".")]
    if ".." in parts:
        raise ZipRejected(f"member {name!r} points outside the folder ('..')")
    return parts


ZIP_MAX_FILE_BYTES = ZIP_MAX_TOTAL_BYTES + (4 << 20)   # a zip is not much bigger than its data
# A central directory entry: 46 bytes, the name (at most 1 KiB here) and extra fields.
ZIP_MAX_DIRECTORY_BYTES = ZIP_MAX_MEMBERS * (46 + 1024 + 1024)
_EOCD = struct.Struct("<4s4H2LH")           # end of central directory record (22 bytes)
_ZIP64_LOCATOR = struct.Struct("<4sLQL")    # zip64 end of central directory locator (20)
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")   # zip64 end of central directory record (56)


def precheck_zip(path: Path) -> None:
    """The caps checked from the end of the file alone (the end-of-central-directory
    record, and its zip64 form), before ``zipfile`` parses anything: a zip that claims a
    million members is refused in microseconds, not after its directory was read."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > ZIP_MAX_FILE_BYTES:
                raise ZipRejected(f"is {size / 2**20:.1f} MB; the limit is "
                                  f"{ZIP_MAX_FILE_BYTES >> 20} MB")
            tail_len = min(size, _EOCD.size + 0xFFFF + _ZIP64_LOCATOR.size)
            fh.seek(size - tail_len)
            tail = fh.read(tail_len)
            at = tail.rfind(b"PK\x05\x06")
            if at < 0 or len(tail) - at < _EOCD.size:
                raise ZipRejected("not a readable zip file (no end of central directory)")
            (_, _, _, _, entries, dir_size, dir_offset, _) = _EOCD.unpack_from(tail, at)
            if 0xFFFF in (entries,) or 0xFFFFFFFF in (dir_size, dir_offset):
                loc = at - _ZIP64_LOCATOR.size
                if loc < 0 or tail[loc:loc + 4] != b"PK\x06\x07":
                    raise ZipRejected("not a readable zip file (a broken zip64 record)")
                _, _, eocd64_offset, _ = _ZIP64_LOCATOR.unpack_from(tail, loc)
                if eocd64_offset > size - _ZIP64_EOCD.size:
                    raise ZipRejected("not a readable zip file (a broken zip64 record)")
                fh.seek(eocd64_offset)
                record = fh.read(_ZIP64_EOCD.size)
                if len(record) < _ZIP64_EOCD.size or record[:4] != b"PK\x06\x06":
                    raise ZipRejected("not a readable zip file (a broken zip64 record)")
                fields = _ZIP64_EOCD.unpack(record)
                entries, dir_size = fields[7], fields[8]
    except OSError as exc:
        raise ZipRejected(f"not a readable zip file ({exc.strerror or exc})") from None
    if entries > ZIP_MAX_MEMBERS:
        raise ZipRejected(f"has {entries} members; the limit is {ZIP_MAX_MEMBERS}")
    if dir_size > ZIP_MAX_DIRECTORY_BYTES:
        raise ZipRejected(f"its directory is {dir_size} bytes; the limit is "
                          f"{ZIP_MAX_DIRECTORY_BYTES}")


def check_zip(path: Path) -> list[zipfile.ZipInfo]:
    """The members of a zip that is safe to unpack; ZipRejected otherwise.

    Refused: more than ZIP_MAX_MEMBERS members, an absolute or '..' path, a symbolic link
    or other non-regular member, an encrypted member, a member over ZIP_MAX_MEMBER_BYTES
    or more than ZIP_MAX_TOTAL_BYTES in all (uncompressed), two members with one name.
    """
    precheck_zip(path)
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise ZipRejected(f"not a readable zip file ({exc})") from None
    if len(members) > ZIP_MAX_MEMBERS:
        raise ZipRejected(f"has {len(members)} members; the limit is {ZIP_MAX_MEMBERS}")
    total, seen = 0, set()
    for info in members:
        parts = _member_parts(info.filename)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise ZipRejected(f"member {info.filename!r} is a symbolic link")
        if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise ZipRejected(f"member {info.filename!r} is not a regular file or folder")
        if info.flag_bits & 0x1:
            raise ZipRejected(f"member {info.filename!r} is encrypted")
        if info.file_size > ZIP_MAX_MEMBER_BYTES:
            raise ZipRejected(f"member {info.filename!r} is {info.file_size / 2**20:.1f} MB "
                              f"uncompressed; the limit is {ZIP_MAX_MEMBER_BYTES >> 20} MB")
        total += info.file_size
        if total > ZIP_MAX_TOTAL_BYTES:
            raise ZipRejected(f"more than {ZIP_MAX_TOTAL_BYTES >> 20} MB uncompressed in total")
        key = "/".join(parts)
        if key in seen and not info.is_dir():
            raise ZipRejected(f"member {info.filename!r} appears twice")
        seen.add(key)
    return members


def unpack_zip(path: Path, dest: Path) -> None:
    """Unpack a zip that ``check_zip`` accepts into the empty folder ``dest``.

    Only folders and regular files are created, with O_EXCL|O_NOFOLLOW, and the size caps
    are enforced again on the bytes actually decompressed (a member may understate them).
    """
    members = check_zip(path)
    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in members:
                parts = _member_parts(info.filename)
                if not parts:
                    continue
                target = Path(dest, *parts)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out, zf.open(info) as src:
                    size = 0
                    while chunk := src.read(1 << 16):
                        size += len(chunk)
                        total += len(chunk)
                        if size > ZIP_MAX_MEMBER_BYTES or total > ZIP_MAX_TOTAL_BYTES:
                            raise ZipRejected(f"member {info.filename!r} unpacks to more than "
                                              "the size limits")
                        out.write(chunk)
    except ZipRejected:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as exc:
        raise ZipRejected(f"could not be unpacked ({exc})") from None
