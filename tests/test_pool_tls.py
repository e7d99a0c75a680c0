"""The GPU pool's scheduler beyond localhost speaks TLS with the pool's own certificates (issue 32).

A real scheduler started the way the README starts it (`python -m labs.engine.pool scheduler`, every interface)
with certificates made by scripts/pool_certs.sh (openssl), a real GPU-less worker: a client with the pool's
certificate submits and gets its answer; a client without it (no TLS, TLS without a certificate, a certificate
of another CA) cannot connect, so it cannot submit anything.
"""

import operator
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labs.engine import pool
from labs.engine.params import ParamError

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl to make the certificates")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certs(folder: Path) -> Path:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "pool_certs.sh"), str(folder)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return folder


def wait_for_port(port: int, proc, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        assert proc.poll() is None, "the scheduler exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail("the scheduler did not listen")


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tls_pool(tmp_path_factory):
    """A scheduler on every interface (so: TLS) and one GPU-less worker, both with the pool's certificates."""
    ours = make_certs(tmp_path_factory.mktemp("ours"))
    port = free_port()
    env = {**os.environ, pool.CERTS_ENV: str(ours), "PYTHONPATH": str(ROOT)}
    env.pop(pool.INSECURE_ENV, None)
    env.pop("ROOFLINE_CLUSTER", None)
    log = tmp_path_factory.mktemp("logs")
    scheduler = subprocess.Popen([sys.executable, "-m", "labs.engine.pool", "scheduler", "--port", str(port)], env=env,
                                 cwd=ROOT, stdout=open(log / "scheduler.log", "w"), stderr=subprocess.STDOUT)
    worker = None
    try:
        wait_for_port(port, scheduler)
        address = f"tls://127.0.0.1:{port}"
        worker = subprocess.Popen([sys.executable, "-m", "labs.engine.pool", "worker", address, "--cpu-workers", "1"],
                                  env=env, cwd=ROOT, stdout=open(log / "worker.log", "w"), stderr=subprocess.STDOUT)
        yield address, ours, port, log
    finally:
        for proc in (worker, scheduler):
            if proc is not None:
                stop(proc)


def test_a_client_with_the_pools_certificate_submits(tls_pool, monkeypatch):
    address, ours, _port, log = tls_pool
    monkeypatch.setenv(pool.CERTS_ENV, str(ours))
    from distributed import Client

    with Client(address, security=pool.security(), timeout=30, set_as_default=False) as client:
        client.wait_for_workers(1, timeout=120)
        assert client.submit(operator.add, 1, 2, pure=False).result(timeout=60) == 3
    assert "tls://" in (log / "scheduler.log").read_text()


def test_a_client_without_the_certificate_cannot_connect_or_submit(tls_pool, tmp_path):
    address, ours, port, _log = tls_pool
    from distributed import Client
    from distributed.security import Security

    # 1. no TLS at all
    with pytest.raises((OSError, TimeoutError)):
        Client(f"tcp://127.0.0.1:{port}", timeout=5, set_as_default=False)
    # 2. a certificate of its own CA, trusting ours: the scheduler refuses it
    theirs = make_certs(tmp_path / "theirs")
    other = Security(tls_ca_file=str(ours / "ca.pem"), tls_client_cert=str(theirs / "pool.pem"),
                     tls_client_key=str(theirs / "pool-key.pem"), require_encryption=True)
    with pytest.raises((OSError, TimeoutError)):
        Client(address, security=other, timeout=5, set_as_default=False)
    # 3. TLS that trusts our CA but shows no certificate: the handshake fails before Dask reads a byte
    ctx = ssl.create_default_context(cafile=str(ours / "ca.pem"))
    ctx.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(b"\x00" * 64)
                assert tls.recv(1), "the scheduler closed the connection"  # TLS 1.3: the alert arrives on read


def test_the_scheduler_beyond_localhost_refuses_to_start_without_certificates(tmp_path):
    env = {**os.environ, pool.CERTS_ENV: str(tmp_path / "none"), "PYTHONPATH": str(ROOT)}
    env.pop(pool.INSECURE_ENV, None)
    out = subprocess.run([sys.executable, "-m", "labs.engine.pool", "scheduler", "--port", str(free_port())], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "scripts/pool_certs.sh" in out.stderr


def test_plain_tcp_beyond_this_machine_is_refused_before_connecting(monkeypatch):
    monkeypatch.delenv(pool.INSECURE_ENV, raising=False)
    with pytest.raises(ParamError, match="without TLS"):
        pool.security_for("tcp://10.11.12.13:8786")
    assert pool.security_for("tcp://127.0.0.1:8786") is None  # one machine: the tests' and pool_load.py's pools
    monkeypatch.setenv(pool.INSECURE_ENV, "1")
    assert pool.security_for("tcp://10.11.12.13:8786") is None  # asked for explicitly
    cmd = pool.scheduler_command(8786, "127.0.0.1")
    assert cmd[cmd.index("--protocol") + 1] == "tcp"


def test_the_dockerfile_does_not_expose_the_scheduler():
    exposed = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.strip().startswith("EXPOSE")]
    assert exposed and all("8786" not in line for line in exposed)
