"""Run one command with untrusted code in it: bubblewrap namespaces, resource limits, a clean
environment, one writable scratch folder. Used by tools/grade.py: a sandbox per stage 1 and per
function answer of each submission, and one per worker for stage 2's scorer.

With ``bwrap`` (Debian/Ubuntu: ``apt-get install bubblewrap``) the command sees:

    /usr, /etc basics, the Python installation, the venv, the kit    read-only, at their own paths
    the read-only inputs given (e.g. the submission)                  read-only, at their own paths
    /grade, with HOME=/grade/home, cwd /grade/work     the only writable place: a private
                                                      tmpfs of ``Limits.scratch_bytes`` (2 GiB)
    /tmp, /dev/shm                                    private tmpfs, size-capped
    the ``hidden`` paths given (e.g. the kit)         empty (a tmpfs over them)
    its own network (loopback only), PIDs, IPC, hostname; no capabilities
    /etc/hosts that maps its hostname to the loopback address      (torchrun's rendezvous
                                                                    connects to the hostname)

and dies with the grader (``--die-with-parent``), in its own session (``--new-session``: it cannot
push keystrokes into the grader's terminal). Run as root, the command also drops to a fresh
unprivileged uid (``setpriv``) so that the process limit counts only its own processes (Linux
counts RLIMIT_NPROC per real uid and does not apply it to root) and so that root-owned files
left readable in a bound folder stay unwritable.

Limits (``setrlimit`` in the child before ``bwrap`` starts; every process inside inherits them):
address space (RLIMIT_AS, per process), CPU seconds (RLIMIT_CPU, per process), processes and
threads (RLIMIT_NPROC, per uid), size of any file written (RLIMIT_FSIZE), no core dumps.

Nothing the command writes lands on the grader's disk: its scratch is in memory, its output comes
back through a pipe of which only the last ``OUTPUT_CHARS`` are kept, and whatever else it hands
back goes through descriptors the caller passes (``pass_fds``), never through files the grader
would open. Without ``bwrap`` the command still gets the limits and the clean environment, but
its scratch is a folder on the grader's disk, it can read and write whatever the grader's user
can and reach the network; :func:`missing_isolation` says so, and tools/grade.py prints it
loudly.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

INSIDE = Path("/grade")  # where the scratch folder appears inside the sandbox
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
             "passwd", "group", "host.conf", "mime.types", "alternatives", "fonts")
HOSTNAME = "grader"  # the sandbox's hostname (its own UTS namespace)
# the sandbox's /etc/hosts: its hostname must resolve, or `torchrun --standalone` hangs: the c10d
# rendezvous advertises the store at (hostname, port) and its clients retry that name until the
# 900 s rendezvous timeout ("addresses of (grader, port) cannot be retrieved")
HOSTS = (f"127.0.0.1\tlocalhost {HOSTNAME}\n"
         f"::1\tlocalhost ip6-localhost ip6-loopback {HOSTNAME}\n")
OUTPUT_CHARS = 200_000  # what is kept of a stage's stdout+stderr (its file is capped by FSIZE)
SHM_BYTES, TMP_BYTES = 512 * 2**20, 1 * 2**30  # in-memory /dev/shm and /tmp: RAM a submission may fill
UID_RANGE = (61000, 64999)  # unprivileged uids handed to sandboxes when the grader is root


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-process limits (``memory_bytes`` is address space, so it counts reserved as well as
    touched memory: importing torch alone reserves ~3 GB); ``processes`` counts threads too."""
    memory_bytes: int = 8 * 2**30
    cpu_seconds: int = 1200
    processes: int = 256
    file_bytes: int = 2**30
    scratch_bytes: int = 2 * 2**30   # the in-memory /grade (isolated runs only)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, int) and v > 0):
                raise ValueError(f"Limits.{f.name} must be a positive int, got {v!r}")


@dataclasses.dataclass
class Outcome:
    returncode: int | None  # None: killed at the time limit
    output: str             # stdout and stderr together (the last OUTPUT_CHARS of it)
    isolated: bool          # ran under bwrap


# --------------------------------------------------------------------------- seccomp
# A small classic-BPF filter bwrap loads before the command starts (``--seccomp FD``). Why by
# hand: libseccomp's Python binding is not on PyPI, and the filter is a dozen instructions.
# It refuses, with EPERM:
#   * new user namespaces (``unshare``/``clone`` with CLONE_NEWUSER): inside one a submission
#     holds every capability over it (mounts: a tmpfs that escapes the scratch cap; netfilter;
#     the usual local-root paths), and as root bwrap's --disable-userns cannot be used;
#   * the kernel keyrings (``keyctl``, ``add_key``, ``request_key``): the grader's session
#     keyring (Kerberos tickets, tokens) is inherited and its "possessor" rights ignore the uid;
#   * any other ABI (i386 ``int 0x80``, x32), whose syscall numbers the filter does not check.
# ``clone3`` answers ENOSYS: its flags sit in memory the filter cannot read, and glibc then falls
# back to ``clone``, whose flags it can.
_CLONE_NEWUSER = 0x10000000
_SYSCALLS = {  # machine: (audit arch, keyctl, add_key, request_key, unshare, clone, clone3)
    "x86_64": (0xC000003E, 250, 248, 249, 272, 56, 435),
    "aarch64": (0xC00000B7, 219, 217, 218, 97, 220, 435),
}


def seccomp_filter() -> bytes | None:
    """The filter above for this machine, as bwrap reads it; None on an architecture it does
    not know (then only the other protections apply; docs/instructor.md says so)."""
    import platform
    import struct
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    arch, keyctl, add_key, request_key, unshare, clone, clone3 = numbers
    ld_w_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog = [
        (ld_w_abs, 0, 0, 4),                  # 0  A = arch
        (jeq, 1, 0, arch),                    # 1  our ABI: go on
        (ret, 0, 0, eperm),                   # 2  any other ABI
        (ld_w_abs, 0, 0, 0),                  # 3  A = syscall number
        (jge, 0, 1, 0x40000000),              # 4  x32 numbers
        (ret, 0, 0, eperm),                   # 5
        (jeq, 0, 1, clone3),                  # 6
        (ret, 0, 0, enosys),                  # 7
        (jeq, 2, 0, keyctl),                  # 8  -> 11
        (jeq, 1, 0, add_key),                 # 9  -> 11
        (jeq, 0, 1, request_key),             # 10 -> 11 / 12
        (ret, 0, 0, eperm),                   # 11
        (jeq, 1, 0, unshare),                 # 12 -> 14
        (jeq, 0, 3, clone),                   # 13 -> 14 / 17
        (ld_w_abs, 0, 0, 16),                 # 14 A = low word of the first argument (flags)
        (jset, 0, 1, _CLONE_NEWUSER),         # 15
        (ret, 0, 0, eperm),                   # 16
        (ret, 0, 0, allow),                   # 17
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


@functools.lru_cache(maxsize=1)
def _seccomp_file() -> int | None:
    """A read-only descriptor of :func:`seccomp_filter` (bwrap reads it from the start, so each
    sandbox gets a fresh ``dup`` positioned at 0: see :func:`start`)."""
    program = seccomp_filter()
    if program is None:
        return None
    fd, name = tempfile.mkstemp(prefix="sandbox_seccomp_")
    os.write(fd, program)
    os.unlink(name)
    return fd


@functools.lru_cache(maxsize=1)
def bwrap() -> str | None:
    """Path of a working ``bwrap``, or None (not installed, or user namespaces refused)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    probe = [exe, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--die-with-parent",
             "true"]
    if os.geteuid() != 0:
        probe[1:1] = ["--unshare-user"]
    ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    return exe if ok else None


def missing_isolation() -> str | None:
    """None when submissions are isolated; else what is missing and how to get it."""
    if bwrap() is not None:
        return None
    why = "bwrap is not installed" if shutil.which("bwrap") is None else \
        "bwrap is installed but cannot create namespaces here (unprivileged user namespaces off?)"
    return (f"SUBMISSIONS ARE NOT ISOLATED: {why}. Each submission still runs with resource "
            "limits and a clean environment, but it can read and write any file you can and "
            "reach the network" + (", and as root the process limit does not apply"
                                  if os.geteuid() == 0 else "") +
            ". Install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`) and grade again.")


_uids = itertools.count(random.randrange(*UID_RANGE))
_live_uids: set[int] = set()  # held by a sandbox that has not been waited for
_uid_lock = threading.Lock()


def _sandbox_uid() -> int:
    """A uid owned by nothing else, so RLIMIT_NPROC counts only this sandbox's processes: the
    next in ``UID_RANGE`` that no live sandbox holds (a long-lived one, such as grading's scorer,
    keeps its uid while thousands of others come and go). Released by :meth:`Running.wait`."""
    lo, hi = UID_RANGE
    with _uid_lock:
        for _ in range(hi - lo):
            uid = lo + (next(_uids) - lo) % (hi - lo)
            # not one another grader process (or a test worker beside this one) holds
            if uid not in _live_uids and _processes_of(uid) == 0:
                _live_uids.add(uid)
                return uid
    raise RuntimeError(f"all {hi - lo} sandbox uids are held by running sandboxes")


def _release_uid(uid: int | None) -> None:
    with _uid_lock:
        _live_uids.discard(uid)


def _processes_of(uid: int) -> int:
    """Threads now running under ``uid`` (RLIMIT_NPROC counts them all, not only the sandbox's)."""
    n = 0
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            n += task.stat().st_uid == uid
        except OSError:
            pass
    return n


def _set_limits(limits: Limits, nproc: int) -> None:
    """Runs in the child between fork and exec (no threads, no allocation-heavy work)."""
    for which, value in ((resource.RLIMIT_AS, limits.memory_bytes),
                         (resource.RLIMIT_CPU, limits.cpu_seconds),
                         (resource.RLIMIT_NPROC, nproc),
                         (resource.RLIMIT_FSIZE, limits.file_bytes),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


def _bind(args: list[str], flag: str, path: Path) -> None:
    """Bind ``path`` at the same place; a symlink stays a symlink (merged-/usr systems)."""
    if path.is_symlink():
        args += ["--symlink", os.readlink(path), str(path)]
    elif path.exists():
        args += [flag, str(path), str(path)]


def environment_paths() -> list[Path]:
    """What Python, torch and the kit need, read-only: the system, the interpreter, the venv."""
    paths = [Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/opt")]
    paths += [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent]
    # a venv reached through a symlink (e.g. .venv -> a shared one) must be bound where it really
    # is too, or the link inside the sandbox points at nothing
    return paths + [p.resolve() for p in paths if p.resolve() != p]


@functools.lru_cache(maxsize=1)
def hosts_file() -> Path:
    """A read-only file holding :data:`HOSTS` (one per grader process, removed at exit)."""
    fd, name = tempfile.mkstemp(prefix="sandbox_hosts_")
    with os.fdopen(fd, "w") as f:
        f.write(HOSTS)
    os.chmod(name, 0o444)  # world-readable: the sandbox uid must read it
    atexit.register(lambda: Path(name).unlink(missing_ok=True))
    return Path(name)


def bwrap_command(argv: list[str], readonly: list[Path], uid: int | None, *,
                  hidden: list[Path] = (), scratch_bytes: int = Limits.scratch_bytes,
                  seccomp_fd: int | None = None) -> list[str]:
    args = [bwrap()] + (["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []) + [
            "--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", HOSTNAME,
            "--proc", "/proc", "--dev", "/dev",
            # private, size-capped and world-writable (the sandbox uid is not root): /dev/shm is
            # where multiprocessing puts its locks (the distributed lessons launch processes)
            "--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm",
            "--size", str(TMP_BYTES), "--perms", "1777", "--tmpfs", "/tmp"]
    if uid is None:  # not root: an unprivileged user namespace, our own uid inside
        args += ["--unshare-user"]
    else:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    seen: list[Path] = []
    for p in sorted({Path(p) for p in environment_paths() + list(readonly)},
                    key=lambda p: len(p.parts)):
        if p.exists() and not any(p.is_relative_to(s) for s in seen if not s.is_symlink()):
            seen.append(p)
    # bwrap makes missing parents of a mount point 0700 when run as root: make them 0755 first
    # so the unprivileged uid can reach what is bound there (they hold nothing else)
    parents = sorted({a for p in seen for a in p.parents if a != Path("/")},
                     key=lambda p: len(p.parts))
    for a in parents:
        if a not in seen and not a.is_symlink():
            args += ["--perms", "0755", "--dir", str(a)]
    for p in seen:
        _bind(args, "--ro-bind", p)
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC_FILES:
        _bind(args, "--ro-bind", Path("/etc") / name)
    args += ["--ro-bind", str(hosts_file()), "/etc/hosts"]
    for p in hidden:  # an empty, read-only folder over it: what was there cannot be read
        args += ["--perms", "0555", "--tmpfs", str(p), "--remount-ro", str(p)]
    args += ["--size", str(scratch_bytes), "--perms", "0755", "--tmpfs", str(INSIDE)]
    for sub in ("home", "work", "tmp"):
        args += ["--perms", "1777", "--dir", str(INSIDE / sub)]
    args += ["--chdir", str(INSIDE / "work")]
    if uid is not None:  # drop root: fresh uid, no groups, no capabilities, no setuid gains
        args += ["--", shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}",
                 f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
                 "--no-new-privs"]
    else:
        args += ["--"]
    return args + list(argv)


def clean_environment(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """Only what grading needs: nothing of the grader's environment (tokens, keys, paths)."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "HOME": str(home), "TMPDIR": str(home.parent / "tmp"), "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           "CUDA_VISIBLE_DEVICES": ""}
    env.update(extra)
    return env


class Running:
    """A sandboxed command started by :func:`start`; :meth:`wait` ends it."""

    def __init__(self, proc: subprocess.Popen, output: "Tail", isolated: bool,
                 uid: int | None = None):
        self.proc, self._output, self.isolated, self._uid = proc, output, isolated, uid

    def wait(self, timeout: float) -> Outcome:
        """Wait up to ``timeout`` seconds; past it, kill everything the command started."""
        try:
            returncode = self.proc.wait(timeout=max(timeout, 0.01))
        except subprocess.TimeoutExpired:
            self.kill()
            returncode = None
        self._output.join()
        self._release_uid()
        return Outcome(returncode, self._output.text(), self.isolated)

    def _release_uid(self) -> None:
        # bwrap has exited: the processes of its PID namespace are gone with it
        _release_uid(self._uid)
        self._uid = None

    def kill(self) -> None:
        # bwrap's children die with it (--die-with-parent, then the PID namespace goes);
        # without bwrap the process group is all we can reach
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._release_uid()


class Tail(threading.Thread):
    """Drains a pipe, keeping its last ``OUTPUT_CHARS`` bytes: a command printing without end
    costs the grader neither memory nor disk."""

    def __init__(self, fd: int):
        super().__init__(daemon=True)
        self.fd, self.data = fd, bytearray()
        self.start()

    def run(self):
        with os.fdopen(self.fd, "rb", buffering=0) as f:
            while chunk := f.read(65536):
                self.data += chunk
                del self.data[:-OUTPUT_CHARS]

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def start(argv: list[str], scratch: Path, *, readonly: list[Path] = (), hidden: list[Path] = (),
          limits: Limits = Limits(), env: dict[str, str] | None = None,
          pass_fds: tuple[int, ...] = ()) -> Running:
    """Start ``argv`` in a sandbox. Isolated, its only writable folder is an in-memory /grade of
    ``limits.scratch_bytes`` (``scratch`` is not used); without bwrap it is the folder
    ``scratch`` (made here, with ``home/``, ``work/`` and ``tmp/`` inside). ``readonly`` paths are
    visible at their own paths, read-only; ``hidden`` ones are empty (isolated runs only).

    ``pass_fds``: descriptors the command inherits (e.g. pipes for answers and results)."""
    isolated = bwrap() is not None
    uid = _sandbox_uid() if isolated and os.geteuid() == 0 else None
    try:
        return _start(argv, scratch, readonly, hidden, limits, env, pass_fds, isolated, uid)
    except BaseException:
        _release_uid(uid)
        raise


def _start(argv, scratch, readonly, hidden, limits, env, pass_fds, isolated, uid) -> Running:
    seccomp_fd = None
    if isolated:
        full_env = clean_environment(INSIDE / "home", env or {})
        full_env["TMPDIR"] = "/tmp"
        if _seccomp_file() is not None:
            seccomp_fd = os.open(f"/proc/self/fd/{_seccomp_file()}", os.O_RDONLY)
            pass_fds = (*pass_fds, seccomp_fd)
        cmd = bwrap_command(argv, list(readonly), uid, hidden=list(hidden),
                            scratch_bytes=limits.scratch_bytes, seccomp_fd=seccomp_fd)
        cwd = "/"
        # as root the sandbox uid is fresh: count from zero; else the limit must leave room for
        # the processes the user already runs (they count against the same per-uid limit)
        nproc = limits.processes + (0 if uid is not None else _processes_of(os.getuid()))
    else:
        scratch = Path(scratch).resolve()
        for sub in ("home", "work", "tmp"):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
        full_env = clean_environment(scratch / "home", env or {})
        cmd, cwd = list(argv), scratch / "work"
        nproc = limits.processes + _processes_of(os.getuid())
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(cmd, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=write_end, stderr=subprocess.STDOUT,
                                start_new_session=True, pass_fds=pass_fds,
                                preexec_fn=functools.partial(_set_limits, limits, nproc))
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    return Running(proc, Tail(read_end), isolated, uid)


def run(argv: list[str], scratch: Path, *, readonly: list[Path] = (), hidden: list[Path] = (),
        timeout: float, limits: Limits = Limits(), env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = ()) -> Outcome:
    """:func:`start` ``argv`` and wait for it, at most ``timeout`` seconds (then everything it
    started is killed)."""
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return start(argv, scratch, readonly=readonly, hidden=hidden, limits=limits, env=env,
                 pass_fds=pass_fds).wait(timeout)
