"""Memory cgroups for measured workers: a peak the worker's own code cannot lower.

Runs in the trusted process. A worker's resident size (``VmHWM``) counts pages it shares
with its zygote (library code the grader faulted in), so student code could drop those
(``madvise(MADV_DONTNEED)``, ``munmap``) and hide an allocation of the same size under the
baseline. A memory cgroup is charged only for the pages a process faults in while it is a
member; pages charged elsewhere (the zygote's libraries, the page cache) never count, and
dropping them lowers nothing here. ``group()`` makes a fresh, empty cgroup and moves the
worker into it just before the measured call: the cgroup's peak (v1
``memory.max_usage_in_bytes``, v2 ``memory.peak``) is then the most the call held at once.

Where the platform has no writable memory controller (an unprivileged container, say),
``available()`` is False and ``grader.sandbox.usage`` measures by ``VmHWM`` instead (its
limit is written in docs/security.md). ``ATTENTION_GRADER_MEMCG=off`` forces that fallback
(a test of it; a platform where moving processes is refused).

Cgroups are made under this process's own memory cgroup (so every charge still counts in
whatever limits the platform set there) and removed when the worker is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

ENV_SWITCH = "ATTENTION_GRADER_MEMCG"     # "off": never use a cgroup (the VmHWM fallback)
V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
_counter = itertools.count()


@dataclass(frozen=True)
class Layout:
    """Where to make cgroups and how to read them."""
    parent: Path             # a directory this process may make cgroups in
    version: int             # 1 or 2

    @property
    def usage_file(self) -> str:
        return "memory.usage_in_bytes" if self.version == 1 else "memory.current"

    @property
    def peak_file(self) -> str:
        return "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"


def _own_cgroup(version: int) -> str | None:
    """This process's cgroup path in the v1 memory hierarchy or the v2 one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 1 and "memory" in controllers.split(","):
            return path
        if version == 2 and num == "0" and controllers == "":
            return path
    return None


def _probe(parent: Path, version: int) -> Layout | None:
    """A Layout if a cgroup can be made under ``parent`` with a readable peak."""
    layout = Layout(parent=parent, version=version)
    probe = parent / f"attention-probe-{os.getpid()}-{next(_counter)}"
    try:
        probe.mkdir()
    except OSError:
        return None
    try:
        ok = (probe / layout.peak_file).is_file() and (probe / "cgroup.procs").is_file()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return layout if ok else None


_layout: Layout | None | bool = False       # False: not looked for yet


def layout() -> Layout | None:
    """The cgroup layout of this platform, or None (found once per process)."""
    global _layout
    if os.environ.get(ENV_SWITCH, "").lower() in ("off", "0", "no"):
        return None
    if _layout is False:
        _layout = _find()
    return _layout


def _find() -> Layout | None:
    own = _own_cgroup(1)
    if own is not None and (V1_ROOT / "memory.usage_in_bytes").exists():
        found = _probe(V1_ROOT / own.lstrip("/"), 1)
        if found:
            return found
    own = _own_cgroup(2)
    if own is not None:
        for root in V2_ROOTS:
            base = root / own.lstrip("/")
            try:
                delegated = "memory" in (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            found = _probe(base, 2) if delegated else None
            if found:
                return found
    return None


def available() -> bool:
    return layout() is not None


class Group:
    """One fresh memory cgroup that one worker is moved into."""

    def __init__(self, where: Layout):
        self.layout = where
        self.path = where.parent / f"attention-worker-{os.getpid()}-{next(_counter)}"
        self.path.mkdir()

    def _read(self, name: str) -> int:
        return int((self.path / name).read_text().split()[0])

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) in: what it faults in from now is charged
        here. OSError if the kernel refuses."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def usage(self) -> int:
        """Bytes charged to the group now."""
        return self._read(self.layout.usage_file)

    def peak(self) -> int:
        """The most bytes charged to the group at once since it was made."""
        return self._read(self.layout.peak_file)

    def remove(self) -> None:
        """Remove the group once its processes are gone (retried briefly: a killed worker
        leaves the cgroup a moment after its SIGKILL); a process still in it (one the caller
        did not end) is moved back to the parent first, so no group is left behind."""
        for attempt in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if attempt >= 5:
                    self._release()
                time.sleep(0.02)

    def _release(self) -> None:
        """Move whatever is still in the group to its parent."""
        with contextlib.suppress(OSError, ValueError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                (self.layout.parent / "cgroup.procs").write_text(pid)


def group() -> Group | None:
    """A fresh cgroup, or None where there is none to be had."""
    where = layout()
    if where is None:
        return None
    try:
        return Group(where)
    except OSError:
        return None
