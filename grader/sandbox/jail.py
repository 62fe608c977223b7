"""Lock a forked worker down: namespaces, an empty root, no privileges, resource limits.

Three modes, chosen by what the kernel allows (``detect_mode`` in the zygote):

- ``root``: the grader runs as root. New mount, network, IPC, UTS and PID namespaces; an
  empty root with read-only binds of the interpreter and site-packages only; a private
  tmpfs /tmp; then setgroups([]) + setgid/setuid to a per-slot unprivileged uid.
- ``userns``: not root, but unprivileged user namespaces work. The same namespaces and root,
  inside a user namespace that maps only the grader's own uid; all capabilities are
  dropped before student code runs.
- ``plain``: neither. A new session, resource limits and a clean environment only; no
  network isolation and no hidden paths (the submission can read whatever the grader's
  uid can read). The README tells instructors to run the grader as root or allow user
  namespaces, or inside a disposable container.

In every mode: all file descriptors but the channel are closed, rlimits (CPU soft == hard,
address space, file size, open files, processes, no core) are set, NO_NEW_PRIVS is on, and
the worker dies with its parent.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE = 1, 38, 4
PR_SET_CHILD_SUBREAPER = 36

NEW_ROOT = "/mnt"          # covered by a tmpfs in the worker's own mount namespace
SUBMISSION_DIR = "/submission"

_libc = ctypes.CDLL(None, use_errno=True)


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


def detect_mode() -> str:
    """Which isolation this process can give its workers (see the module docstring)."""
    forced = os.environ.get("GRADER_SANDBOX_MODE")
    if forced in ("root", "userns", "plain"):
        return forced
    if os.geteuid() == 0:
        return "root"
    pid = os.fork()
    if pid == 0:
        try:
            unshare(CLONE_NEWUSER | NAMESPACES)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return "userns" if os.waitstatus_to_exitcode(status) == 0 else "plain"


def enter_namespaces(mode: str) -> None:
    """In the first child: new namespaces (the next fork becomes pid 1 of the new PID ns)."""
    if mode == "root":
        unshare(NAMESPACES)
    elif mode == "userns":
        uid, gid = os.getuid(), os.getgid()
        unshare(CLONE_NEWUSER | NAMESPACES)
        # Map only our own uid, to itself: inside we are that same unprivileged uid (so an
        # exec cannot regain root's capabilities) and hold capabilities only until dropped.
        with open("/proc/self/setgroups", "w") as fh:
            fh.write("deny")
        with open("/proc/self/uid_map", "w") as fh:
            fh.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"{gid} {gid} 1")


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
            mount(None, target, None, flags | MS_NOEXEC)


def build_root(*, submission: str, read_only_paths: list[str], hide_paths: list[str],
               tmp_size_mb: int) -> None:
    """An empty root holding only the interpreter, its packages and the submission.

    ``hide_paths`` are covered with empty read-only tmpfs mounts: secrets that happen to lie
    inside a bound tree (the grader package, with its hidden suites, inside site-packages).
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # never leak our mounts to the host
    mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0755")
    for path in read_only_paths:
        if os.path.islink(path):
            os.symlink(os.readlink(path), NEW_ROOT + path)
        elif os.path.exists(path):
            _bind(path)
    for path in hide_paths:
        if os.path.isdir(NEW_ROOT + path):
            mount("tmpfs", NEW_ROOT + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY,
                  "size=4k,mode=0555")
        elif os.path.exists(NEW_ROOT + path):
            mount("/dev/null", NEW_ROOT + path, None, MS_BIND)
    os.makedirs(NEW_ROOT + SUBMISSION_DIR, mode=0o755)
    mount(submission, NEW_ROOT + SUBMISSION_DIR, None, MS_BIND)
    mount(None, NEW_ROOT + SUBMISSION_DIR, None,
          MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(NEW_ROOT + "/dev", mode=0o755)
    for dev in ("null", "zero", "urandom", "random"):
        _bind("/dev/" + dev, writable=True)
    for tmp in ("/tmp", "/dev/shm"):
        os.makedirs(NEW_ROOT + tmp, exist_ok=True)
        mount("tmpfs", NEW_ROOT + tmp, "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={tmp_size_mb}m,mode=1777")
    os.makedirs(NEW_ROOT + "/proc", mode=0o555)
    mount("proc", NEW_ROOT + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chroot(NEW_ROOT)
    os.chdir("/")


def set_limits(limits: dict, *, own_processes: int = 0) -> None:
    """rlimits; CPU soft == hard so a SIGXCPU handler cannot buy time."""
    def lim(which, value):
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)  # an unprivileged process cannot raise its hard limit
        resource.setrlimit(which, (value, value))

    lim(resource.RLIMIT_CORE, 0)
    lim(resource.RLIMIT_CPU, int(limits["cpu_s"]))
    lim(resource.RLIMIT_FSIZE, int(limits["file_mb"]) << 20)
    lim(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    # RLIMIT_NPROC counts every process of the real uid: as root each slot has its own uid;
    # otherwise the grader's own processes share the budget, so add them in.
    lim(resource.RLIMIT_NPROC, int(limits["processes"]) + own_processes)
    # The address-space cap counts what the zygote already mapped (torch: ~0.65 GB).
    with open("/proc/self/statm") as fh:
        vm_bytes = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    lim(resource.RLIMIT_AS, vm_bytes + (int(limits["memory_mb"]) << 20))


def _own_processes() -> int:
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
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
    _check(_libc.syscall(_SYS_CAPSET, ctypes.byref(header), ctypes.byref(data)), "capset")


_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(os.uname().machine, 126)


def lock_down(*, mode: str, channel_fd: int, submission: str, uid: int | None,
              read_only_paths: list[str], hide_paths: list[str], limits: dict) -> str:
    """In the worker (pid 1 of its namespace unless mode is plain), before student code."""
    os.setsid()
    own_processes = 0 if os.geteuid() == 0 else _own_processes()
    os.closerange(3, channel_fd)
    os.closerange(channel_fd + 1, 1000)   # fd 1000: the debug channel, only when debugging
    os.closerange(1001, 1 << 16)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    if mode in ("root", "userns"):
        build_root(submission=submission, read_only_paths=read_only_paths,
                   hide_paths=hide_paths, tmp_size_mb=int(limits["tmp_mb"]))
        folder = SUBMISSION_DIR
    else:
        folder = submission
    set_limits(limits, own_processes=own_processes)
    if mode == "root":
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    elif mode == "userns":
        drop_capabilities()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 0)
    # Set after the uid change: a credential change clears the parent-death signal.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.environ.clear()
    os.environ.update({"HOME": "/tmp", "TMPDIR": "/tmp", "PATH": "/usr/bin:/bin",
                       "OMP_NUM_THREADS": "1"})
    os.chdir("/tmp" if mode != "plain" else folder)
    return folder


