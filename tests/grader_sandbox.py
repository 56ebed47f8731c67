"""The grader's sandbox: runs one autograder test so that the code under test cannot cheat or do harm.

What it promises (tests/GRADING.md, "What is guaranteed"), for the code under test, a learner's lesson linked into
the test binary:
  - it can READ the kit, the tests and its own sources, but never CHANGE tests/, kit/, scripts/, mk/,
    datasets/, solutions/, the build, or another submission: bubblewrap mounts all of it read-only and gives
    the test a private working folder, /tmp and /dev/shm; as root without bubblewrap each test runs as a user
    of its own; without either, Guard puts back whatever changed and the test scores 0;
  - it cannot OUTLIVE its test: a supervisor process per test (a child subreaper, so fork() + setsid() does
    not escape it) kills and reaps every process the test started when it ends, times out or exceeds its
    memory; with bubblewrap the PID namespace dies with it too;
  - it cannot FORGE its verdict: the verdict comes only through the channel (a secret token per rank, taken by
    the harness before any learner code runs, tests/grading.h), never from what it prints or an XML file it
    could write; objects that would run code before the harness or replace a function of the harness's
    libraries are refused (check_objects);
  - it cannot STOP others' grading: it never runs inside the grader (killing its parent kills only its
    supervisor, which the grader notices, then sweeps what is left), it cannot see or signal other tests
    (PID namespace, or another uid), and its time, memory, file sizes and CPU are limited.
Not promised: code in the test's own process can read that process's memory (the token included); see
tests/GRADING.md. Used by tests/grade.py, which decides what a run's facts (run_contained) mean for the score.
Python 3 standard library only; the supervisor imports only this module, so that it starts fast.
"""
import ctypes
import glob
import hmac
import json
import os
import re
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERDICTS = ("PASS", "FAIL", "SKIP")  # what the harness may report (tests/grading.h)


# ------------------------------------------------------------------------------------------------ limits

class Limits:
    def __init__(self, timeout, mem_mb, fsize_mb):
        self.timeout, self.mem_mb, self.fsize_mb = timeout, mem_mb, fsize_mb


def binary_traits(binary):
    """Whether the binary uses AddressSanitizer or CUDA: both reserve huge virtual address ranges,
    so an address-space limit would break them (the supervisor's memory watch covers them instead)."""
    try:
        with open(binary, "rb") as f:
            data = f.read()
    except OSError:
        return False, False
    return b"__asan_init" in data, b"libcudart" in data or b"cudaGetDeviceCount" in data


def limiter(limits, timeout, asan, cuda, uid=None):
    """preexec_fn: resource limits for one test process (and everything it starts); with `uid` (the "uid"
    sandbox), it then runs as that unprivileged user and group, unable to gain privileges again."""
    def apply():
        def cap(which, soft, hard=None):
            try:
                resource.setrlimit(which, (soft, soft if hard is None else hard))
            except (ValueError, OSError):
                pass
        cap(resource.RLIMIT_CORE, 0)
        cpu = int(timeout * max(1, os.cpu_count() or 1)) + 10  # CPU seconds over all threads: a backstop
        cap(resource.RLIMIT_CPU, cpu, cpu + 5)
        cap(resource.RLIMIT_FSIZE, limits.fsize_mb << 20)  # also bounds a runaway printf loop's log
        if limits.mem_mb > 0:
            # RLIMIT_DATA misses MAP_SHARED mappings; RLIMIT_AS breaks CUDA, and both break ASan (their
            # huge reservations of address space). So: the address space is capped where it can be, the data
            # segment where it can be, and the supervisor watches the resident memory (anonymous + shared) of
            # the whole process tree in every case, ASan builds included.
            if not asan:
                cap(resource.RLIMIT_DATA, limits.mem_mb << 20)
            if not asan and not cuda:
                cap(resource.RLIMIT_AS, (limits.mem_mb + AS_SLACK_MB) << 20)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if not prctl(PR_SET_NO_NEW_PRIVS, 1):
                os._exit(126)
    return apply


# ------------------------------------------------------------------------------------------------ containment
#
# Every test runs under a supervisor (SUPERVISOR: this module's supervise()), a separate process that is a
# child subreaper (PR_SET_CHILD_SUBREAPER): whatever the test starts stays its descendant even after fork() +
# setsid() and the death of the parent, so the supervisor can kill the whole tree when the test ends or times out. The test
# never runs in the grader itself: killing its parent (kill(getppid(), SIGKILL)) kills at most that
# supervisor, which the grader notices; the grader is a subreaper too and sweeps what is left.
# With bubblewrap (SANDBOX = "bwrap") the test also gets its own PID namespace (it can see and signal only its
# own processes), a read-only view of the whole file system except its scratch folder, private /tmp and
# /dev/shm, and no network. As root without bubblewrap (SANDBOX = "uid") each test runs as an unprivileged
# user of its own. In that case and without any sandbox (SANDBOX = "none"), a guard compares tests/, kit/,
# scripts/, mk/, datasets/ and solutions/ before and after every test and puts back what changed.

AS_SLACK_MB = 1024           # address space beyond --mem-mb: thread stacks, OpenBLAS/OpenMP/MPI reservations
MEMORY_POLL_S = 0.05         # how often the supervisor measures the test's memory
TREE_SCAN_S = 0.25           # how often it lists the test's processes again (new ones are measured from then)
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 36, 38
_LIBC = ctypes.CDLL(None, use_errno=True)
_SPAWN_LOCK = threading.Lock()
_OUR_CHILDREN = set()        # pids the grader started and still waits for (never swept)


def prctl(option, value):
    return _LIBC.prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)) == 0


def process_table():
    """{pid: (parent pid, state letter)} of every process in /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                table[int(entry)] = (int(fields[1]), fields[0].decode())
            except (OSError, IndexError, ValueError):
                pass
    return table


def descendants(pid, table=None):
    table = process_table() if table is None else table
    children = {}
    for p, (pp, _) in table.items():
        children.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def reap_children(statuses):
    """Collects every ended child (orphans come back to a subreaper): statuses[pid] = wait status.
    Only for the supervisor: the grader itself must not reap the children its Popen objects wait for."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def tree_of(roots, table):
    children = {}
    for p, (pp, _) in table.items():
        children.setdefault(pp, []).append(p)
    found, todo = [], list(roots)
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def kill_all(pids, table):
    for p in pids:
        if table.get(p, (0, "Z"))[1] not in "ZX":
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def kill_descendants(statuses, rounds=400):
    """Supervisor: kills and reaps every descendant. This process is a subreaper, so a process that left its
    session (setsid) or lost its parent is still its descendant. Returns the pids still there after `rounds`."""
    left = []
    for _ in range(rounds):
        table = process_table()
        left = tree_of([p for p, (pp, _) in table.items() if pp == os.getpid()], table)
        kill_all(left, table)
        reap_children(statuses)
        if not left:
            return []
        time.sleep(0.005)
    return left


def memory_mb(pids):
    """Resident anonymous + shared memory (MAP_SHARED, /dev/shm) of these processes, in MiB."""
    total_kb = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status", "rb") as f:
                for line in f:
                    if line.startswith((b"RssAnon:", b"RssShmem:")):
                        total_kb += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return total_kb / 1024


# The supervisor's command: this module imported (its compiled bytecode is cached, a script's is not), without
# site-packages (-S: the standard library is all it needs).
SUPERVISOR = [sys.executable, "-S", "-c",
              f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
              f"import grader_sandbox; sys.exit(grader_sandbox.supervise())"]


def supervise():
    """The supervisor (SUPERVISOR, started once per test): runs one test as described by the JSON on stdin,
    prints the outcome as JSON."""
    cfg = json.load(sys.stdin)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)  # the test (same user without a sandbox) may not read this process's memory
    limits = Limits(*cfg["limits"])
    log = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    outcome = {"rc": None, "timed_out": False, "mem_over": False, "peak_mb": 0.0, "error": None}
    try:
        p = subprocess.Popen(cfg["cmd"], cwd=cfg["cwd"], env=cfg["env"], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=log, preexec_fn=limiter(limits, cfg["timeout"], cfg["asan"], cfg["cuda"],
                                                            cfg["uid"]), start_new_session=True)
    except OSError as e:
        outcome["error"] = f"could not start the test: {e}"
        print(json.dumps(outcome))
        return 0
    os.close(log)
    statuses = {}
    deadline = time.monotonic() + cfg["timeout"]
    nap = 0.002  # short tests end in milliseconds: poll fast at first, then every MEMORY_POLL_S
    tree, next_scan = [], 0.0
    while p.pid not in statuses:
        reap_children(statuses)
        if p.pid in statuses:
            break
        if time.monotonic() >= deadline:
            outcome["timed_out"] = True
            break
        if limits.mem_mb > 0:
            # Listing every process costs more than reading a few: the tree is listed again every TREE_SCAN_S.
            if time.monotonic() >= next_scan:
                tree, next_scan = descendants(os.getpid()), time.monotonic() + TREE_SCAN_S
            used = memory_mb(tree)
            outcome["peak_mb"] = max(outcome["peak_mb"], round(used, 1))
            if used > limits.mem_mb:
                outcome["mem_over"] = True
                break
        time.sleep(nap)
        nap = min(MEMORY_POLL_S, nap * 2)
    left = kill_descendants(statuses)  # everything the test left behind, setsid() or not
    if p.pid in statuses:
        outcome["rc"] = os.waitstatus_to_exitcode(statuses[p.pid])
    if left:
        outcome["error"] = f"{len(left)} processes of the test could not be killed"
    p.returncode = outcome["rc"] if outcome["rc"] is not None else -9  # reaped above
    print(json.dumps(outcome))
    return 0


def spawn(cmd, **kwargs):
    """Popen, remembering the child so that a sweep of strays never kills it."""
    with _SPAWN_LOCK:
        p = subprocess.Popen(cmd, **kwargs)
        _OUR_CHILDREN.add(p.pid)
    return p


def forget(p):
    with _SPAWN_LOCK:
        _OUR_CHILDREN.discard(p.pid)


def run_command(cmd, timeout, **kwargs):
    """subprocess.run for the grader's own commands (make, --list). Returns (returncode, stdout bytes)."""
    p = spawn(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, **kwargs)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        return None, out
    finally:
        forget(p)


def sweep_strays(rounds=200):
    """Grader: kills what came back to it (it is a subreaper) because a test killed its supervisor: every
    child it did not start through spawn(), with all their descendants."""
    for _ in range(rounds):
        with _SPAWN_LOCK:
            table = process_table()
            strays = [p for p, (pp, _) in table.items() if pp == os.getpid() and p not in _OUR_CHILDREN]
            kill_all(tree_of(strays, table), table)
            for p in strays:
                try:
                    os.waitpid(p, os.WNOHANG)
                except ChildProcessError:
                    pass
        if not strays:
            return
        time.sleep(0.005)


# The sandbox: chosen once (GRADE_SANDBOX=auto|bwrap|none; auto = bwrap when it works here).
SANDBOX = None
SANDBOX_WHY = ""


def bwrap_command(work, root, readable, hidden, mem_mb):
    """bubblewrap around one test: the file system read-only except `work`; /tmp, /var/tmp, /dev/shm and the
    grader's scratch folders (`hidden`) replaced by empty private ones; the repository (`root`, which may
    itself live in /tmp) and then `readable` (the binary, the sources) mounted read-only again on top; its own
    PID, IPC, UTS and network namespaces; no capabilities."""
    size = [] if mem_mb <= 0 else ["--size", str(mem_mb << 20)]
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--unshare-net", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for dev in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/dri")):  # GPUs stay usable
        cmd += ["--dev-bind", dev, dev]
    cmd += size + ["--tmpfs", "/dev/shm"]
    for d in ("/tmp", "/var/tmp"):
        if os.path.isdir(d):
            cmd += size + ["--tmpfs", d]
    cmd += ["--ro-bind", root, root]  # in this order: a scratch folder inside the repository stays hidden
    for d in hidden:
        cmd += size + ["--tmpfs", d]
    for d in readable:
        if os.path.exists(d):
            cmd += ["--ro-bind", d, d]
    return cmd + ["--bind", work, work, "--chdir", work, "--"]


def choose_sandbox(scratch_base):
    """bwrap where it works; else, as root, "uid" (each test as an unprivileged user of its own); else "none".
    GRADE_SANDBOX=auto|bwrap|uid|none chooses (tests/GRADING.md)."""
    global SANDBOX, SANDBOX_WHY
    if SANDBOX is not None:
        return SANDBOX
    want = os.environ.get("GRADE_SANDBOX", "auto")
    if want not in ("auto", "bwrap", "uid", "none"):
        raise SystemExit(f"grade: GRADE_SANDBOX={want}: expected auto, bwrap, uid or none")
    SANDBOX, SANDBOX_WHY = "none", f"GRADE_SANDBOX={want}"
    if want in ("auto", "bwrap"):
        if not shutil.which("bwrap"):
            SANDBOX_WHY = "bubblewrap (bwrap) is not installed: run make deps"
        else:
            work = tempfile.mkdtemp(prefix="probe-", dir=scratch_base)
            rc, out = run_command(bwrap_command(work, ROOT, [], [scratch_base], 64) + ["/bin/true"], 60,
                                  stderr=subprocess.STDOUT)
            if rc == 0:
                SANDBOX, SANDBOX_WHY = "bwrap", ""
            else:
                SANDBOX_WHY = "bwrap does not work here: " + (out or b"").decode("utf-8", "replace").strip()[:200]
            shutil.rmtree(work, ignore_errors=True)
        if want == "bwrap" and SANDBOX != "bwrap":
            raise SystemExit(f"grade: GRADE_SANDBOX=bwrap, but {SANDBOX_WHY}")
    if SANDBOX == "none" and want in ("auto", "uid"):
        why = uid_sandbox_problem()
        if not why:
            SANDBOX = "uid"
            print(f"grade: note: no bubblewrap ({SANDBOX_WHY}); as root, each test runs as an unprivileged user "
                  f"of its own (uid {UID_BASE} and up): the kit is protected by its file permissions", flush=True)
        elif want == "uid":
            raise SystemExit(f"grade: GRADE_SANDBOX=uid, but {why}")
        else:
            SANDBOX_WHY += f"; {why}"
    if SANDBOX == "none":
        print(f"grade: note: tests run without a sandbox ({SANDBOX_WHY}): code under test runs as you; the "
              f"grader puts back tests/, kit/, scripts/, mk/, datasets/ and solutions/ when a test changes them "
              f"(tests/GRADING.md)", flush=True)
    return SANDBOX


# The "uid" sandbox: root without bubblewrap (a container whose seccomp profile forbids namespaces, say). Each
# running test gets a user and group id of its own that no account uses, so it cannot signal the grader, its
# supervisor or another test, nor write the kit (its files must not be writable by others: checked).
UID_BASE, UID_SLOTS = 64200, 64
_UIDS_IN_USE = set()


def uid_unowned(uid):
    """True when no account and no group has this id (so a test may run as it)."""
    import grp
    import pwd
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return False
        except KeyError:
            pass
    return True


def uid_sandbox_problem():
    """Why the uid sandbox cannot be used here, or "" when it can."""
    if os.geteuid() != 0:
        return "not root, so no other user to run tests as"
    free = sum(1 for uid in range(UID_BASE, UID_BASE + UID_SLOTS) if uid_unowned(uid))
    if not free:
        return f"every uid {UID_BASE}..{UID_BASE + UID_SLOTS - 1} belongs to an account"
    # What the test needs to read: every folder from / down to the repository, and its tests, kit, scripts.
    path = ROOT
    while True:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return f"{path} cannot be entered by other users (chmod o+x)"
        if path == os.path.dirname(path):
            break
        path = os.path.dirname(path)
    launch = os.path.join(ROOT, "scripts", "launch.sh")
    if os.path.exists(launch) and (os.stat(launch).st_mode & 0o005) != 0o005:
        return f"{launch} cannot be run by other users (chmod o+rx)"
    for sub in ("tests", "kit", "scripts", "datasets", "mk", "solutions"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, sub)):
            for name in dirnames + filenames:
                mode = os.lstat(os.path.join(dirpath, name)).st_mode
                if not stat.S_ISLNK(mode) and mode & stat.S_IWOTH:
                    return f"{os.path.join(dirpath, name)} is writable by every user (chmod o-w)"
    return ""


def take_uid():
    with _SPAWN_LOCK:
        for uid in range(UID_BASE, UID_BASE + UID_SLOTS):
            if uid not in _UIDS_IN_USE and uid_unowned(uid):
                _UIDS_IN_USE.add(uid)
                return uid
    raise RuntimeError("no free uid for the test")


def give_uid(uid):
    """Deletes what the test's user left in the shared temporary folders, and frees the uid."""
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            try:
                if os.lstat(path).st_uid == uid:
                    remove_path(path)
            except OSError:
                pass
    with _SPAWN_LOCK:
        _UIDS_IN_USE.discard(uid)


def open_to(path, uid, mode=0o711):
    """Lets the test's user reach `path` (a grader folder, mode 0700 from mkdtemp), or own it (uid given)."""
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, uid)


class Guard:
    """Without bubblewrap: what the code under test must never change, the kit's own files. Snapshots them
    (content kept in memory) and after each test puts back anything changed or deleted, and moves anything
    added (a tests/lessonNN/*.c would be compiled into the next build) to a quarantine folder, where the
    changed versions go too: nothing is lost should a person edit the kit while a grading runs."""

    DIRS = ("tests", "kit", "scripts", "mk", "datasets", "solutions")
    SKIP = ("datasets/data",)
    MAX_BYTES = 8 << 20

    def __init__(self, root, quarantine, extra_dirs=()):
        self.root, self.quarantine = root, quarantine
        self.lock = threading.Lock()
        self.tops = [os.path.join(root, d) for d in self.DIRS] + [os.path.join(root, "Makefile")]
        self.tops += [os.path.abspath(d) for d in extra_dirs]
        self.files = self.scan(with_content=True)

    def walk(self):
        for top in self.tops:
            if os.path.isfile(top) or os.path.islink(top):
                yield top
            for dirpath, dirnames, filenames in os.walk(top):
                rel = os.path.relpath(dirpath, self.root)
                dirnames[:] = [d for d in dirnames if os.path.join(rel, d) not in self.SKIP]
                for fn in filenames:
                    yield os.path.join(dirpath, fn)

    def scan(self, with_content):
        files = {}
        for path in self.walk():
            try:
                st = os.lstat(path)
                data = None
                if with_content and stat_regular(st) and st.st_size <= self.MAX_BYTES:
                    with open(path, "rb") as f:
                        data = f.read()
                files[path] = ((st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode), data)
            except OSError:
                pass
        return files

    def check(self):
        """Puts back what changed since the snapshot. Returns the paths that had changed (relative to root)."""
        with self.lock:
            now = self.scan(with_content=False)
            changed = [p for p, (sig, _) in now.items() if p not in self.files or self.files[p][0] != sig]
            changed += [p for p in self.files.keys() - now.keys()]
            for path in changed:
                if path in now:
                    self.move_aside(path)
                if path in self.files:
                    self.restore(path)
            return sorted(os.path.relpath(p, self.root) for p in changed)

    def move_aside(self, path):
        dest = os.path.join(self.quarantine, time.strftime("%Y%m%d-%H%M%S"), os.path.relpath(path, self.root))
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.rename(path, dest)
        except OSError:
            remove_path(path)

    def restore(self, path):
        sig, data = self.files[path]
        if data is None:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, sig[3] & 0o7777)
        os.utime(path, ns=(sig[1], sig[1]))
        st = os.lstat(path)
        self.files[path] = ((st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode), data)


def stat_regular(st):
    return stat.S_ISREG(st.st_mode)


def remove_path(path):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------ object checks

_LIB_SYMBOLS = {}


def defined_symbols(path, dynamic=False, skip_cxx_comdat=False):
    """Global symbols an object or library defines (nm). skip_cxx_comdat: leave out weak C++ symbols (mangled
    names, nm type W or V): the inline functions and template instantiations that every translation unit using
    a C++ header emits (the CUDA emulator's launch wrapper, say), which the kit's objects emit too."""
    cmd = ["nm", "-g", "--defined-only"] + (["-D"] if dynamic else []) + [path]
    rc, out = run_command(cmd, 60, stderr=subprocess.DEVNULL)
    names = set()
    for line in (out or b"").decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) >= 2 and len(parts[-2]) == 1:
            name = parts[-1].split("@")[0]
            if skip_cxx_comdat and parts[-2] in "WV" and name.startswith("_Z"):
                continue
            names.add(name)
    return names


def linked_libraries(binary):
    """Paths of the shared libraries the binary names (NEEDED), found through its RUNPATH and ldconfig."""
    rc, out = run_command(["readelf", "-dW", binary], 60, stderr=subprocess.DEVNULL)
    text = (out or b"").decode("utf-8", "replace")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text)
    rpath = [d for m in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[([^\]]+)\]", text)
             for d in m.split(":")]
    rc, out = run_command(["/sbin/ldconfig", "-p"], 60, stderr=subprocess.DEVNULL)
    cache = {}
    entries = re.findall(r"^\s*(\S+) \(([^)]*)\) => (\S+)", (out or b"").decode("utf-8", "replace"), re.M)
    for name, arch, path in sorted(entries, key=lambda e: "x86-64" not in e[1]):  # this machine's first
        cache.setdefault(name, path)
    paths = []
    for name in needed:
        found = next((os.path.join(d, name) for d in rpath if os.path.exists(os.path.join(d, name))), None)
        found = found or cache.get(name)
        if found:
            paths.append(found)
    return paths


def check_objects(binary, objects, kit_libs, shown_as):
    """The learner's objects may not run code before the test harness (.preinit_array) nor replace a function
    of the C library, cmocka, another linked library or the kit (which the harness and the tests call).
    Returns a reason, or None when they are fine."""
    reserved = {}
    for lib in linked_libraries(binary):
        if lib not in _LIB_SYMBOLS:
            _LIB_SYMBOLS[lib] = defined_symbols(lib, dynamic=True)
        for name in _LIB_SYMBOLS[lib]:
            reserved.setdefault(name, os.path.basename(lib))
    for lib in kit_libs:
        if os.path.exists(lib):
            for name in defined_symbols(lib):
                reserved.setdefault(name, "the kit")
    for obj in objects:
        source = shown_as(obj)
        rc, out = run_command(["readelf", "-SW", obj], 60, stderr=subprocess.DEVNULL)
        if re.search(rb"\.preinit_array", out or b""):
            return (f"{source} puts code in .preinit_array, which would run before the test harness; "
                    f"graded code may not do that")
        # Names that are not C identifiers (DW.ref.__gxx_personality_v0 from nvcc) are the compiler's own.
        clash = sorted(n for n in defined_symbols(obj, skip_cxx_comdat=True)
                       if n in reserved and re.fullmatch(r"[A-Za-z_]\w*", n))
        if clash:
            names = ", ".join(f"{n} ({reserved[n]})" for n in clash[:5])
            return (f"{source} defines {names}, already defined by a library the test uses; graded code may not "
                    f"replace them: rename or make them static")
    return None


# ------------------------------------------------------------------------------------------------ the verdict channel

def read_private(path, limit):
    """A file the test may have tampered with: no symlinks followed, regular files only, at most `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat_regular(os.fstat(fd)):
            return None
        return os.read(fd, limit)
    finally:
        os.close(fd)


def read_channel(channel, tokens, name):
    """The verdict lines the harness appended (tests/grading.h). Returns ({rank: status}, problem or None)."""
    data = read_private(os.path.join(channel, "verdict"), 1 << 16) or b""
    verdicts, problem = {}, None
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 3)
        ok = (len(parts) == 4 and parts[1].isdigit() and int(parts[1]) in tokens and parts[3] == name
              and parts[2] in VERDICTS and hmac.compare_digest(parts[0], tokens[int(parts[1])]))
        if not ok:
            problem = "a verdict line that the test harness did not write (a forged result?)"
        elif int(parts[1]) in verdicts:
            problem = f"two verdicts for rank {parts[1]} (a forged result?)"
        else:
            verdicts[int(parts[1])] = parts[2]
    return verdicts, problem


def scratch_dir(root, base):
    """A fresh folder for one test: `work` (the test's working directory, the only place it may write, with
    links so that paths like tests/fixtures/... still work) and, beside it, what only the grader sees."""
    d = tempfile.mkdtemp(prefix="test-", dir=base)
    work = os.path.join(d, "work")
    os.mkdir(work)
    for sub in ("tests", "datasets", "kit", "scripts"):
        if os.path.exists(os.path.join(root, sub)):
            os.symlink(os.path.join(root, sub), os.path.join(work, sub))
    return d, work


# ------------------------------------------------------------------------------------------------ one test

class Contained:
    """The facts of one contained run, read before its scratch folder is deleted: the supervisor's outcome
    (None when the supervisor itself was killed, with supervisor_error its stderr), the launcher's exit status
    (rc; negative: killed by that signal), the verdicts that came through the channel with their tokens
    ({rank: PASS|FAIL|SKIP}), a forged line (forged: why, or None), the kit files a test changed (without
    bubblewrap; put back already), the seconds taken, and for display only: the output's tail and head and the
    cmocka XML files' bytes (rank 0's first), which the test could have written anything into."""

    def __init__(self, **facts):
        self.__dict__.update(facts)


def run_contained(root, binary, name, ranks, timeout, limits, source_dir, ctx, tail_chars, head_bytes):
    """Runs `binary --only name` on `ranks` ranks (scripts/launch.sh when more than one) under its supervisor,
    in the sandbox ctx.sandbox, with a fresh token per rank. Returns its Contained facts."""
    scratch, work = scratch_dir(root, ctx.scratch)
    xml = os.path.join(work, "result.xml")
    log = os.path.join(scratch, "output.log")
    channel = os.path.join(work, ".grading")
    os.mkdir(channel, 0o700)
    uid = take_uid() if ctx.sandbox == "uid" else None
    tokens = {r: secrets.token_hex(16) for r in range(ranks)}
    for r, token in tokens.items():
        fd = os.open(os.path.join(channel, f"token.{r}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, token.encode())
        os.close(fd)
        if uid is not None:
            os.chown(os.path.join(channel, f"token.{r}"), uid, uid)
    if uid is not None:  # the test's user may enter the scratch folder, and owns only its working directory
        open_to(scratch, None)
        open_to(work, uid, 0o700)
        open_to(channel, uid, 0o700)
    # SLURM_*: a test runs here, through mpirun, even inside an allocation: ranks that srun started would be
    # children of slurmd, outside the supervisor and the sandbox.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CMOCKA_", "GRADING_", "SLURM_"))}
    env.update(CMOCKA_MESSAGE_OUTPUT="XML", CMOCKA_XML_FILE=xml, GRADING_ROOT=root, GRADING_CHANNEL=channel,
               GRADING_LESSON_DIR=source_dir, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
               TMPDIR=work)
    cmd = [os.path.abspath(binary), "--only", name]
    if ranks > 1:
        cmd = [os.path.join(root, "scripts", "launch.sh"), str(ranks)] + cmd
        # mpirun: tag each line with its rank, so that the grader can tell the ranks' lines apart
        env["LAUNCH_ARGS"] = (env.get("LAUNCH_ARGS", "") + " --tag-output").strip()
    if ctx.sandbox == "bwrap":
        cmd = bwrap_command(work, root, [os.path.dirname(os.path.abspath(binary)), source_dir], [ctx.scratch],
                            limits.mem_mb) + cmd
    asan, cuda = binary_traits(binary)
    config = {"cmd": cmd, "cwd": work, "env": env, "log": log, "timeout": timeout, "asan": asan, "cuda": cuda,
              "limits": [limits.timeout, limits.mem_mb, limits.fsize_mb], "uid": uid}
    start = time.monotonic()
    outcome, err = None, b""
    sup = spawn(SUPERVISOR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True)
    try:
        out, err = sup.communicate(json.dumps(config).encode(), timeout=timeout + 60)
        outcome = json.loads(out.decode() or "null") if sup.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        sup.kill()
        sup.communicate()
    finally:
        forget(sup)
    sweep_strays()  # the supervisor's test, should the supervisor have been killed
    if uid is not None:
        give_uid(uid)
    seconds = time.monotonic() - start
    changed = ctx.guard.check() if ctx.guard else []
    rc = outcome["rc"] if outcome else None
    verdicts, forged = read_channel(channel, tokens, name)
    if ctx.sandbox == "bwrap" and rc is not None and rc > 128 and not verdicts:
        rc = -(rc - 128)  # bwrap reports a child killed by signal N as exit status 128 + N
    facts = Contained(outcome=outcome, supervisor_error=(err or b"").decode("utf-8", "replace"), rc=rc,
                      verdicts=verdicts, forged=forged, changed=changed, seconds=seconds,
                      output=tail(log, tail_chars), head=head(log, head_bytes),
                      xml=[read_private(p, 1 << 20) for p in [xml] + [f"{xml}.rank{r}" for r in range(1, ranks)]])
    shutil.rmtree(scratch, ignore_errors=True)
    return facts


def head(path, limit):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def tail(path, limit):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            text = f.read().decode("utf-8", "replace")
        return ("...\n" if size > limit else "") + text
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(supervise())
