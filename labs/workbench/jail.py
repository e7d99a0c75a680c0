"""The jail: every learner process runs inside bubblewrap (bwrap), an existing, audited sandbox.

What the learner's process sees and may do (built by `bwrap_args`):
- files: an empty root with read-only /usr (and the /bin, /lib... links into it), the few /etc files the
  dynamic loader needs, the Python installation and virtual environment the app runs on (read-only), the
  CUDA libraries the app's LD_LIBRARY_PATH names, the GPU's /dev/nvidia* nodes, /sys read-only on a GPU (the
  CUDA driver reads the PCI topology there), a private /tmp, and its own run folder as /run/learner (writable, its
  Triton cache inside). Nothing of the repository, /root, /home, other runs' folders or the app's
  environment variables (`--clearenv`, then only what Python, CUDA and Triton need);
- its own user, PID, IPC, UTS, cgroup and network namespaces (what `--unshare-all` makes; the network one
  holds only a loopback device: nothing outside is reachable). Under the judge's profiler (ncu, outside the
  jail) the network namespace, and where ncu needs them the IPC and PID ones, are the profiler's private
  ones, made for that run (labs.workbench.judge);
- its own uid: as root the app first drops to a per-run host uid (`setpriv`) where the Python installation
  is readable by it, else bwrap maps a per-run uid inside a user namespace with no capabilities;
- `--die-with-parent`: when the app (or the CLI, or ncu that launched it) dies, the whole jail dies;
  `--new-session`: it cannot reach the app's terminal;
- rlimits (`prlimit`): CPU seconds, open files, file size, processes, core dumps, address space without a GPU.

bwrap missing or failing -> `status().ok` is False and the workbench refuses learner code, unless the
operator sets ROOFLINE_WORKBENCH_UNJAILED=1 (a single-user laptop: the code then runs as the app's own user,
with the rlimits, the clean environment and the kill on parent death, but sees the app's files and network).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
UNJAILED_ENV = "ROOFLINE_WORKBENCH_UNJAILED"  # "1": the operator runs learner code without a jail (laptop)
BWRAP_ENV = "ROOFLINE_BWRAP"  # the bwrap binary, if not on the PATH (e.g. a .deb unpacked with dpkg -x)
INSIDE = Path("/run/learner")  # the run folder, as the learner's process sees it
HOSTNAME = "roofline-jail"


@dataclass(frozen=True)
class JailStatus:
    ok: bool  # learner code may run here
    jailed: bool  # ... inside bubblewrap
    mode: str  # "host-uid" (setpriv + bwrap), "userns-uid" (bwrap maps the uid), "unjailed", "refused"
    description: str  # for the verdict, the page and the CLI
    reason: str = ""  # why refused (or why unjailed)


def bwrap_path() -> Optional[str]:
    configured = os.environ.get(BWRAP_ENV)
    if configured:
        return configured if os.path.isfile(configured) and os.access(configured, os.X_OK) else None
    return shutil.which("bwrap")


def unjailed_allowed() -> bool:
    return os.environ.get(UNJAILED_ENV) == "1"


REFUSAL = ("Learner code is not run on this server: {why} The workbench runs every submission inside "
           "bubblewrap (the Debian/Ubuntu package 'bubblewrap'; `apt-get install bubblewrap`, or set {bwrap_env} "
           "to its binary). In Docker, start the container with the README's `docker run` line (it allows the "
           "namespaces bubblewrap needs). On a single-user laptop only, {env}=1 runs submissions without a jail.")


def refusal(why: str) -> str:
    return REFUSAL.format(why=why, env=UNJAILED_ENV, bwrap_env=BWRAP_ENV)


# ---------------------------------------------------------------------------------------------
# The file view
# ---------------------------------------------------------------------------------------------
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")


def _inside_repo(path: Path) -> bool:
    path = path.resolve()
    return path == REPO or REPO in path.parents


def python_paths() -> list[Path]:
    """The Python installation and the virtual environment (resolved: a venv can be a link)."""
    paths = []
    for p in (Path(sys.base_prefix), Path(sys.prefix)):
        for q in (p, p.resolve()):
            if q not in paths and not str(q).startswith("/usr/") and q.exists():
                paths.append(q)
    return paths


def _closed(p: Path) -> bool:
    """A path the jail never shows, whatever the environment says: the repository, homes, /root."""
    r = p.resolve()
    return _inside_repo(r) or r == Path("/") or str(r).startswith(("/root", "/home")) and not \
        any(r == q or q in r.parents for q in python_paths())


def _install_root(p: Path) -> Path:
    """/opt/gcc for /opt/gcc/bin/gcc: a tool's installation, libraries beside its bin/ included."""
    folder = p if p.is_dir() else p.parent
    return folder.parent if folder.name == "bin" else folder


def library_paths() -> list[Path]:
    """CUDA libraries and tools outside /usr that the app's environment points at (read-only): its
    LD_LIBRARY_PATH and CUDA_HOME, the compiler ($CC: Triton builds its launcher with it) and Triton's tool
    paths, and the PATH's folders outside /usr (a compiler found there)."""
    candidates = []
    for var in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"):
        candidates += [Path(part) for part in os.environ.get(var, "").split(os.pathsep) if part]
    for var in ("CC", "CXX", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "TRITON_CUOBJDUMP_PATH",
                "TRITON_NVDISASM_PATH"):
        value = os.environ.get(var, "")
        if value:
            found = shutil.which(value) or value
            candidates.append(_install_root(Path(found)))
    candidates += [_install_root(Path(part)) for part in os.environ.get("PATH", "").split(os.pathsep) if part]
    candidates += [Path("/usr/local/nvidia"), Path("/opt/nvidia")]  # driver libraries and Nsight in some images
    found = []
    for p in candidates:
        if p.is_dir() and not str(p.resolve()).startswith("/usr/") and str(p.resolve()) not in ("/usr", "/bin", "/sbin") \
                and not _closed(p) and p not in found and p not in python_paths():
            found.append(p)
    return found


def bwrap_args(work: Path, gpu: bool, uid: Optional[int], env: dict, share_net: bool = False,
               extra_ro: tuple = (), extra: tuple = (), shared: tuple = ()) -> list:
    """bwrap's options (without the binary and without the command). share_net: a profiler outside the jail
    (in namespaces of its own, made for this run) injects into the worker: its variables pass (no --clearenv;
    the process that starts bwrap already has the clean environment) and its network namespace (a loopback
    only) is shared; `shared` may name more of the profiler's private namespaces to keep: "ipc", "pid"."""
    args = ["--unshare-user-try", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--hostname", HOSTNAME, "--cap-drop", "ALL"]
    args += [] if share_net else ["--unshare-net"]
    args += [] if "ipc" in shared else ["--unshare-ipc"]
    args += [] if "pid" in shared else ["--unshare-pid"]
    if uid is not None:
        args += ["--unshare-user", "--uid", str(uid), "--gid", str(uid)]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    for f in ETC_FILES:
        args += ["--ro-bind-try", f, f]
    # in the profiler's PID namespace, its /proc (mounted for that namespace) is bound read-only
    args += ["--ro-bind", "/proc", "/proc"] if "pid" in shared else ["--proc", "/proc"]
    args += ["--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/tmp/home"]
    if gpu:
        for node in sorted(Path("/dev").glob("nvidia*")):
            if node.is_char_device() or node.is_dir():
                args += ["--dev-bind", str(node), str(node)]
        args += ["--ro-bind-try", "/sys", "/sys"]
    for p in python_paths() + library_paths() + [Path(x) for x in extra_ro]:
        args += ["--ro-bind", str(p), str(p)]
    args += ["--bind", str(work), str(INSIDE), *extra, "--chdir", str(INSIDE)] + ([] if share_net else ["--clearenv"])
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def environment(gpu: bool) -> dict:
    """The learner's environment: nothing of the app's but what Python, CUDA and Triton need to start."""
    keep = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
            "NVIDIA_DRIVER_CAPABILITIES", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "CC", "LANG")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent)] + env["PATH"].split(os.pathsep))
    env.update({"HOME": "/tmp/home", "TMPDIR": "/tmp", "TRITON_CACHE_DIR": str(INSIDE / ".triton"),
                "PYTHONPATH": str(INSIDE), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1", "MPLCONFIGDIR": "/tmp/home", "USER": "learner", "LOGNAME": "learner"})
    if not gpu:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


# ---------------------------------------------------------------------------------------------
# Which way of jailing this machine allows (tried once, for real)
# ---------------------------------------------------------------------------------------------
def _setpriv(uid: int) -> list:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def prefix(mode: str, uid: int) -> list:
    """What goes before bwrap's own arguments: the uid drop (host-uid mode) and bwrap."""
    bwrap = bwrap_path()
    if mode == "host-uid":
        return _setpriv(uid) + [bwrap]
    return [bwrap]


def bwrap_uid(mode: str, uid: int) -> Optional[int]:
    """The uid the learner sees inside: its own per-run uid in both modes."""
    return uid


def _try(mode: str, uid: int, probe_dir: Path) -> str:
    """'' if `python -c ...` starts inside a jail of this mode, else bwrap's complaint."""
    if mode == "host-uid":
        os.chown(probe_dir, uid, uid)
    argv = prefix(mode, uid) + bwrap_args(probe_dir, False, bwrap_uid(mode, uid), environment(False)) + \
        [sys.executable, "-B", "-s", "-c", "import os; assert os.getcwd() == '/run/learner'; print('jailed')"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode == 0 and "jailed" in done.stdout:
        return ""
    return (done.stderr or done.stdout).strip().splitlines()[-1:][0] if (done.stderr or done.stdout).strip() \
        else f"bwrap exited with status {done.returncode}"


@functools.lru_cache(maxsize=1)
def status() -> JailStatus:
    """How learner code runs here (probed once per process)."""
    import tempfile

    bwrap = bwrap_path()
    if bwrap is None:
        why = (f"bubblewrap was not found ({BWRAP_ENV} names no executable file)." if os.environ.get(BWRAP_ENV)
               else "bubblewrap (bwrap) is not installed.")
        return _unjailed_or_refused(why)
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip() or "bwrap"
    modes = (["host-uid"] if os.geteuid() == 0 and shutil.which("setpriv") else []) + ["userns-uid"]
    complaints = []
    for mode in modes:
        probe_dir = Path(tempfile.mkdtemp(prefix="roofline-jail-probe-"))
        try:
            os.chmod(probe_dir, 0o700)
            complaint = _try(mode, 250_000, probe_dir)
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
        if not complaint:
            uid_words = ("a uid of its own on this machine" if mode == "host-uid"
                         else "a uid of its own inside a user namespace without capabilities")
            return JailStatus(True, True, mode, f"{version}: namespaces of its own (user, PID, IPC, UTS, cgroup, "
                                                f"network: no network), {uid_words}, --die-with-parent, minimal "
                                                f"read-only file view, rlimits")
        complaints.append(f"{mode}: {complaint}")
    return _unjailed_or_refused(f"bubblewrap is installed but could not start a jail here ({'; '.join(complaints)}).")


def _unjailed_or_refused(why: str) -> JailStatus:
    if unjailed_allowed():
        return JailStatus(True, False, "unjailed", f"no jail ({UNJAILED_ENV}=1, the operator's choice for a "
                                                   "single-user machine): rlimits, clean environment, killed "
                                                   "with the app", why)
    return JailStatus(False, False, "refused", "refused: no jail", refusal(why))
