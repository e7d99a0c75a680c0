"""A learner's code runs in a separate worker process inside the jail (labs.workbench.jail), never in the app.

Each run gets a fresh folder (its own uid, mode 0700) holding the worker (harness.py), the learner's file and
the inputs; bubblewrap shows that folder as /run/learner and nothing else of this machine that a kernel does not
need. The app watches the worker from outside:
- two budgets: compiling (until the worker's first kernel launch, `Limits.compile_s`) and running (from
  then on, `Limits.run_s`, which the verdict sets from the model's prediction: 50x, at least 10 s). Past
  either, the whole jail is killed and the app waits until its processes are gone (the GPU is free);
- resident memory, watched; rlimits set by `prlimit` (CPU seconds, files, processes, no core dumps);
- the jail dies with the app: bwrap's --die-with-parent, and a profiler outside the jail (ncu) is started
  with a parent-death signal too.

`static_problems` gives a friendlier first message for imports a kernel needs none of; the jail is the wall.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from labs.workbench import jail

REPO = jail.REPO
HARNESS_FILES = (Path(__file__).with_name("harness.py"), REPO / "labs" / "engine" / "timing.py",
                 Path(__file__).with_name("interpret_worker.py"))  # the interpreter's counting worker (interpret.py)
# runs' folders: not under /tmp, which the judge's profiler may have to share with the jail (judge.VARIANTS)
_VAR_TMP = Path("/var/tmp")
SANDBOX_BASE = Path(os.environ.get("ROOFLINE_SANDBOX_DIR") or
                    ((_VAR_TMP if _VAR_TMP.is_dir() and os.access(_VAR_TMP, os.W_OK) else Path(tempfile.gettempdir()))
                     / "roofline-sandbox"))
UID_BASE, UID_SPAN = 200_000, 50_000  # per-run user ids, outside any account on the machine
ALLOWED_MODULES = {"torch", "triton", "math", "numpy", "functools", "typing", "dataclasses", "itertools",
                   "operator", "__future__"}
REFUSED_CALLS = {"__import__", "eval", "exec", "open", "compile", "breakpoint", "input", "globals", "vars"}
KILL_GRACE_S = 30.0  # after a kill, how long the app waits for the jail's processes to be gone
_run_ids = itertools.count()


def protection_lines() -> list[tuple[str, bool, str]]:
    """(protection, active, what it means) for the page and the CLI."""
    st = jail.status()
    jailed = st.jailed
    return [
        ("bubblewrap jail", jailed, st.description if st.ok else st.reason),
        ("no network", jailed, "a network namespace of its own with only a loopback device"),
        ("minimal file view", jailed, "read-only /usr and Python, the GPU's device nodes, a private /tmp; "
                                      "no repository, /root, /home, other runs or app environment"),
        ("own uid and process tree", jailed, "a uid of its own; it cannot see or signal the app's processes"),
        ("compile and run budgets", True, "killed past its compile budget, or past 50x the model's time once running"),
        ("dies with the app", True, "bwrap --die-with-parent: killing the app or the CLI kills the submission"),
        ("CPU, file and memory limits", bool(shutil.which("prlimit")), "prlimit: CPU seconds, files, processes"),
    ]


def protections() -> list[str]:
    return [name for name, active, _ in protection_lines() if active]


# ---------------------------------------------------------------------------------------------
# The first message: imports and calls a kernel exercise has no need for
# ---------------------------------------------------------------------------------------------
def static_problems(code: str) -> list[str]:
    """Reasons to refuse the code before running it (empty when none). Not a protection by itself."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [(f"line {exc.lineno}: " if exc.lineno else "") + f"syntax error: {exc.msg}"]
    except ValueError as exc:  # e.g. a NUL character pasted into the editor
        return [f"the code cannot be parsed: {exc}"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.split(".")[0] not in ALLOWED_MODULES:
                    problems.append(f"line {node.lineno}: import of {name!r} is not allowed here; a kernel needs "
                                    f"only {', '.join(sorted(ALLOWED_MODULES - {'__future__'}))}.")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFUSED_CALLS:
            problems.append(f"line {node.lineno}: {node.func.id}() is not allowed in a kernel exercise.")
    return problems


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------
@dataclass
class Limits:
    compile_s: float = 120.0  # from start to the first kernel launch (Triton's compilation included)
    run_s: Optional[float] = None  # from the first launch on (None: only the compile budget, as on a CPU)
    cpu_s: int = 240  # CPU seconds (RLIMIT_CPU)
    memory_bytes: int = 6 * 2**30  # resident memory, watched; also RLIMIT_AS without a GPU
    gpu_memory_fraction: float = 0.0  # share of the GPU's memory the worker may allocate (0: no GPU)
    file_bytes: int = 4 * 2**30  # largest file it may write (RLIMIT_FSIZE)
    processes: int = 512  # processes and threads of the run's own user id (a fork bomb stops here)
    open_files: int = 512  # RLIMIT_NOFILE

    @property
    def wall_s(self) -> float:
        return self.compile_s + (self.run_s or 0.0)


@dataclass
class WorkerRun:
    status: str  # "ok", "error" (the worker reported one), "killed" (a budget), "crashed", "refused" (no jail)
    message: str = ""  # for the learner
    result: dict = field(default_factory=dict)  # the worker's result.json
    outputs: dict = field(default_factory=dict)  # name -> tensor read back from the worker
    stderr_tail: str = ""
    seconds: float = 0.0
    returncode: Optional[int] = None
    files: dict = field(default_factory=dict)  # name -> text of the files asked for (`collect`), if written
    workdir: Optional[Path] = None  # kept (keep_dir=True) for a second run in the same folder: discard() it
    uid: Optional[int] = None  # the run's own user id
    jail: str = ""  # how it ran (jail.status().description)
    freed_s: Optional[float] = None  # after a kill: seconds until the jail's processes were gone
    gpu_processes: int = 0  # most processes inside the jail seen holding the GPU at once (watch_gpu runs)


def base_dir() -> Path:
    """The runs' (and the judge's) folders' parent, made on first use: others may enter a folder of theirs in it,
    never list it."""
    SANDBOX_BASE.mkdir(parents=True, exist_ok=True)
    os.chmod(SANDBOX_BASE, 0o711)
    return SANDBOX_BASE


def _new_workdir(uid: Optional[int]) -> Path:
    base_dir()
    work = Path(tempfile.mkdtemp(prefix="run-", dir=SANDBOX_BASE))
    for f in HARNESS_FILES:
        shutil.copy(f, work / f.name)
    _own(work, uid)
    os.chmod(work, 0o700)
    return work


def _own(path: Path, uid: Optional[int]) -> None:
    if uid is not None and os.geteuid() == 0 and jail.status().mode == "host-uid":
        os.chown(path, uid, uid)


def _rlimits(limits: Limits, gpu: bool) -> list:
    if not shutil.which("prlimit"):
        return []
    fence = ["prlimit", f"--cpu={int(limits.cpu_s)}:{int(limits.cpu_s) + 5}", f"--nofile={limits.open_files}",
             f"--fsize={limits.file_bytes}", "--core=0", f"--nproc={limits.processes}"]
    if not gpu:
        fence.append(f"--as={limits.memory_bytes + 2 * 2**30}")  # torch itself reserves ~2 GB of addresses
    return fence + ["--"]


LOOPBACK_UP = ("import fcntl, socket, struct; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
               "flags = struct.unpack('16sh', fcntl.ioctl(s, 0x8913, struct.pack('16sh22x', b'lo', 0))[:18])[1]; "
               "fcntl.ioctl(s, 0x8914, struct.pack('16sh22x', b'lo', flags | 1))")  # SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP


def _profiled(profiler: list, inner: list, shared: tuple = ()) -> list:
    """A profiler (ncu) outside the jail: it and the jail share a network namespace of their own (only a
    loopback device, brought up here), so ncu reaches its injection inside and nothing reaches the world;
    `shared` ("ipc", "pid") gives the two a private IPC or PID namespace of their own as well, and "tmp" a
    private /tmp and /dev/shm: the folders named by ROOFLINE_JUDGE_TMP and ROOFLINE_JUDGE_SHM in the
    profiler's environment, mounted over its /tmp and /dev/shm and bound as the jail's; with "uid" the
    profiler's argv already drops to the run's uid (after the namespaces and mounts are made as root).
    setpriv --pdeathsig: the profiler dies with the app, and the jail (--die-with-parent) with the profiler."""
    ns = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--net"]
    if "ipc" in shared:
        ns.append("--ipc")
    if "tmp" in shared or "pid" in shared:
        ns.append("--mount")
    if "pid" in shared:
        ns += ["--pid", "--fork", "--kill-child", "--mount-proc"]
    script = f"'{sys.executable}' -I -c \"{LOOPBACK_UP}\" || exit 97; "
    if "tmp" in shared:
        script += ('mount --bind "$ROOFLINE_JUDGE_TMP" /tmp && mount --bind "$ROOFLINE_JUDGE_SHM" /dev/shm '
                   '|| exit 96; ')
    script += 'exec "$@"'
    return ["setpriv", "--pdeathsig", "KILL", "--"] + ns + ["sh", "-c", script, "roofline-judge"] + profiler + inner


def _command(work: Path, uid: int, limits: Limits, gpu: bool, profiler: Optional[list], extra: tuple = (),
             shared: tuple = (), worker: str = "harness.py") -> list:
    st = jail.status()
    if not st.jailed:  # the operator's opt-in: the worker runs as the app's user, with rlimits only
        return ["setpriv", "--pdeathsig", "KILL", "--"] + (profiler or []) + _rlimits(limits, gpu) + \
            [sys.executable, "-B", "-s", str(work / worker), str(work)]
    mode = st.mode
    if profiler and (os.geteuid() != 0 or "uid" in shared):
        mode = "userns-uid"  # inside the profiler's user namespace only its root is mapped; or ncu has the uid
    env = jail.environment(gpu)
    inner = _rlimits(limits, gpu) + jail.prefix(mode, uid) + \
        jail.bwrap_args(work, gpu, jail.bwrap_uid(mode, uid), env, share_net=bool(profiler), extra=extra,
                        shared=shared) + \
        [sys.executable, "-B", "-s", str(jail.INSIDE / worker), str(jail.INSIDE)]
    if profiler and "uid" in shared:  # ncu itself runs as the run's uid (the jail's own processes cannot see it)
        profiler = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--pdeathsig", "KILL", "--"] \
            + list(profiler)
    return _profiled(profiler, inner, shared) if profiler else inner


def _unjailed_env(work: Path, gpu: bool) -> dict:
    env = jail.environment(gpu)
    env.update({"HOME": str(work), "TMPDIR": str(work), "TRITON_CACHE_DIR": str(work / ".triton"),
                "PYTHONPATH": str(work), "MPLCONFIGDIR": str(work)})
    return env


def _rss_bytes(pids: list) -> int:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


def descendants(pid: int) -> list[int]:
    """A process and all its descendants (Linux /proc), the process first."""
    found, stack = [], [pid]
    while stack:
        p = stack.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False


def kill_jail(proc: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> float:
    """SIGKILL the worker's whole tree (its process group, and every descendant found, jail included) and
    wait until none is left: the GPU context dies with the last one. Returns the seconds it took."""
    started = time.monotonic()
    tree = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()
    while any(_alive(p) for p in tree[1:]) and time.monotonic() - started < grace_s:
        time.sleep(0.05)
    return time.monotonic() - started


def _phase(work: Path) -> str:
    """The worker's `phase` file, read without ever blocking: the learner may have made it a FIFO or a link."""
    try:
        fd = os.open(work / "phase", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return ""
    try:
        return os.read(fd, 16).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    except OSError:
        return ""
    finally:
        os.close(fd)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def jailed_processes(root: int) -> list[int]:
    """The processes inside the jail: below the first bwrap of the tree, bwrap's own processes left out."""
    bwraps = [p for p in descendants(root) if _comm(p) == "bwrap"]
    return [p for p in descendants(bwraps[0]) if _comm(p) != "bwrap"] if bwraps else []


COMPILER_TOOLS = {"ptxas", "gcc", "cc", "cc1", "as", "ld", "collect2", "clang", "nvlink", "cuobjdump", "sh"}


def holds_gpu(pid: int) -> bool:
    """Whether a process has a GPU device open (/dev/nvidia0, /dev/nvidia-uvm...): it made a CUDA context.
    Compilers Triton runs (by their executable, which a learner's process cannot take) do not count."""
    try:
        if Path(os.readlink(f"/proc/{pid}/exe")).name in COMPILER_TOOLS:
            return False
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("/dev/nvidia") and target != "/dev/nvidiactl":
                return True
    except OSError:
        pass
    return False


def _watch(proc: subprocess.Popen, work: Path, limits: Limits,
           gpu_seen: Optional[list] = None) -> tuple[Optional[str], float, Optional[float]]:
    """Wait for the worker; kill it past a budget or the memory limit. (why killed, seconds, freed after s).
    Time is charged to the run budget while the worker's `phase` file says "running", else to the compile one.
    gpu_seen: a one-element list, set to the most processes inside the jail seen holding the GPU at once."""
    started = last = time.monotonic()
    spent = {"compile": 0.0, "run": 0.0}
    polls = 0
    while True:
        try:
            proc.wait(timeout=0.1)
            return None, time.monotonic() - started, None
        except subprocess.TimeoutExpired:
            pass
        polls += 1
        if gpu_seen is not None and polls % 3 == 0:
            gpu_seen[0] = max(gpu_seen[0], sum(holds_gpu(p) for p in jailed_processes(proc.pid)))
        now = time.monotonic()
        running = _phase(work) == "running"
        spent["run" if running and limits.run_s is not None else "compile"] += now - last
        last = now
        why = None
        if spent["compile"] > limits.compile_s:
            why = (f"Your code did not finish compiling within the compile budget of {limits.compile_s:.0f} s and "
                   "was stopped (an endless loop before any kernel ran, or a compilation far too long?).")
        elif limits.run_s is not None and spent["run"] > limits.run_s:
            why = (f"Your code ran past its run budget of {limits.run_s:.0f} s (50x the time the model predicts "
                   "for this phase, at least 10 s) and was stopped: an endless kernel, or one far too slow?")
        else:
            rss = _rss_bytes(descendants(proc.pid))
            if rss > limits.memory_bytes:
                why = (f"Your code used {rss / 2**30:.1f} GiB of host memory, over the limit of "
                       f"{limits.memory_bytes / 2**30:.1f} GiB, and was stopped.")
        if why:
            freed = kill_jail(proc)
            return why + f" The GPU was free again {freed:.1f} s later.", time.monotonic() - started, freed


def _next_uid() -> int:
    return UID_BASE + (os.getpid() * 1000 + next(_run_ids)) % UID_SPAN


def refused_run() -> Optional[WorkerRun]:
    """A WorkerRun saying why learner code is not run here (None when it may run)."""
    st = jail.status()
    return None if st.ok else WorkerRun("refused", st.reason, jail=st.description)


@dataclass
class Started:
    """A worker started in its jail and not yet waited for (start_worker); finish_worker() waits for it."""

    proc: subprocess.Popen
    tail: "_TailReader"
    work: Path
    uid: int
    jail: str
    limits: Limits
    keep_dir: bool
    collect: tuple
    profiled: bool


def run_worker(code: str, job: dict, inputs: dict, limits: Limits, gpu: bool, keep_dir: bool = False,
               reuse: Optional[WorkerRun] = None, profiler: Optional[Callable[[Path], list]] = None,
               collect: tuple = (), files: Optional[dict] = None, outer_env: Optional[dict] = None,
               jail_extra: tuple = (), shared: tuple = (), uid: Optional[int] = None,
               worker: str = "harness.py") -> WorkerRun:
    """Run `code` in a jailed worker. `inputs` (name -> tensor or list) are handed over in inputs.pt, and
    `files` ({name: object}) saved with torch.save; the worker writes result.json and its output tensors.

    reuse: run again in that run's folder, as its uid (its Triton cache saves the compilation); the folder
    then stays, like with keep_dir, until discard(). profiler(work) -> argv of a profiler started *outside*
    the jail around it (ncu); outer_env: what the profiler's own environment adds (its HOME, TMPDIR: the
    jail sets its own). collect: names of text files in the run's folder read back into `files`.
    jail_extra: more bwrap options (diagnostics); shared: the profiler's private namespaces the jail keeps.
    worker: the script the jail runs (harness.py; interpret_worker.py counts a kernel's loads and stores)."""
    refused = refused_run()
    if refused is not None:
        return refused
    return finish_worker(start_worker(code, job, inputs, limits, gpu, keep_dir, reuse, profiler, collect, files,
                                      outer_env, jail_extra, shared, uid, worker))


def start_worker(code: str, job: dict, inputs: dict, limits: Limits, gpu: bool, keep_dir: bool = False,
                 reuse: Optional[WorkerRun] = None, profiler: Optional[Callable[[Path], list]] = None,
                 collect: tuple = (), files: Optional[dict] = None, outer_env: Optional[dict] = None,
                 jail_extra: tuple = (), shared: tuple = (), uid: Optional[int] = None,
                 worker: str = "harness.py") -> Started:
    """run_worker's first half: the run's folder written and the jail started, not waited for. The trusted
    judge starts its profiled worker this way while the check run still runs, so the profiler's, Python's and
    CUDA's start-up are off a verdict's critical path; it hands the inputs over later with hand_over()."""
    import torch

    uid = reuse.uid if reuse is not None and reuse.uid is not None else uid if uid is not None else _next_uid()
    work = reuse.workdir if reuse is not None and reuse.workdir else _new_workdir(uid)
    keep_dir = keep_dir or reuse is not None
    try:
        for stale in ("result.json", "outputs.pt", "phase", "judge-in.pt", "judge-out.pt", *collect):
            (work / stale).unlink(missing_ok=True)
        (work / "solution.py").write_text(code)
        (work / "job.json").write_text(json.dumps({**job, "gpu_memory_fraction": limits.gpu_memory_fraction}))
        torch.save(inputs, work / "inputs.pt")
        for name, obj in (files or {}).items():
            torch.save(obj, work / name)
        for f in work.iterdir():
            if not f.is_dir():
                _own(f, uid)
                os.chmod(f, 0o600)
        st = jail.status()
        argv = _command(work, uid, limits, gpu, profiler(work) if profiler else None, tuple(jail_extra), tuple(shared),
                        worker)
        env = jail.environment(gpu) if st.jailed else _unjailed_env(work, gpu)
        if profiler:
            env.update(outer_env or {})
        proc = subprocess.Popen(argv, cwd=work if not st.jailed else "/", env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
    except BaseException:
        if not keep_dir:
            shutil.rmtree(work, ignore_errors=True)
        raise
    return Started(proc, _TailReader(proc.stderr), work, uid, st.description, limits, keep_dir, tuple(collect),
                   bool(profiler))


def hand_over(started: Started, name: str, obj) -> None:
    """Give a started worker a file it waits for: written aside, then renamed into its folder in one step, so
    the worker never reads half of it."""
    import torch

    aside = started.work / f".{name}.partial"
    torch.save(obj, aside)
    _own(aside, started.uid)
    os.chmod(aside, 0o600)
    os.replace(aside, started.work / name)


def finish_worker(started: Started) -> WorkerRun:
    """Wait for a started worker under its budgets (killing it past one) and read back what it wrote."""
    work, proc = started.work, started.proc
    try:
        gpu_seen = [0] if started.profiled else None  # judged runs: a second process on the GPU escapes the count
        killed, seconds, freed = _watch(proc, work, started.limits, gpu_seen)
        stderr = started.tail.text()
        if killed:
            run = WorkerRun("killed", killed, stderr_tail=stderr, seconds=seconds)
        else:
            run = _read_back(work, proc.returncode, stderr, seconds)
        run.returncode, run.uid, run.jail, run.freed_s = proc.returncode, started.uid, started.jail, freed
        run.gpu_processes = gpu_seen[0] if gpu_seen else 0
        run.files = _collect(work, started.collect)
        run.workdir = work if started.keep_dir else None
        return run
    finally:
        if not started.keep_dir:
            shutil.rmtree(work, ignore_errors=True)


def cancel_worker(started: Started) -> None:
    """Stop a started worker that is no longer wanted (its check failed): the jail killed, its folder gone."""
    if started.proc.poll() is None:
        kill_jail(started.proc)
    if not started.keep_dir:
        shutil.rmtree(started.work, ignore_errors=True)


def _collect(work: Path, names: tuple, limit_bytes: int = 8 * 2**20) -> dict:
    """Text files the run wrote in its folder, up to a size (the learner can write them too: untrusted)."""
    found = {}
    for name in names:
        path = work / name
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= limit_bytes:
            found[name] = path.read_text(errors="replace")
    return found


def discard(run: Optional[WorkerRun]) -> None:
    """Remove a kept run's folder."""
    if run is not None and run.workdir is not None:
        shutil.rmtree(run.workdir, ignore_errors=True)
        run.workdir = None


class _TailReader:
    """Keeps the last 8 kB of a pipe, read on a thread so a chatty worker never blocks on a full pipe."""

    def __init__(self, pipe, keep: int = 8192):
        self.buf, self.keep = b"", keep
        self.thread = threading.Thread(target=self._pump, args=(pipe,), daemon=True)
        self.thread.start()

    def _pump(self, pipe) -> None:
        for chunk in iter(lambda: pipe.read(4096), b""):
            self.buf = (self.buf + chunk)[-self.keep:]

    def text(self) -> str:
        self.thread.join(timeout=5)
        return self.buf.decode(errors="replace")


SIGNALS = {signal.SIGXCPU: "it used up its CPU-time limit", signal.SIGKILL: "it was killed (out of memory?)",
           signal.SIGSEGV: "it crashed (segmentation fault)", signal.SIGABRT: "it aborted",
           signal.SIGXFSZ: "it wrote a file over the size limit"}


def _read_back(work: Path, returncode: int, stderr: str, seconds: float) -> WorkerRun:
    import torch

    result_file = work / "result.json"
    result = {}
    if result_file.is_file() and not result_file.is_symlink() and result_file.stat().st_size < 2**20:
        try:
            result = json.loads(result_file.read_text())
        except ValueError:
            result = {}
    if not isinstance(result, dict) or not result:
        why = SIGNALS.get(-returncode, f"it exited with status {returncode}") if returncode < 0 or returncode \
            else "it wrote no result"
        if returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL, 128 + signal.SIGSEGV):
            why = SIGNALS.get(returncode - 128, why)
        return WorkerRun("crashed", f"The worker running your code stopped: {why}.", stderr_tail=stderr,
                         seconds=seconds)
    outputs = {}
    out_file = work / "outputs.pt"
    if out_file.is_file() and not out_file.is_symlink() and out_file.stat().st_size > 512 * 2**20:
        return WorkerRun("crashed", "The worker's outputs file is far larger than the check cases' outputs.",
                         result, stderr_tail=stderr, seconds=seconds)
    if out_file.is_file() and not out_file.is_symlink():
        try:
            outputs = torch.load(out_file, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a file the learner's process wrote: anything can be wrong
            return WorkerRun("crashed", f"The worker's outputs could not be read back ({exc}).", result,
                             stderr_tail=stderr, seconds=seconds)
    status = "ok" if result.get("status") == "ok" else "error"
    return WorkerRun(status, str(result.get("message", "")), result, outputs if isinstance(outputs, dict) else {},
                     stderr, seconds)
