"""Lock a forked worker down: namespaces, an empty root, no privileges, resource limits.

Three modes, chosen by what the kernel allows (``detect_mode`` in the zygote tries each):

- ``root``: the grader runs as root. New mount, network, IPC, UTS and PID namespaces; an
  empty root with read-only binds of the interpreter and site-packages only; a private
  tmpfs /tmp; then setgroups([]) + setgid/setuid to a per-slot unprivileged uid.
- ``userns``: unprivileged user namespaces work (the grader is not root, or it is root in a
  container that refuses the plain namespaces). The same namespaces and root, inside a user
  namespace that maps only the worker's own uid (the grader's, or the slot uid when the
  grader is root); all capabilities are dropped before student code runs.
- ``plain``: neither. A new session, resource limits, a clean environment, the slot uid when
  the grader is root, and, where the kernel has them (Linux >= 5.13 / 6.7 / 6.12), Landlock
  rules: read-only access to the interpreter, its packages and the submission only, one
  private writable folder, no TCP, no signals or ptrace out of the sandbox. Without Landlock
  the worker can read whatever the grader's uid can read (see docs/security.md).

In every mode: all file descriptors but the channel are closed, rlimits (CPU soft == hard,
address space, file size, open files, processes, no core) are set, NO_NEW_PRIVS is on, the
worker is a child subreaper (every process it starts stays below it), and a seccomp filter
refuses the system calls a lab never needs and a jail breaker wants (namespaces, mount,
ptrace, bpf, keyrings, io_uring, ...; in plain mode also new sockets and signals to the
grader's processes).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import signal
import struct

try:        # absent on Windows: this module then only names the modes (grader.sandbox.backends)
    import resource
except ImportError:
    resource = None
from dataclasses import dataclass

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
ALL_NAMESPACE_FLAGS = NAMESPACES | CLONE_NEWUSER | CLONE_NEWCGROUP
CLONE_THREAD = 0x00010000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP = 1, 4, 22
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38

NEW_ROOT = "/mnt"          # covered by a tmpfs in the worker's own mount namespace
SUBMISSION_DIR = "/submission"


@dataclass(frozen=True)
class SandboxMode:
    """What a mode gives a worker (the module docstring says why): the one place a mode's
    capabilities are written. Looked up once, by name (``MODES``); code asks the table,
    never compares names."""
    name: str
    needs_root: bool        # only a grader running as root can give it
    namespaces: bool        # new mount, network, IPC, UTS and PID namespaces, an empty root
    user_namespace: bool    # ... inside a user namespace that maps the worker's uid only
    keeper: bool            # a keeper process per worker (root: the zygote keeps them itself)
    probed: bool            # ``detect_mode`` tries it for real (the last resort is not tried)

    @property
    def worker_sets_uid(self) -> bool:
        """As root, the worker itself becomes the slot uid (a user namespace's keeper does so
        before unsharing, so its map holds that uid)."""
        return not self.user_namespace

    @property
    def confined_by_landlock(self) -> bool:
        """No namespaces: Landlock rules, a stricter seccomp filter (no new sockets, no
        signals to the grader's processes), a private temp folder made by the keeper, and
        orphans reaped by the keeper instead of the end of a PID namespace."""
        return not self.namespaces


# Strongest first: the order ``detect_mode`` tries them in.
MODES: dict[str, SandboxMode] = {m.name: m for m in (
    SandboxMode("root", needs_root=True, namespaces=True, user_namespace=False, keeper=False,
                probed=True),
    SandboxMode("userns", needs_root=False, namespaces=True, user_namespace=True, keeper=True,
                probed=True),
    SandboxMode("plain", needs_root=False, namespaces=False, user_namespace=False, keeper=True,
                probed=False),
)}

try:        # no C library to open by None on Windows: the jail's calls are then absent
    _libc = ctypes.CDLL(None, use_errno=True)
except (OSError, TypeError):
    _libc = None
MACHINE = platform.machine()


class JailError(OSError):
    pass


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise JailError(err, f"{what}: {os.strerror(err)}")


def prctl(option, arg2=0):
    _check(_libc.prctl(option, ctypes.c_ulong(arg2), 0, 0, 0), f"prctl({option})")


def unshare(flags):
    _check(_libc.unshare(flags), "unshare")


def setns(fd, nstype):
    _check(_libc.setns(fd, nstype), "setns")


def mount(source, target, fstype, flags, data=None):
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


# --------------------------------------------------------------------------- modes

def detect_mode(probe_config: dict | None = None) -> SandboxMode:
    """The strongest mode this process can give its workers (see the module docstring).

    Each candidate is tried for real in a throw-away child (namespaces, the empty root, the
    uid change), because a container may allow ``unshare`` and still refuse a mount.
    """
    for mode in MODES.values():
        if not mode.probed:
            return mode                       # the last resort: nothing to try
        if (os.geteuid() == 0 or not mode.needs_root) and _probe(mode, probe_config or {}):
            return mode
    raise JailError("no sandbox mode is left to try")


def _probe(mode: SandboxMode, config: dict) -> bool:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.closerange(3, 1 << 16)
            enter_namespaces(mode, config.get("uid"))
            inner = os.fork()  # pid 1 of the new PID namespace, like a worker
            if inner == 0:
                try:
                    empty = config.get("submission") or "/"
                    build_root(submission=empty, read_only_paths=config.get("read_only_paths", []),
                               hide_paths=[], tmp_size_mb=1)
                    os._exit(0)
                except BaseException:  # noqa: BLE001
                    os._exit(1)
            _, status = os.waitpid(inner, 0)
            code = os.waitstatus_to_exitcode(status)
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def enter_namespaces(mode: SandboxMode, uid: int | None = None) -> None:
    """In the first child: new namespaces (the next fork becomes pid 1 of the new PID ns)."""
    if mode.namespaces and not mode.user_namespace:
        unshare(NAMESPACES)
    elif mode.user_namespace:
        if os.geteuid() == 0 and uid is not None:
            # Root whose container refuses plain namespaces: become the slot uid first, so
            # the worker is that uid on the host too, never root.
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        uid, gid = os.getuid(), os.getgid()
        unshare(CLONE_NEWUSER | NAMESPACES)
        # A non-dumpable process (the zygote is one) cannot write its own id maps.
        prctl(PR_SET_DUMPABLE, 1)
        # Map only our own uid, to itself: inside we are that same unprivileged uid (so an
        # exec cannot regain root's capabilities) and hold capabilities only until dropped.
        with open("/proc/self/setgroups", "w") as fh:
            fh.write("deny")
        with open("/proc/self/uid_map", "w") as fh:
            fh.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"{gid} {gid} 1")


# --------------------------------------------------------------------------- the empty root

def _bind(source: str, writable: bool = False) -> None:
    """Bind ``source`` at the same path under the new root, read-only unless writable."""
    target = NEW_ROOT + source
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    if not writable:
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        try:
            mount(None, target, None, flags)
        except JailError:
            # In a user namespace the flags of a bound mount are locked: keep noexec too.
            mount(None, target, None, flags | MS_NOEXEC)


def build_root(*, submission: str, read_only_paths: list[str], hide_paths: list[str],
               tmp_size_mb: int) -> None:
    """An empty root holding only the interpreter, its packages and the submission.

    ``hide_paths`` are covered with empty read-only tmpfs mounts: secrets that happen to lie
    inside a bound tree (the grader package, with its hidden suites, inside site-packages).
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # never leak our mounts to the host
    mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0755")
    # The private, size-capped temp folders first: an interpreter or packages that live
    # under /tmp (a clone and its .venv there) are then bound inside them, read-only,
    # instead of being hidden by them.
    for tmp in ("/tmp", "/dev/shm"):
        os.makedirs(NEW_ROOT + tmp, exist_ok=True)
        mount("tmpfs", NEW_ROOT + tmp, "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={tmp_size_mb}m,mode=1777")
    for path in read_only_paths:
        if os.path.islink(path):
            os.makedirs(os.path.dirname(NEW_ROOT + path), mode=0o755, exist_ok=True)
            os.symlink(os.readlink(path), NEW_ROOT + path)
        elif os.path.exists(path):
            _bind(path)
    for path in hide_paths:
        if os.path.islink(NEW_ROOT + path):
            continue
        if os.path.isdir(NEW_ROOT + path):
            mount("tmpfs", NEW_ROOT + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY,
                  "size=4k,mode=0555")
        elif os.path.exists(NEW_ROOT + path):
            mount("/dev/null", NEW_ROOT + path, None, MS_BIND)
    os.makedirs(NEW_ROOT + SUBMISSION_DIR, mode=0o755)
    mount(submission, NEW_ROOT + SUBMISSION_DIR, None, MS_BIND)
    try:
        mount(None, NEW_ROOT + SUBMISSION_DIR, None,
              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except JailError:
        mount(None, NEW_ROOT + SUBMISSION_DIR, None,
              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_REC)
    os.makedirs(NEW_ROOT + "/dev", mode=0o755, exist_ok=True)
    for dev in ("null", "zero", "urandom", "random"):
        _bind("/dev/" + dev, writable=True)
    os.makedirs(NEW_ROOT + "/proc", mode=0o555)
    # A container that masks parts of its /proc forbids a fresh one inside a user
    # namespace: the worker then simply has no /proc (it needs none). Read-only: nothing in
    # it is the worker's to change (e.g. clear_refs, which would reset the memory
    # high-water mark the grader measures a call by: grader/sandbox/usage.py).
    with contextlib.suppress(JailError):
        mount("proc", NEW_ROOT + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    # The scaffolding (and every directory created above) becomes read-only.
    mount(None, NEW_ROOT, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
          "size=16m,mode=0755")
    os.chroot(NEW_ROOT)
    os.chdir("/")


# --------------------------------------------------------------------------- limits

def mapped_bytes() -> int:
    """The address space this process has mapped (a torch-loaded zygote: ~0.65 GB)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def set_limits(limits: dict, *, own_tasks: int = 0, vm_bytes: int | None = None) -> None:
    """rlimits; CPU soft == hard so a SIGXCPU handler cannot buy time."""
    def lim(which, value):
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)  # an unprivileged process cannot raise its hard limit
        resource.setrlimit(which, (value, value))

    lim(resource.RLIMIT_CORE, 0)
    lim(resource.RLIMIT_CPU, max(1, int(limits["cpu_s"])))
    lim(resource.RLIMIT_FSIZE, int(limits["file_mb"]) << 20)
    lim(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    lim(resource.RLIMIT_MSGQUEUE, 0)
    lim(resource.RLIMIT_MEMLOCK, 64 << 10)
    # RLIMIT_NPROC counts every task (threads too) of the real uid in the user namespace:
    # as root each slot has its own uid and in userns mode the worker's namespace counts
    # alone; in plain mode without a uid of its own the grader's tasks share the budget,
    # so they are added in.
    lim(resource.RLIMIT_NPROC, int(limits["processes"]) + own_tasks)
    # The address-space cap counts what the zygote already mapped (torch: ~0.65 GB).
    if vm_bytes is None:
        vm_bytes = mapped_bytes()
    lim(resource.RLIMIT_AS, vm_bytes + (int(limits["memory_mb"]) << 20))


def children_of(pid: int, above: int | None = None) -> list[int]:
    """Pids whose parent is ``pid`` (a scan of /proc), looking only at pids > ``above``.

    Used by the trusted side (is anything the student started still alive?) and by a
    keeper (what is left to kill); /proc/<pid>/task/*/children is not on every kernel.
    """
    found = []
    needle = str(pid).encode()
    try:
        entries = os.listdir("/proc")
    except OSError:         # no /proc (macOS, Windows): nothing to find this way
        return found
    for entry in entries:
        if not entry.isdigit() or (above is not None and int(entry) <= above):
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()   # the name may hold spaces and ")"
        if len(fields) > 1 and fields[1] == needle:
            found.append(int(entry))
    return found


def count_own_tasks() -> int:
    """Tasks (threads included) of this real uid, as RLIMIT_NPROC counts them."""
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                pass
    return count


def drop_capabilities() -> None:
    """capset(2) with empty sets: what is left of the user namespace's root powers goes."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header = Header(0x20080522, 0)
    data = (Data * 2)()
    _check(_libc.syscall(SYSCALLS["capset"], ctypes.byref(header), ctypes.byref(data)),
           "capset")


# --------------------------------------------------------------------------- huge pages

MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
HUGE_PAGE = 1 << 21


def collapse_huge_pages() -> int:
    """Back this process's anonymous memory (heap and anonymous maps) with 2 MB pages.

    Best effort: returns how many regions the kernel collapsed (0 without MADV_COLLAPSE).
    """
    madvise = _libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    collapsed = 0
    try:
        with open("/proc/self/maps") as fh:
            maps = fh.read().splitlines()
    except OSError:
        return 0
    for line in maps:
        parts = line.split()
        if len(parts) < 5 or not parts[1].startswith("rw") or (
                len(parts) > 5 and parts[5] != "[heap]"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        start = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        end &= ~(HUGE_PAGE - 1)
        if end - start < HUGE_PAGE:
            continue
        madvise(start, end - start, MADV_HUGEPAGE)
        if madvise(start, end - start, MADV_COLLAPSE) == 0:
            collapsed += 1
    return collapsed


MADV_POPULATE_READ = 22


def populate_mapped_files() -> int:
    """Fault in every page of this process's file-backed mappings (libraries' code and data).

    A forked worker shares its zygote's library pages but starts without them in its page
    tables, so the first use of each torch kernel counts its code pages into the worker's
    resident size: tens of MB that are not the call's memory. Populated before a measured
    call, they are in the baseline (grader/sandbox/usage.py). Best effort: returns how many
    mappings were populated (0 where the kernel lacks MADV_POPULATE_READ, Linux < 5.14).
    Student code gains nothing by stopping it: its peak could only look larger.
    """
    madvise = _libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        with open("/proc/self/maps") as fh:
            maps = fh.read().splitlines()
    except OSError:
        return 0
    done = 0
    for line in maps:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/") or not parts[1].startswith("r"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if madvise(start, end - start, MADV_POPULATE_READ) == 0:
            done += 1
    return done


M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024


def map_large_allocations() -> bool:
    """Give every allocation of 128 kB or more its own mapping, returned to the kernel when
    freed (glibc's default threshold grows up to 32 MB as big blocks are freed, and then
    big blocks come from the heap, whose free space, non-resident since the zygote, becomes
    resident as it is reused). With it, a measured call's resident peak is what it held at
    once, not what the allocator happened to touch. False where mallopt refused (or this
    C library has none: macOS, Windows)."""
    mallopt = getattr(_libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


# --------------------------------------------------------------------------- seccomp

# System call numbers: x86_64 (asm/unistd_64.h) and the generic table (aarch64).
_X86_64 = dict(
    capset=126, socket=41, clone=56, fork=57, vfork=58, fcntl=72, flock=73, kill=62, ptrace=101, syslog=103, rt_sigqueueinfo=129,
    pivot_root=155, chroot=161, acct=163, mount=165, umount2=166, swapon=167, swapoff=168,
    reboot=169, iopl=172, ioperm=173, init_module=175, delete_module=176, quotactl=179,
    tkill=200, lookup_dcookie=212, tgkill=234, kexec_load=246, add_key=248, request_key=249,
    keyctl=250, unshare=272, rt_tgsigqueueinfo=297, perf_event_open=298,
    name_to_handle_at=303, open_by_handle_at=304, setns=308, process_vm_readv=310,
    process_vm_writev=311, finit_module=313, kexec_file_load=320, bpf=321, userfaultfd=323,
    pidfd_send_signal=424, io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
    open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433,
    clone3=435, pidfd_getfd=438, process_madvise=440, mount_setattr=442,
    landlock_create_ruleset=444, landlock_add_rule=445, landlock_restrict_self=446,
    shmget=29, shmat=30, shmctl=31, semget=64, semop=65, semctl=66, shmdt=67, msgget=68,
    msgsnd=69, msgrcv=70, msgctl=71, semtimedop=220, memfd_create=319,
    memfd_secret=447, splice=275, tee=276, vmsplice=278, sendfile=40, copy_file_range=326,
)
_GENERIC = dict(
    capset=91, lookup_dcookie=18, umount2=39, mount=40, pivot_root=41, chroot=51,
    quotactl=60, acct=89, unshare=97, kexec_load=104, init_module=105, delete_module=106,
    syslog=116, ptrace=117, kill=129, tkill=130, tgkill=131, rt_sigqueueinfo=138,
    fcntl=25, flock=32, reboot=142, socket=198, add_key=217, request_key=218, keyctl=219, clone=220, swapon=224,
    swapoff=225, rt_tgsigqueueinfo=240, perf_event_open=241, name_to_handle_at=264,
    open_by_handle_at=265, setns=268, process_vm_readv=270, process_vm_writev=271,
    finit_module=273, bpf=280, userfaultfd=282, kexec_file_load=294, pidfd_send_signal=424,
    io_uring_setup=425, io_uring_enter=426, io_uring_register=427, open_tree=428,
    move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, clone3=435,
    pidfd_getfd=438, process_madvise=440, mount_setattr=442, landlock_create_ruleset=444,
    landlock_add_rule=445, landlock_restrict_self=446,
    msgget=186, msgctl=187, msgrcv=188, msgsnd=189, semget=190, semctl=191, semtimedop=192,
    semop=193, shmget=194, shmctl=195, shmat=196, shmdt=197, memfd_create=279,
    memfd_secret=447, vmsplice=75, splice=76, tee=77, sendfile=71, copy_file_range=285,
)
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _GENERIC)}
AUDIT_ARCH, SYSCALLS = _ARCHES.get(MACHINE, (None, _X86_64))

# Never needed by a lab; wanted by whoever tries to leave the jail or reach the kernel.
DENIED_ALWAYS = [
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "open_tree",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at", "syslog",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "lookup_dcookie", "iopl", "ioperm",
    # Memory that RLIMIT_AS does not count, and that can outlive the worker (plain mode has
    # no IPC namespace): SysV shared memory, message queues and semaphores, and memfds.
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget",
    "semop", "semctl", "semtimedop", "memfd_create", "memfd_secret",
    # Pages moved into a socket or pipe without the kernel copying them from the caller's
    # memory: the relay takes off a worker's CPU time what copying its calls' bytes costs
    # (engine.relay_cost). (shutil's file copy falls back to read and write.)
    "splice", "tee", "vmsplice", "sendfile", "copy_file_range",
]
SIGNAL_CALLS = ["kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"]

_LD_W_ABS, _JEQ, _JSET, _RET = 0x20, 0x15, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16   # struct seccomp_data; arg0's low word (LE)
_OFF_ARG1 = 24                              # arg1's low word
# fcntl's record-lock commands (F_GETLK, F_SETLK, F_SETLKW and the open-file-description
# ones): see seccomp_program.
LOCK_COMMANDS = (5, 6, 7, 36, 37, 38)


def _ins(code, k, jt=0, jf=0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def seccomp_program(*, plain: bool, protected_pids: list[int]) -> list[bytes]:
    """The BPF filter as a list of instructions (see ``install_seccomp``)."""
    nrs = SYSCALLS
    eperm = _RET_ERRNO | errno.EPERM
    prog = [
        _ins(_LD_W_ABS, _OFF_ARCH),
        _ins(_JEQ, AUDIT_ARCH, 1, 0),
        _ins(_RET, _RET_KILL_PROCESS),          # another ABI (int 0x80): never legitimate
        _ins(_LD_W_ABS, _OFF_NR),
    ]
    if MACHINE == "x86_64":                     # x32 system calls (nr | 0x40000000)
        prog += [_ins(0x35, 0x40000000, 0, 1), _ins(_RET, eperm)]   # JGE
    for name in DENIED_ALWAYS:
        prog += [_ins(_JEQ, nrs[name], 0, 1), _ins(_RET, eperm)]
    # clone3 passes its flags in memory a filter cannot read: say "no such call", so glibc
    # falls back to clone, whose flags it can read.
    prog += [_ins(_JEQ, nrs["clone3"], 0, 1), _ins(_RET, _RET_ERRNO | errno.ENOSYS)]
    # A thread, never a process: work done in another process is not in the worker's
    # accounting (an auto-reaped child's CPU time never reaches its cutime), and a lab's
    # code has nothing to start one for. (glibc's fork, posix_spawn and system are clones
    # without CLONE_THREAD; x86_64 also has fork and vfork, the generic table has neither.)
    for name in ("fork", "vfork"):
        if name in nrs:
            prog += [_ins(_JEQ, nrs[name], 0, 1), _ins(_RET, eperm)]
    # No file locks: the lock table of a file every worker can open (the submission's own,
    # a library under /usr) is a channel between workers that a measured call could use to
    # have its work done elsewhere (atk_flock_relay_generate); no lab needs a lock.
    prog += [_ins(_JEQ, nrs["flock"], 0, 1), _ins(_RET, eperm)]
    block = [_ins(_LD_W_ABS, _OFF_ARG1)]
    for i, cmd in enumerate(LOCK_COMMANDS):
        block.append(_ins(_JEQ, cmd, len(LOCK_COMMANDS) - i, 0))     # -> RET eperm
    block += [_ins(_RET, _RET_ALLOW), _ins(_RET, eperm)]
    prog += [_ins(_JEQ, nrs["fcntl"], 0, len(block))] + block
    prog += [_ins(_JEQ, nrs["clone"], 0, 6), _ins(_LD_W_ABS, _OFF_ARG0),
             _ins(_JSET, ALL_NAMESPACE_FLAGS, 0, 1), _ins(_RET, eperm),
             _ins(_JSET, CLONE_THREAD, 0, 1), _ins(_RET, _RET_ALLOW), _ins(_RET, eperm)]
    if plain:
        # No network namespace: no new sockets at all (the channel already exists).
        prog += [_ins(_JEQ, nrs["socket"], 0, 1), _ins(_RET, _RET_ERRNO | errno.EACCES)]
        prog += [_ins(_JEQ, nrs["pidfd_send_signal"], 0, 1), _ins(_RET, eperm)]
        # No PID namespace: signals may not reach the grader, the zygote, the worker's
        # keeper, their process groups, or everyone (-1).
        targets = {0xFFFFFFFF}
        for pid in protected_pids:
            if pid > 1:
                targets |= {pid, (-pid) & 0xFFFFFFFF}
        targets = sorted(targets)
        for name in SIGNAL_CALLS:
            block = [_ins(_LD_W_ABS, _OFF_ARG0)]
            for i, t in enumerate(targets):
                block.append(_ins(_JEQ, t, len(targets) - i, 0))   # -> RET eperm
            block += [_ins(_RET, _RET_ALLOW), _ins(_RET, eperm)]
            prog += [_ins(_JEQ, nrs[name], 0, len(block))] + block
    prog.append(_ins(_RET, _RET_ALLOW))
    return prog


def install_seccomp(*, plain: bool, protected_pids: list[int]) -> bool:
    """Load the filter (NO_NEW_PRIVS must be on). False where the architecture is unknown."""
    if AUDIT_ARCH is None:
        return False
    prog = seccomp_program(plain=plain, protected_pids=protected_pids)
    if len(prog) > 4096:
        raise JailError(errno.E2BIG, "seccomp filter too long")
    raw = ctypes.create_string_buffer(b"".join(prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(raw))
    _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(2), ctypes.byref(fprog), 0, 0),
           "seccomp")
    return True


# --------------------------------------------------------------------------- landlock

_LL_FS = [1 << i for i in range(16)]   # EXECUTE .. IOCTL_DEV
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1, 2, 4, 8
LL_MAKE_CHAR, LL_MAKE_BLOCK, LL_REFER, LL_TRUNCATE, LL_IOCTL_DEV = 64, 2048, 8192, 16384, 32768


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is off or unknown."""
    if "landlock_create_ruleset" not in SYSCALLS or AUDIT_ARCH is None:
        return 0
    version = _libc.syscall(SYSCALLS["landlock_create_ruleset"], None, ctypes.c_size_t(0),
                            ctypes.c_uint32(1))
    return max(0, version)


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1                      # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= LL_REFER
    if abi >= 3:
        rights |= LL_TRUNCATE
    if abi >= 5:
        rights |= LL_IOCTL_DEV
    return rights


def install_landlock(*, read_paths: list[str], write_paths: list[str],
                     hide_paths: list[str]) -> int:
    """Confine this process (and all it starts) to the given paths; returns the ABI used.

    Read paths get read access, write paths read-write access (never execute), everything
    else nothing. A read path that contains a hidden path is opened up child by child
    around it, since Landlock can only grant.
    """
    abi = landlock_abi()
    if abi < 1:
        return 0
    handled_fs = _fs_rights(abi)

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64),
                    ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(handled_fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = _libc.syscall(SYSCALLS["landlock_create_ruleset"], ctypes.byref(attr),
                            ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        err = ctypes.get_errno()
        raise JailError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    file_only = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV
    read = LL_READ_FILE | LL_READ_DIR
    write = handled_fs & ~(LL_EXECUTE | LL_MAKE_CHAR | LL_MAKE_BLOCK)
    hidden = [os.path.realpath(p) for p in hide_paths]

    def add(path: str, access: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not os.path.isdir(path):
                access &= file_only
            rule = PathBeneath(access & handled_fs, fd)
            _check(_libc.syscall(SYSCALLS["landlock_add_rule"], ruleset, 1,
                                 ctypes.byref(rule), 0), f"landlock rule {path}")
        finally:
            os.close(fd)

    def add_around(path: str, access: int) -> None:
        real = os.path.realpath(path)
        if any(real == h for h in hidden):
            return
        inner = [h for h in hidden if h.startswith(real.rstrip("/") + "/")]
        if not inner or not os.path.isdir(real):
            add(real, access)
            return
        for entry in os.listdir(real):
            add_around(os.path.join(real, entry), access)

    try:
        for path in read_paths:
            add_around(path, read)
        for path in write_paths:
            add(path, write)
        _check(_libc.syscall(SYSCALLS["landlock_restrict_self"], ruleset, 0),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


# --------------------------------------------------------------------------- the lock-down

def lock_down(*, mode: SandboxMode, channel_fd: int, submission: str, uid: int | None,
              read_only_paths: list[str], hide_paths: list[str], limits: dict,
              private_tmp: str | None = None, protected_pids: list[int] = (),
              keep_fds: tuple[int, ...] = ()) -> dict:
    """In the worker (pid 1 of its namespace unless mode is plain), before student code.

    Returns what the worker should know about itself: its folder, temp dir and the layers
    that are on (``landlock`` ABI, ``seccomp``).
    """
    os.setsid()
    change_uid = uid is not None and os.geteuid() == 0 and mode.worker_sets_uid
    own_tasks = count_own_tasks() if mode.confined_by_landlock and not change_uid else 0
    keep = sorted({channel_fd, *keep_fds})
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(1 << 16, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    vm_bytes = mapped_bytes()   # read while the host's /proc is still there
    if mode.namespaces:
        build_root(submission=submission, read_only_paths=read_only_paths,
                   hide_paths=hide_paths, tmp_size_mb=int(limits["tmp_mb"]))
        folder, tmp = SUBMISSION_DIR, "/tmp"
    else:
        folder, tmp = submission, private_tmp or "/tmp"
    set_limits(limits, own_tasks=own_tasks, vm_bytes=vm_bytes)
    if change_uid:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    elif mode.user_namespace:
        drop_capabilities()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 0)
    # Set after the uid change: a credential change clears the parent-death signal.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # Orphans of anything the student starts are re-parented here, not to the host's init,
    # so "the worker has no children" means "nothing the student started is alive".
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    landlock = 0
    if mode.confined_by_landlock:
        landlock = install_landlock(
            read_paths=[*read_only_paths, submission, "/dev/urandom", "/dev/null",
                        "/dev/zero"],
            write_paths=[tmp] if private_tmp else [], hide_paths=hide_paths)
    seccomp = install_seccomp(plain=mode.confined_by_landlock,
                              protected_pids=list(protected_pids))
    os.environ.clear()
    os.environ.update({"HOME": tmp, "TMPDIR": tmp, "PATH": "/usr/bin:/bin",
                       "OMP_NUM_THREADS": "1"})
    try:
        os.chdir(tmp)
    except OSError:
        os.chdir("/")
    return {"folder": folder, "tmp": tmp, "landlock": landlock, "seccomp": seccomp}
