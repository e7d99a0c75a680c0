"""A class on a GPU pool: lab runs served by Dask distributed workers, one worker per GPU.

    bash scripts/pool_certs.sh                                        the pool's TLS certificates (once)
    python -m labs.engine.pool scheduler [--port 8786]               the pool's scheduler (one per class)
    python -m labs.engine.pool worker tls://HOST:8786 [--gpus 0,1]   one worker per GPU of this machine
    ROOFLINE_CLUSTER=tls://HOST:8786 ./roofline app            app processes send their runs to the pool

Who may submit. A Dask scheduler runs whatever its clients send, on the GPU workers. So a scheduler that
listens beyond this machine speaks TLS only (tls://), and Dask checks both ends of every connection
against the pool's own certificate authority (distributed.Security): a client, worker or app without a
certificate that CA signed cannot connect, let alone submit. The certificates live in the folder
ROOFLINE_POOL_CERTS names (default ~/.roofline/pool-certs), made by scripts/pool_certs.sh (openssl).
Plain tcp:// is for a pool on one machine (127.0.0.1); beyond it only with ROOFLINE_POOL_INSECURE=1 (or
--insecure), for a private network where everyone who can reach the port may run code on the GPUs.

How a run travels. The app process (runner.run, with ROOFLINE_CLUSTER set) looks the run up in the
shared result cache (labs/cache.py); on a miss it submits `execute` to the scheduler under a key made
of the lab and the cache key, so a whole class pressing Run on the same parameters shares one task.
The task asks for the resources {"GPU": 1, "gpu-kind-<kind>": 1}: every worker offers exactly one GPU,
so a worker never runs two labs at once while two workers run two labs at the same time, and the kind
resource keeps a run on the GPU model its cache key names (results never mix kinds). On the worker the
embedded runner measures under that process's lock, so the lock's enter/exit log names the GPU. While
the run waits, the app asks the scheduler how many runs of its kind are ahead (`on_wait`); once a worker
starts it, the worker's progress messages reach the page through the scheduler's event log. A workbench
submission travels the same queue (`run_named`): its code as text to a worker, judged there under that GPU's
lock by labs.workbench.verdict, in a jail that sees that worker's GPU only; its verdict back as JSON.

A worker that dies mid-run is noticed by the scheduler, which starts the task again on a live worker
(the scheduler is started with allowed-failures = 1: one retry, then the learner is told). Dask's
resources, work stealing, retries and restarts (the nanny) do the scheduling: nothing here is a scheduler.

Dask and distributed are imported inside functions: the embedded default never needs them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlsplit

from labs.engine import cache
from labs.engine import gpu as gpu_mod
from labs.engine import local
from labs.engine.lab import Lab, Progress, noop_progress
from labs.engine.params import ParamError, to_dict
from labs.engine.results import Result

GPU_RESOURCE = "GPU"  # every worker offers one; every run asks for one
KIND_PREFIX = "gpu-kind-"  # + the GPU's key ("nvidia-h200"): a run only goes to its kind
CPU_KIND = "cpu"  # workers without a GPU (tests, demos of the pool): labs measure on the CPU
RUN_PREFIX = "roofline-run"  # task keys: roofline-run-<lab>-<cache key>
STARTED_TOPIC = "roofline-started"  # event log: a worker began an attempt of a run
PROGRESS_TOPIC = "roofline-progress"  # event log: a running lab's progress messages
POLL_S = 0.5  # how often a waiting app session asks the scheduler about its run
PROGRESS_EVERY_S = 0.5  # a worker forwards at most one progress message per this many seconds
CONNECT_TIMEOUT_S = 10
RETRY_UNREACHABLE_S = 15  # after a failed connection, say so at once for this long (pages render fast)
DEFAULT_PORT = 8786
DEFAULT_HOST = "0.0.0.0"  # every interface: beyond this machine, so TLS unless --host 127.0.0.1
CERTS_ENV = "ROOFLINE_POOL_CERTS"  # the folder of ca.pem, pool.pem, pool-key.pem
INSECURE_ENV = "ROOFLINE_POOL_INSECURE"  # "1": plain tcp:// beyond this machine (a private network)
CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "pool.pem", "pool-key.pem"

_client = None
_client_address = ""
_client_lock = threading.Lock()
_unreachable = (0.0, "")  # (monotonic time until which we do not retry, the reason)
_last_kinds: dict = {}  # the pool's kinds at the last look, for messages


# ---------------------------------------------------------------------------------------------
# Who may submit: TLS with the pool's certificates beyond this machine
# ---------------------------------------------------------------------------------------------
def certs_dir() -> Path:
    return Path(os.environ.get(CERTS_ENV) or Path.home() / ".roofline" / "pool-certs").expanduser()


def cert_files() -> tuple:
    """(ca.pem, pool.pem, pool-key.pem) of this machine; a ParamError that says how to make them if any is missing."""
    folder = certs_dir()
    files = tuple(folder / name for name in (CA_FILE, CERT_FILE, KEY_FILE))
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ParamError(f"The GPU pool speaks TLS beyond this machine and {folder} lacks {', '.join(missing)}. "
                         f"Make the certificates once with `bash scripts/pool_certs.sh {folder}`, copy ca.pem, "
                         f"pool.pem and pool-key.pem to every machine of the pool, and point {CERTS_ENV} at that "
                         "folder.")
    return tuple(str(f) for f in files)


def security():
    """distributed.Security for tls:// addresses: this machine's certificate, checked against the pool's CA
    on both ends of every connection (client, scheduler, worker)."""
    from distributed.security import Security

    ca, cert, key = cert_files()
    return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, tls_scheduler_cert=cert,
                    tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key, require_encryption=True)


def is_local(host: Optional[str]) -> bool:
    """True for an address only this machine can reach."""
    host = (host or "").strip("[]").lower()
    return host == "localhost" or host.startswith("127.") or host == "::1"


def security_for(address: str):
    """The Security a connection to `address` needs (None for plain tcp:// on this machine).

    tls:// gets the pool's certificates; tcp:// beyond this machine is refused unless ROOFLINE_POOL_INSECURE=1:
    without TLS anyone who reaches the scheduler can run code on its GPU workers."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme == "tls":
        return security()
    if parts.scheme in ("tcp", "") and not is_local(parts.hostname) and os.environ.get(INSECURE_ENV) != "1":
        raise ParamError(f"The GPU pool at {address} would be reached without TLS: whoever reaches a plain tcp:// "
                         "scheduler can run code on its GPU workers. Use its tls:// address (README, 'Threat model: "
                         f"the web surface and the pool'), or set {INSECURE_ENV}=1 on a private network you trust.")
    return None


# ---------------------------------------------------------------------------------------------
# The app side: connect, find the GPUs, submit, wait with the queue position
# ---------------------------------------------------------------------------------------------
def client():
    """This process's one Client of the scheduler named by ROOFLINE_CLUSTER (made on first use)."""
    global _client, _client_address, _unreachable
    address = local.cluster_address()
    with _client_lock:
        if _client is not None and _client_address == address and _client.status == "running":
            return _client
        until, reason = _unreachable
        if time.monotonic() < until:
            raise ParamError(reason)
        from distributed import Client

        security = security_for(address)  # a ParamError for plain tcp:// beyond this machine or missing certificates
        try:
            _client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False, security=security)
        except (OSError, TimeoutError, ValueError) as exc:
            reason = (f"The GPU pool's scheduler at {address} cannot be reached ({type(exc).__name__}: {exc}). "
                      "Start it with `python -m labs.engine.pool scheduler`, or unset ROOFLINE_CLUSTER to use this "
                      "machine's GPU.")
            _unreachable = (time.monotonic() + RETRY_UNREACHABLE_S, reason)
            raise ParamError(reason) from None
        _client_address = address
        return _client


def workers_by_kind() -> dict:
    """{GPU kind: [worker names]} of the workers connected now."""
    global _last_kinds
    kinds: dict = {}
    try:
        info = client().scheduler_info(n_workers=-1)  # newer distributed lists 5 workers unless asked for all
    except TypeError:  # older distributed: always all of them
        info = client().scheduler_info()
    for worker in info["workers"].values():
        resources = worker.get("resources") or {}
        for name in resources:
            if name.startswith(KIND_PREFIX) and resources.get(GPU_RESOURCE):
                kinds.setdefault(name[len(KIND_PREFIX):], []).append(str(worker.get("name")))
    _last_kinds = {kind: sorted(names) for kind, names in kinds.items()}
    return _last_kinds


def choose_kind(kinds: dict) -> str:
    """The kind this app runs on: ROOFLINE_GPU_KIND if set, else the kind with the most workers."""
    wanted = os.environ.get("ROOFLINE_GPU_KIND", "").strip()
    address = local.cluster_address()
    if wanted:
        if wanted not in kinds:
            raise ParamError(f"ROOFLINE_GPU_KIND={wanted} but the pool at {address} has no worker of that kind "
                             f"(it has: {', '.join(kinds) or 'none'}).")
        return wanted
    if not kinds:
        raise ParamError(f"The GPU pool at {address} has no GPU workers yet: start one per GPU with "
                         f"`python -m labs.engine.pool worker {address}`.")
    return max(sorted(kinds), key=lambda kind: len(kinds[kind]))


def gpu_info() -> gpu_mod.GpuInfo:
    """What the page's Run button runs on (or why it cannot run)."""
    try:
        kinds = workers_by_kind()
        kind = choose_kind(kinds)
    except ParamError as exc:
        return gpu_mod.GpuInfo(False, str(exc))
    return gpu_mod.GpuInfo(True, name=f"the GPU pool ({len(kinds[kind])} x {kind})")


def waiting_message(position: int) -> str:
    kind = choose_kind(_last_kinds) if _last_kinds else "GPU"
    count = len(_last_kinds.get(kind, ())) or "its"
    return (f"Waiting for a GPU of the pool ({count} x {kind}): {position} run(s) ahead of yours "
            "across the pool.")


def cached(lab: Lab, params) -> Optional[Result]:
    kind = choose_kind(workers_by_kind())
    return cache.get(cache.key(lab.name, to_dict(params), kind))


def run(lab: Lab, params, progress: Progress, on_wait: Optional[Callable[[int], None]],
        use_cache: bool, time_limit_s: float) -> Result:
    """runner.run on the pool: the shared cache, else one task on a GPU of the chosen kind."""
    kind = choose_kind(workers_by_kind())
    params_dict = to_dict(params)
    cache_key = cache.key(lab.name, params_dict, kind)
    if use_cache:
        hit = cache.get(cache_key)
        if hit is not None:
            return hit
    task_key = f"{RUN_PREFIX}-{lab.name}-{cache_key}" + ("" if use_cache else f"-{uuid.uuid4().hex}")
    # the Lab travels pickled: its functions by reference (the worker imports labs.<name>)
    future = client().submit(execute, lab, params, kind, time_limit_s, uuid.uuid4().hex, key=task_key,
                             resources={GPU_RESOURCE: 1, KIND_PREFIX + kind: 1}, pure=False,
                             fifo_timeout=0)  # every submission its own generation: strict first come, first served
    try:
        result = _wait(future, progress, on_wait)
    finally:
        future.release()
    if result.complete:
        cache.put(cache_key, result)
    return result


def _wait(future, progress: Progress, on_wait: Optional[Callable[[int], None]]) -> Result:
    """The lab run's Result once its task ends, with a word when a worker died under it."""
    result = Result.from_dict(_await(future, progress, on_wait))
    _explain_retries(result, _attempts(future.key), _scheduler_call(key=future.key, field="suspicious") or 0)
    return result


def _await(future, progress: Progress, on_wait: Optional[Callable[[int], None]]):
    """Poll until the task ends: queue position while it waits, progress while a worker runs it; its value."""
    from distributed import KilledWorker
    from distributed.utils import CancelledError  # what a cancelled future raises, whichever Python

    position, shown_progress = None, None
    while True:
        try:
            data = future.result(timeout=POLL_S)
            break
        except TimeoutError:
            if future.client.status not in ("running", "connecting"):
                raise ParamError("This app lost the GPU pool's scheduler during your run; press Run again.") from None
        except CancelledError:
            raise ParamError("The GPU pool dropped your run (its scheduler restarted or this app lost it); "
                             "press Run again.") from None
        except KilledWorker:
            starts = _attempts(future.key)
            names = ", ".join(s.get("worker_name", "?") for s in starts) or "the worker"
            raise ParamError(f"The GPU worker running your run stopped mid-run twice ({names}); nothing was kept. "
                             "Press Run to try again, or ask whoever runs the pool to look at its workers.") from None
        starts = _attempts(future.key)
        if starts:
            latest = _latest_progress(future.key, starts[-1]["token"]) or (0.0, f"running on {starts[-1]['worker_name']}")
            if latest != shown_progress:
                shown_progress = latest
                progress(*latest)
        elif on_wait is not None:
            ahead = runs_ahead(future.key)
            if ahead is not None and ahead != position:
                position = ahead
                on_wait(ahead)
    return data


def _explain_retries(result: Result, starts: list, deaths: int) -> None:
    """Tell the learner when a worker died under their run and another one ran it. The scheduler counts
    the deaths; the start events name the workers (a worker that dies at once may not have sent its own)."""
    if deaths or len(starts) > 1:
        died = ", ".join(s.get("worker_name", "?") for s in starts[:-1]) or "running it"
        ran = result.meta.get("pool", {}).get("worker_name", "another worker")
        result.messages.append(f"The GPU worker {died} stopped during this run; the pool ran it again on "
                               f"{ran}, whose result this is.")


def _events(topic: str, task_key: str) -> list:
    return [msg for _stamp, msg in client().get_events(topic) if isinstance(msg, dict) and msg.get("key") == task_key]


def _attempts(task_key: str) -> list:
    """The start events of this task's current submission (an older task of the same key had another token)."""
    starts = _events(STARTED_TOPIC, task_key)
    if not starts:
        return []
    token = starts[-1].get("token")
    return [s for s in starts if s.get("token") == token]


def _latest_progress(task_key: str, token: str):
    mine = [m for m in _events(PROGRESS_TOPIC, task_key) if m.get("token") == token]
    return (float(mine[-1]["fraction"]), str(mine[-1]["message"])) if mine else None


def _scheduler_view():
    """A function the scheduler runs (sent by value: the scheduler need not import Roofline).

    For one task: how many unfinished Roofline runs that ask for the same resources are ahead of it in
    the scheduler's priority order (submission order, FIFO), or how many of its workers died under it
    (field="suspicious"); without a key, the number of unfinished runs.
    """
    def view(dask_scheduler, key=None, prefix="roofline-run", field="ahead"):
        unfinished = ("released", "waiting", "queued", "no-worker", "processing")
        runs = [ts for k, ts in dask_scheduler.tasks.items() if str(k).startswith(prefix) and ts.state in unfinished]
        if key is None:
            return len(runs)
        mine = dask_scheduler.tasks.get(key)
        if mine is None or mine.priority is None:
            return None
        if field == "suspicious":  # how many workers died while running it
            return mine.suspicious
        same = [ts for ts in runs if ts.resource_restrictions == mine.resource_restrictions and ts is not mine]
        return sum(1 for ts in same if ts.priority is not None and ts.priority < mine.priority)

    return view


def _scheduler_call(**kwargs):
    return client().run_on_scheduler(_scheduler_view(), prefix=RUN_PREFIX, **kwargs)


def runs_ahead(task_key: str) -> Optional[int]:
    """Runs of the same GPU kind submitted before this one and not finished (running or queued)."""
    return _scheduler_call(key=task_key)


def queue_length() -> int:
    """Unfinished runs in the whole pool, running or waiting."""
    try:
        return int(_scheduler_call())
    except ParamError:
        return 0


def call(label: str, fn: Callable, *args, **kwargs):
    """Run `fn(*args, **kwargs)` on a GPU of the pool under that worker's lock and return its value.

    For GPU work that is not a lab run (a sandbox, a hardware-counter probe): it then queues with the
    labs on the same GPUs instead of timing on a GPU that a worker is timing on.
    """
    kind = choose_kind(workers_by_kind())
    future = client().submit(_call_locked, label, fn, args, kwargs, resources={GPU_RESOURCE: 1, KIND_PREFIX + kind: 1},
                             key=f"{RUN_PREFIX}-call-{uuid.uuid4().hex}", pure=False)
    try:
        return future.result()
    finally:
        future.release()


def gpu_count() -> int:
    """How many GPUs of the kind this app runs on the pool had at the last look (1 before any look)."""
    if not _last_kinds:
        return 1
    return max(1, len(_last_kinds.get(choose_kind(_last_kinds), ())))


def run_named(label: str, target: str, payload: dict, progress: Progress = noop_progress,
              on_wait: Optional[Callable[[int], None]] = None) -> tuple:
    """Run Roofline's own function `target` ("labs.package.module:function") with `payload` on the least busy
    GPU of the pool (Dask's choice among the workers of the chosen kind), queued with the lab runs; returns
    (its value, where it ran: this_gpu() plus the workers that started it).

    Only plain data crosses: the payload goes as JSON text and the value comes back as JSON text, so what a
    learner wrote travels as strings, never as a pickled callable. `fn(payload, progress)` runs in the worker's
    thread and takes that worker's GPU lock itself where it needs it. While it waits, `on_wait` hears how many
    runs are ahead of it across the pool; a worker that dies under it is replaced once, as for a lab run.
    """
    module, _, name = target.partition(":")
    if not module.startswith("labs.") or not name.isidentifier():
        raise ParamError(f"{target!r} names no Roofline function (labs.module:function)")
    wire = json.dumps(payload)  # a TypeError here, in the app, for anything that is not plain data
    kind = choose_kind(workers_by_kind())
    future = client().submit(execute_named, target, wire, kind, uuid.uuid4().hex,
                             key=f"{RUN_PREFIX}-{label}-{uuid.uuid4().hex}", pure=False, fifo_timeout=0,
                             resources={GPU_RESOURCE: 1, KIND_PREFIX + kind: 1})
    try:
        data = json.loads(_await(future, progress, on_wait))
        starts = _attempts(future.key)
    finally:
        future.release()
    return data["value"], data["where"] | {"attempts": [s.get("worker_name", "?") for s in starts]}


# ---------------------------------------------------------------------------------------------
# The worker side: one process per GPU
# ---------------------------------------------------------------------------------------------
def execute(lab: Lab, params, kind: str, time_limit_s: float, token: str) -> dict:
    """One attempt of a run, on the worker's GPU under its lock; returns the Result as a dict."""
    from distributed import get_worker

    worker = get_worker()
    key = str(worker.get_current_task())
    where = this_gpu(worker, kind)
    worker.log_event(STARTED_TOPIC, {"key": key, "token": token, **where})
    info, target = worker_target(kind)
    result = local.run_on(lab, params, info, target, progress=_relay(worker, key, token), use_cache=False,
                           time_limit_s=time_limit_s, label=f"{lab.name}@{where['gpu_label']}")
    result.meta["pool"] = where
    return result.to_dict()


def execute_named(target: str, wire: str, kind: str, token: str) -> str:
    """One attempt of run_named's function on this worker (refused on a worker of another kind); JSON back."""
    from distributed import get_worker

    worker = get_worker()
    key = str(worker.get_current_task())
    where = this_gpu(worker, kind)
    worker.log_event(STARTED_TOPIC, {"key": key, "token": token, **where})
    worker_target(kind)
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    value = fn(json.loads(wire), _relay(worker, key, token))
    return json.dumps({"value": value, "where": where}, default=str)


def _call_locked(label: str, fn: Callable, args: tuple, kwargs: dict):
    from distributed import get_worker

    with local.gpu_session(f"{label}@{gpu_label(get_worker())}"):
        return fn(*args, **kwargs)


def gpu_label(worker) -> str:
    """'gpu1.hostname': which physical GPU this worker owns (the launcher sets ROOFLINE_GPU_INDEX);
    a worker started otherwise (a LocalCluster in the tests) is named by its worker name."""
    index = os.environ.get("ROOFLINE_GPU_INDEX")
    return f"gpu{index}.{socket.gethostname()}" if index else f"worker{worker.name}.{socket.gethostname()}"


def this_gpu(worker, kind: str) -> dict:
    return {"worker_name": str(worker.name), "worker": worker.address, "host": socket.gethostname(),
            "gpu_index": os.environ.get("ROOFLINE_GPU_INDEX", ""), "gpu_label": gpu_label(worker), "kind": kind,
            "scheduler": str(worker.scheduler.address), "pid": os.getpid()}


def worker_target(kind: str):
    """(GpuInfo or None, Target) of this worker; refuses a run whose kind is not this GPU's."""
    info = gpu_mod.detect()
    if info.available:
        if info.key != kind:
            raise ParamError(f"This worker's GPU is {info.key}, not {kind}: restart it with `python -m labs.engine.pool worker`.")
        return info, gpu_mod.live_target()
    if kind == CPU_KIND:  # a worker without a GPU: the model describes a datasheet GPU
        return None, gpu_mod.datasheet_target(gpu_mod.datasheet_by_name(os.environ.get("ROOFLINE_POOL_MODEL_GPU",
                                                                                       "H100 SXM")))
    raise ParamError(f"The pool's worker on {socket.gethostname()} has no GPU: {info.reason}")


def dask_setup(worker) -> None:
    """Run by `dask worker --preload labs.engine.pool` as the worker starts: torch and the GPU are looked at
    once here, so the first learner's run does not wait for them."""
    gpu_mod.detect()
    gpu_mod.software_versions()


def _relay(worker, key: str, token: str) -> Progress:
    """A progress callback that forwards at most one message per PROGRESS_EVERY_S to the app."""
    last = [0.0]

    def progress(fraction: float, message: str) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S or fraction >= 1:
            last[0] = now
            worker.log_event(PROGRESS_TOPIC, {"key": key, "token": token, "fraction": float(fraction),
                                              "message": str(message)})

    return progress


# ---------------------------------------------------------------------------------------------
# Starting a pool: `python -m labs.engine.pool scheduler` and `python -m labs.engine.pool worker ADDRESS`
# ---------------------------------------------------------------------------------------------
def _env(extra: dict) -> dict:
    """The environment of a scheduler or worker: Roofline importable, one retry of a run whose worker died."""
    root = str(gpu_mod.ROOT)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1", **extra}
    env.pop("ROOFLINE_CLUSTER", None)  # a worker runs labs on its own GPU, never sends them on
    return env


def list_gpus() -> list:
    """[(index, kind)] of this machine's GPUs, from nvidia-smi (no CUDA context is made here)."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30)
    gpus = []
    for line in out.stdout.strip().splitlines() if out.returncode == 0 else []:
        index, name = (part.strip() for part in line.split(",", 1))
        gpus.append((int(index), gpu_mod.slug(name)))
    return gpus


def _tls_flags() -> list:
    ca, cert, key = cert_files()
    return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]


def scheduler_command(port: int, host: str = DEFAULT_HOST, tls: Optional[bool] = None) -> list:
    """The scheduler's command line: TLS with the pool's certificates unless it listens on this machine only
    (tls=None decides by the host; tls=False beyond this machine is the caller's --insecure)."""
    tls = not is_local(host) if tls is None else tls
    command = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host, "--port", str(port),
               "--no-dashboard"]
    return command + (["--protocol", "tls", *_tls_flags()] if tls else ["--protocol", "tcp"])


def worker_command(address: str, name: str, kind: str) -> list:
    command = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1", "--nworkers", "1",
               "--name", name, "--memory-limit", "0", "--no-dashboard", "--preload", "labs.engine.pool",
               "--resources", f"{GPU_RESOURCE}=1 {KIND_PREFIX}{kind}=1"]
    return command + (_tls_flags() if security_for(address) is not None else [])


def start_workers(address: str, gpus: Optional[list] = None, cpu_workers: int = 0) -> list:
    """One worker process per GPU (CUDA_VISIBLE_DEVICES=i), or `cpu_workers` GPU-less ones; returns the Popens."""
    procs = []
    for index, kind in [g for g in list_gpus() if gpus is None or g[0] in gpus]:
        env = _env({"CUDA_VISIBLE_DEVICES": str(index), "ROOFLINE_GPU_INDEX": str(index)})
        procs.append(subprocess.Popen(worker_command(address, f"gpu{index}.{socket.gethostname()}", kind), env=env))
    for index in range(cpu_workers):
        env = _env({"CUDA_VISIBLE_DEVICES": "", "ROOFLINE_GPU_INDEX": str(index)})
        procs.append(subprocess.Popen(worker_command(address, f"cpu{index}.{socket.gethostname()}", CPU_KIND), env=env))
    return procs


def _wait_all(procs: list) -> int:
    try:
        return max((p.wait() for p in procs), default=0)
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        return 130


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labs.engine.pool", description="Start Roofline's GPU pool.")
    sub = parser.add_subparsers(dest="command", required=True)
    sched = sub.add_parser("scheduler", help="the pool's scheduler (one per class)")
    sched.add_argument("--port", type=int, default=DEFAULT_PORT)
    sched.add_argument("--host", default=DEFAULT_HOST,
                       help="interface to listen on (default: all, with TLS); 127.0.0.1: this machine only, plain tcp")
    sched.add_argument("--insecure", action="store_true",
                       help=f"plain tcp beyond this machine (a private network you trust; or {INSECURE_ENV}=1)")
    work = sub.add_parser("worker", help="one worker per GPU of this machine")
    work.add_argument("address", help="the scheduler, e.g. tls://10.0.0.5:8786 (tcp://127.0.0.1:8786 on one machine)")
    work.add_argument("--gpus", help="comma-separated GPU indices (default: every GPU)")
    work.add_argument("--cpu-workers", type=int, default=0, help="GPU-less workers (to try the pool without a GPU)")
    work.add_argument("--insecure", action="store_true", help="allow a plain tcp:// scheduler beyond this machine")
    args = parser.parse_args(argv)
    if args.insecure:
        os.environ[INSECURE_ENV] = "1"
    insecure = os.environ.get(INSECURE_ENV) == "1"
    try:
        if args.command == "scheduler":
            command = scheduler_command(args.port, args.host, tls=False if insecure else None)
            scheme = command[command.index("--protocol") + 1]
            print(f"GPU pool scheduler on {scheme}://{args.host}:{args.port}", file=sys.stderr)
            return _wait_all([subprocess.Popen(command, env=_env({}))])
        gpus = [int(i) for i in args.gpus.split(",")] if args.gpus else None
        procs = start_workers(args.address, gpus, args.cpu_workers)
    except ParamError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not procs:
        print("No GPU found (nvidia-smi lists none); use --cpu-workers N for GPU-less workers.", file=sys.stderr)
        return 2
    return _wait_all(procs)


if __name__ == "__main__":
    sys.exit(main())
