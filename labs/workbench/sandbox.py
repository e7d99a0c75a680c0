"""The sandbox: a learner's code runs in a separate, fenced-in worker process, never in the app.

Each run gets a fresh worker process with, where the machine allows it:
- no network: a new network namespace (`unshare --net`) holds only a loopback device that is down;
- its own view of the files: a new mount namespace hides the repository (an empty tmpfs over it, the
  virtual environment bound back when it lives inside the repository) and every other run's directory;
- its own process tree: a new PID namespace, so it can neither see nor signal the app;
- an unprivileged user: a user id of its own per run (`setpriv`), so it cannot read other runs' files;
- limits: CPU seconds and open files (`prlimit`), address space on a CPU-only machine (RLIMIT_AS breaks
  CUDA's start-up, which reserves huge virtual ranges), resident memory watched from outside, a share of
  the GPU's memory (set in the worker), and a wall-clock limit after which the whole tree is killed;
- its own temporary directory (HOME, TMPDIR, Triton's cache) removed after the run.

`capabilities()` finds out, once, which of these this machine allows; the page shows the answer.
A second run in the same folder, as the same user, can be wrapped in a profiler (`wrapper`): Nsight
Compute then runs inside the fence with the worker, and the namespace's own loopback device is brought
up for the two to talk (it reaches nothing outside the namespace).
The static check (`static_problems`) only gives a clearer first message: the OS limits are the protection.
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
HARNESS_FILES = (Path(__file__).with_name("harness.py"), REPO / "labs" / "engine" / "timing.py")
SANDBOX_BASE = Path(os.environ.get("ROOFLINE_SANDBOX_DIR", Path(tempfile.gettempdir()) / "roofline-sandbox"))
UID_BASE, UID_SPAN = 200_000, 50_000  # per-run user ids, outside any account on the machine
ALLOWED_MODULES = {"torch", "triton", "math", "numpy", "functools", "typing", "dataclasses", "itertools",
                   "operator", "__future__"}
REFUSED_CALLS = {"__import__", "eval", "exec", "open", "compile", "breakpoint", "input", "globals", "vars"}
_run_ids = itertools.count()


# ---------------------------------------------------------------------------------------------
# What the machine allows
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Capabilities:
    network_namespace: bool
    mount_namespace: bool
    pid_namespace: bool
    separate_user: bool
    rlimits: bool

    def lines(self) -> list[tuple[str, bool, str]]:
        """(protection, active, what it means) for the page and the CLI."""
        return [
            ("no network", self.network_namespace, "a network namespace of its own: connections fail"),
            ("repository and other runs hidden", self.mount_namespace,
             "a mount namespace: the repository is an empty directory, other runs' folders are gone"),
            ("own process tree", self.pid_namespace, "a PID namespace: the app's processes are invisible"),
            ("unprivileged user", self.separate_user, "a user id of its own per run: no one else's files"),
            ("CPU, file and memory limits", self.rlimits, "prlimit: CPU seconds, open files, file sizes, processes"),
            ("wall-clock limit and memory watch", True, "the whole process tree is killed past its limits"),
        ]


def _works(command: list) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    """Try each mechanism once with a harmless command."""
    if os.environ.get("ROOFLINE_SANDBOX_PLAIN") == "1":  # the operator turned the namespaces off
        return Capabilities(False, False, False, False, bool(shutil.which("prlimit")))
    root = os.geteuid() == 0
    ns = ["unshare"] if root else ["unshare", "--user", "--map-root-user"]
    net = bool(shutil.which("unshare")) and _works(ns + ["--net", "true"])
    mount = net and _works(ns + ["--mount", "--fork", "sh", "-c",
                                 "mount -t tmpfs none /mnt 2>/dev/null || mount -t tmpfs none /tmp"])
    pid = net and _works(ns + ["--pid", "--fork", "--mount-proc", "true"])
    user = root and bool(shutil.which("setpriv")) and _works(["setpriv", f"--reuid={UID_BASE}",
                                                             f"--regid={UID_BASE}", "--clear-groups", "true"])
    return Capabilities(net, mount, pid, user, bool(shutil.which("prlimit")))


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
    wall_s: float = 120.0  # the whole worker, Triton's compilation included
    cpu_s: int = 120  # CPU seconds (RLIMIT_CPU)
    memory_bytes: int = 6 * 2**30  # resident memory, watched; also RLIMIT_AS without a GPU
    gpu_memory_fraction: float = 0.0  # share of the GPU's memory the worker may allocate (0: no GPU)
    file_bytes: int = 2 * 2**30  # largest file it may write (RLIMIT_FSIZE)
    processes: int = 512  # processes and threads of the run's own user id (a fork bomb stops here)
    open_files: int = 512  # RLIMIT_NOFILE


@dataclass
class WorkerRun:
    status: str  # "ok", "error" (the worker reported one), "killed" (limit), "crashed"
    message: str = ""  # for the learner
    result: dict = field(default_factory=dict)  # the worker's result.json
    outputs: dict = field(default_factory=dict)  # name -> tensor read back from the worker
    stderr_tail: str = ""
    seconds: float = 0.0
    returncode: Optional[int] = None
    files: dict = field(default_factory=dict)  # name -> text of the files asked for (`collect`), if written
    workdir: Optional[Path] = None  # kept (keep_dir=True) for a second run in the same folder: discard() it
    uid: Optional[int] = None  # the run's own user id, if the machine gives it one


def _new_workdir(uid: Optional[int]) -> Path:
    SANDBOX_BASE.mkdir(parents=True, exist_ok=True)
    os.chmod(SANDBOX_BASE, 0o711)  # others may enter a run's folder they own, never list the base
    work = Path(tempfile.mkdtemp(prefix="run-", dir=SANDBOX_BASE))
    for f in HARNESS_FILES:
        shutil.copy(f, work / f.name)
    if uid is not None:
        os.chown(work, uid, uid)
    os.chmod(work, 0o700)
    return work


def _closed_ancestor(path: Path) -> Optional[Path]:
    """The highest directory above `path` that other users cannot enter (e.g. /root for a pyenv Python)."""
    for parent in reversed(path.parents):
        if parent != Path("/") and parent.exists() and not parent.stat().st_mode & 0o001:
            return parent
    return None


def _hide_keeping(hidden: Path, keep: list, stage: Path) -> list:
    """Shell lines: an empty tmpfs over `hidden`, with the paths in `keep` bound back at their places."""
    lines = []
    for i, path in enumerate(keep):
        lines += [f"mkdir -p '{stage}/{i}'", f"mount --bind '{path}' '{stage}/{i}'"]
    lines.append(f"mount -t tmpfs -o size=1m,mode=755 roofline-hidden '{hidden}'")
    for i, path in enumerate(keep):
        lines += [f"mkdir -p '{path}'", f"mount --bind '{stage}/{i}' '{path}'", f"umount '{stage}/{i}'",
                  f"rmdir '{stage}/{i}'"]
    return lines


LOOPBACK_UP = ("import fcntl, socket, struct; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
               "flags = struct.unpack('16sh', fcntl.ioctl(s, 0x8913, struct.pack('16sh22x', b'lo', 0))[:18])[1]; "
               "fcntl.ioctl(s, 0x8914, struct.pack('16sh22x', b'lo', flags | 1))")  # SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP


def _mount_script(work: Path, caps: Capabilities, loopback: bool = False) -> str:
    """Shell run as root inside the new namespaces: (for a profiled run) bring up the namespace's own
    loopback device, hide the repository and the other runs, then drop to the run's user and exec the
    worker (its arguments follow the script)."""
    lines = [f"'{sys.executable}' -I -c \"{LOOPBACK_UP}\" 2>/dev/null || true"] if loopback else []
    if not caps.mount_namespace:
        return "\n".join(lines + ['exec "$@"'])
    interpreter = [Path(sys.prefix), Path(sys.base_prefix)]
    lines += ["set -e", "mount --make-rprivate / 2>/dev/null || true"]
    # the repository: empty, but for a virtual environment that lives inside it (staged in the run's folder)
    lines += _hide_keeping(REPO, [p for p in interpreter if REPO in p.parents], work / ".stage")
    stage = REPO / ".stage"  # the repository's tmpfs is ours to write from here on
    # a Python installed under a closed home (/root/.pyenv): that home hidden, the installation kept
    for path in interpreter:
        closed = _closed_ancestor(path)
        if closed is not None and REPO not in path.parents and closed != REPO:
            lines += _hide_keeping(closed, [path], stage)
    # other runs' folders: an empty tmpfs over the base, this run's folder bound back into it
    lines += _hide_keeping(SANDBOX_BASE, [work], stage)
    lines += [f"rmdir '{stage}' 2>/dev/null || true", 'exec "$@"']
    return "\n".join(lines)


def _command(work: Path, uid: Optional[int], limits: Limits, caps: Capabilities, gpu: bool,
             wrapper: tuple = (), loopback: bool = False) -> list:
    python = list(wrapper) + [sys.executable, "-B", str(work / "harness.py"), str(work)]
    fence = []
    if caps.rlimits:
        fence = ["prlimit", f"--cpu={int(limits.cpu_s)}:{int(limits.cpu_s) + 5}", f"--nofile={limits.open_files}",
                 f"--fsize={limits.file_bytes}",
                 "--core=0"]
        if not gpu:
            fence.append(f"--as={limits.memory_bytes + 2 * 2**30}")  # torch itself reserves ~2 GB of addresses
        if uid is not None:  # RLIMIT_NPROC counts the processes and threads of a user id: this run's alone
            fence.append(f"--nproc={limits.processes}")
        fence.append("--")
    user = []
    if uid is not None:
        user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    inner = user + fence + python
    if not caps.network_namespace:
        return inner
    ns = ["unshare"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user"]
    ns += ["--net"]
    if caps.mount_namespace:
        ns += ["--mount"]
    if caps.pid_namespace:
        ns += ["--pid", "--fork", "--mount-proc", "--kill-child"]
    elif caps.mount_namespace:
        ns += ["--fork"]
    return ns + ["sh", "-c", _mount_script(work, caps, loopback), "roofline-sandbox"] + inner


def _environment(work: Path, gpu: bool) -> dict:
    """A clean environment: nothing of the app's but what Python, CUDA and Triton need to start."""
    keep = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
            "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "CC", "LANG")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    outside_repo = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                    if p and REPO != Path(p).resolve() and REPO not in Path(p).resolve().parents]
    env.update({"HOME": str(work), "TMPDIR": str(work), "TRITON_CACHE_DIR": str(work / ".triton"),
                "PYTHONPATH": os.pathsep.join([str(work)] + outside_repo), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MPLCONFIGDIR": str(work)})
    if not gpu:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                children = (task / "children").read_text().split()
                stack.extend(int(c) for c in children)
        except (OSError, ValueError):
            continue
    return total


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def _watch(proc: subprocess.Popen, limits: Limits) -> tuple[Optional[str], float]:
    """Wait for the worker; kill it past its wall-clock or memory limit. Returns (why killed, seconds)."""
    started = time.monotonic()
    while True:
        try:
            proc.wait(timeout=0.2)
            return None, time.monotonic() - started
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.monotonic() - started
        if elapsed > limits.wall_s:
            _kill_tree(proc)
            proc.wait()
            return (f"Your code ran past the wall-clock limit of {limits.wall_s:.0f} s and was stopped "
                    "(an endless loop, or a kernel far too slow for this size?)."), elapsed
        rss = _rss_bytes(proc.pid)
        if rss > limits.memory_bytes:
            _kill_tree(proc)
            proc.wait()
            return (f"Your code used {rss / 2**30:.1f} GiB of host memory, over the limit of "
                    f"{limits.memory_bytes / 2**30:.1f} GiB, and was stopped."), elapsed


def _next_uid() -> Optional[int]:
    return UID_BASE + (os.getpid() * 1000 + next(_run_ids)) % UID_SPAN if capabilities().separate_user else None


def run_worker(code: str, job: dict, inputs: dict, limits: Limits, gpu: bool, keep_dir: bool = False,
               reuse: Optional[WorkerRun] = None, wrapper=None, collect: tuple = ()) -> WorkerRun:
    """Run `code` in a sandboxed worker. `inputs` (name -> tensor or list) are handed over in a file; the
    worker writes result.json and its output tensors, which are read back here.

    reuse: run again in that run's folder, as its user (its Triton cache saves the compilation); the
    folder then stays, like with keep_dir, until discard(). wrapper(work) -> argv prefix put before the
    worker's python inside the fence (a profiler); it also brings up the namespace's loopback device.
    collect: names of text files the worker (or the wrapper) writes in its folder, read back into `files`."""
    import torch

    caps = capabilities()
    uid = reuse.uid if reuse is not None else _next_uid()
    work = reuse.workdir if reuse is not None and reuse.workdir else _new_workdir(uid)
    keep_dir = keep_dir or reuse is not None
    try:
        for stale in ("result.json", "outputs.pt", *collect):
            (work / stale).unlink(missing_ok=True)
        (work / "solution.py").write_text(code)
        (work / "job.json").write_text(json.dumps({**job, "gpu_memory_fraction": limits.gpu_memory_fraction}))
        torch.save(inputs, work / "inputs.pt")
        for f in work.iterdir():
            if f.is_dir():
                continue
            if uid is not None:
                os.chown(f, uid, uid)
            os.chmod(f, 0o600)
        prefix = tuple(wrapper(work)) if wrapper else ()
        proc = subprocess.Popen(_command(work, uid, limits, caps, gpu, prefix, loopback=bool(prefix)), cwd=work,
                                env=_environment(work, gpu), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        tail = _TailReader(proc.stderr)
        killed, seconds = _watch(proc, limits)
        stderr = tail.text()
        if killed:
            run = WorkerRun("killed", killed, stderr_tail=stderr, seconds=seconds)
        else:
            run = _read_back(work, proc.returncode, stderr, seconds)
        run.returncode, run.uid = proc.returncode, uid
        run.files = _collect(work, collect)
        run.workdir = work if keep_dir else None
        return run
    finally:
        if not keep_dir:
            shutil.rmtree(work, ignore_errors=True)


def _collect(work: Path, names: tuple, limit_bytes: int = 8 * 2**20) -> dict:
    """Text files the run wrote in its folder (a profiler's log), up to a size (the learner can write them too)."""
    files = {}
    for name in names:
        path = work / name
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= limit_bytes:
            files[name] = path.read_text(errors="replace")
    return files


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
    if result_file.exists() and result_file.stat().st_size < 2**20:
        try:
            result = json.loads(result_file.read_text())
        except ValueError:
            result = {}
    else:
        result = {}
    if not result:
        why = SIGNALS.get(-returncode, f"it exited with status {returncode}") if returncode < 0 or returncode \
            else "it wrote no result"
        if returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            why = SIGNALS.get(returncode - 128, why)
        return WorkerRun("crashed", f"The worker running your code stopped: {why}.", stderr_tail=stderr,
                         seconds=seconds)
    outputs = {}
    out_file = work / "outputs.pt"
    if out_file.exists():
        try:
            outputs = torch.load(out_file, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a file the learner's process wrote: anything can be wrong
            return WorkerRun("crashed", f"The worker's outputs could not be read back ({exc}).", result,
                             stderr_tail=stderr, seconds=seconds)
    status = "ok" if result.get("status") == "ok" else "error"
    return WorkerRun(status, result.get("message", ""), result, outputs if isinstance(outputs, dict) else {},
                     stderr, seconds)
