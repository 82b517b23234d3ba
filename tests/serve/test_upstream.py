"""The gateway's client for its backends (:class:`UpstreamPool`): keep-alive reuse, a stale kept-alive
connection retried on a fresh one, an unfinished response closing its connection, answers read to their
end (trailers, interim answers, no body), and the errors the exchange tells apart (refused, lost,
stalled, broken)."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import pytest

from headway.serve._upstream import (
    UpstreamConnectError,
    UpstreamConnectionLost,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
)

T = TypeVar("T")
Reader: TypeAlias = asyncio.StreamReader
Writer: TypeAlias = asyncio.StreamWriter
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n"  # and one chunk


class _Backend:
    """A raw HTTP/1.1 server on a free port: ``serve(backend, reader, writer, n)`` handles the n-th
    connection; :meth:`request` reads one request and keeps it in :attr:`requests`."""

    def __init__(self, serve: Callable[[_Backend, Reader, Writer, int], Awaitable[None]]) -> None:
        self._serve = serve
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> _Backend:
        async def handle(reader: Reader, writer: Writer) -> None:
            self.connections += 1
            try:
                await self._serve(self, reader, writer, self.connections)
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def request(self, reader: Reader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        raw = head + await reader.readexactly(length)
        self.requests.append(raw)
        return raw

    async def answer(self, writer: Writer, raw: bytes) -> None:
        writer.write(raw)
        await writer.drain()


def _run(
    serve: Callable[[_Backend, Reader, Writer, int], Awaitable[None]],
    client: Callable[[UpstreamPool, _Backend], Awaitable[T]],
    url_suffix: str = "",
    **pool: Any,
) -> tuple[T, _Backend]:
    """``client(pool, backend)`` against a backend that serves its connections with ``serve``."""

    async def main() -> tuple[T, _Backend]:
        async with _Backend(serve) as backend:
            p = UpstreamPool(backend.url + url_suffix, **pool)
            try:
                return await client(p, backend), backend
            finally:
                await p.aclose()

    return asyncio.run(main())


async def _whole(resp: UpstreamResponse) -> tuple[int, bytes]:
    try:
        return resp.status_code, await resp.read()
    finally:
        resp.close()


async def _answer_each(answer: bytes, backend: _Backend, reader: Reader, writer: Writer, n: int) -> None:
    while True:
        await backend.request(reader)
        await backend.answer(writer, answer)


async def _answer_once(answer: bytes, backend: _Backend, reader: Reader, writer: Writer) -> None:
    await backend.request(reader)
    await backend.answer(writer, answer)


def test_a_finished_response_leaves_its_connection_for_the_next_request() -> None:
    async def client(pool: UpstreamPool, backend: _Backend) -> list[tuple[int, bytes]]:
        return [await _whole(await pool.post("/v1/completions", b"{}")) for _ in range(3)]

    answers, backend = _run(lambda *a: _answer_each(OK, *a), client)
    assert answers == [(200, b"ok")] * 3
    assert backend.connections == 1


def test_a_kept_alive_connection_the_backend_closed_is_retried_on_a_fresh_one() -> None:
    """The backend answers one request per connection and closes the connection when the next
    request arrives on it (a keep-alive timeout racing the request): the request goes again on a
    new connection instead of failing as lost."""

    async def serve(backend: _Backend, reader: Reader, writer: Writer, n: int) -> None:
        await backend.request(reader)
        await backend.answer(writer, OK)
        await reader.readuntil(b"\r\n\r\n")  # the next request on this connection: closed unanswered

    async def client(pool: UpstreamPool, backend: _Backend) -> tuple[int, bytes]:
        await _whole(await pool.post("/v1/completions", b"{}"))
        return await _whole(await pool.post("/v1/completions", b'{"n":2}'))

    answer, backend = _run(serve, client)
    assert answer == (200, b"ok")
    assert backend.connections == 2
    assert len(backend.requests) == 2


def test_a_fresh_connection_closed_before_any_answer_is_lost_not_retried() -> None:
    async def serve(backend: _Backend, reader: Reader, writer: Writer, n: int) -> None:
        await backend.request(reader)  # then closed unanswered: the backend took it and went away

    async def client(pool: UpstreamPool, backend: _Backend) -> str:
        with pytest.raises(UpstreamConnectionLost) as err:
            await pool.post("/v1/completions", b"{}")
        return str(err.value)

    message, backend = _run(serve, client)
    assert backend.connections == 1
    assert "before a response" in message


def test_a_connection_closed_before_the_body_went_out_is_lost() -> None:
    """The connection closes after the request's headers were buffered and before its body is
    written (as when a backend killed as it accepted resets it; here the client's side aborts it):
    aiohttp reports ``ClientOSError`` without an errno, caused by its "Cannot write to closing
    transport". The request never reached the backend: lost (the exchange waits for the backend),
    not a failure that ends the request at once."""

    async def serve(backend: _Backend, reader: Reader, writer: Writer, n: int) -> None:
        await backend.request(reader)
        await backend.answer(writer, OK)

    async def client(pool: UpstreamPool, backend: _Backend) -> str:
        session = pool._open()
        connect = session.connector.connect

        async def connect_then_close(*args: Any, **kwargs: Any) -> Any:
            conn = await connect(*args, **kwargs)
            # aiohttp writes the body in a task, which Python 3.12+ starts eagerly in the call that
            # buffers the headers: there the connection is closed as it is handed over, before
            # that call; on 3.11 the task runs later, after a callback queued now
            if sys.version_info >= (3, 12):
                conn.transport.abort()
            else:
                asyncio.get_running_loop().call_soon(conn.transport.abort)
            return conn

        session.connector.connect = connect_then_close  # type: ignore[method-assign]
        with pytest.raises(UpstreamConnectionLost) as err:
            await pool.post("/v1/completions", b"{}")
        return str(err.value)

    message, backend = _run(serve, client)
    assert message == "connection closed before a response"
    assert backend.connections == 1 and backend.requests == []


def test_closing_an_unfinished_stream_closes_its_connection() -> None:
    """The backend sees the client go away (vLLM aborts the request), and the connection is not
    used again."""
    gone: list[bool] = []

    async def serve(backend: _Backend, reader: Reader, writer: Writer, n: int) -> None:
        await backend.request(reader)
        if n > 1:
            await backend.answer(writer, OK)
            return
        await backend.answer(writer, STREAM_HEAD)
        gone.append(not await reader.read(1))  # EOF: the client closed the connection

    async def client(pool: UpstreamPool, backend: _Backend) -> bytes:
        resp = await pool.post("/v1/completions", b"{}")
        first = await anext(resp.iter_chunks())
        resp.close()
        async with asyncio.timeout(5):
            while not gone:
                await asyncio.sleep(0.01)
        await _whole(await pool.post("/v1/completions", b"{}"))
        return first

    first, backend = _run(serve, client)
    assert first == b"data: "
    assert gone == [True]
    assert backend.connections == 2


def test_close_wakes_a_reader_waiting_for_the_next_event() -> None:
    """A drain or a cancel closes the response while the relay waits for the backend's next event:
    the wait ends at once."""

    async def serve(backend: _Backend, reader: Reader, writer: Writer, n: int) -> None:
        await backend.request(reader)
        await backend.answer(writer, STREAM_HEAD)
        await reader.read(1)

    async def client(pool: UpstreamPool, backend: _Backend) -> tuple[BaseException | None, float]:
        resp = await pool.post("/v1/completions", b"{}")
        chunks = resp.iter_chunks()
        await anext(chunks)
        waiting = asyncio.ensure_future(anext(chunks))
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        resp.close()
        done, _ = await asyncio.wait({waiting}, timeout=5)
        waiting.cancel()
        return (waiting.exception() if done else None), loop.time() - t0

    (exc, took), _ = _run(serve, client)
    assert took < 1.0
    assert isinstance(exc, UpstreamError | StopAsyncIteration)


async def _stall_after(answer: bytes, backend: _Backend, reader: Reader, writer: Writer, n: int) -> None:
    await backend.request(reader)
    await backend.answer(writer, answer)
    await asyncio.sleep(10)


def test_no_answer_within_the_headers_timeout_is_a_timeout() -> None:
    async def client(pool: UpstreamPool, backend: _Backend) -> str:
        with pytest.raises(UpstreamTimeout) as err:
            await pool.post("/v1/completions", b"{}", headers_timeout=0.2)
        return str(err.value)

    message, _ = _run(lambda *a: _stall_after(b"", *a), client)
    assert message == "no response within 0.2 s"


@pytest.mark.parametrize("stall", [True, False], ids=["silent", "cut-short"])
def test_a_body_that_stops_early_is_an_upstream_error(stall: bool) -> None:
    """Silent past the read timeout: a timeout; the connection closed: a broken exchange."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"

    async def serve(backend: _Backend, reader: Reader, writer: Writer, n: int) -> None:
        await (_stall_after(head, backend, reader, writer, n) if stall else _answer_once(head, backend, reader, writer))

    async def client(pool: UpstreamPool, backend: _Backend) -> UpstreamError:
        resp = await pool.post("/v1/completions", b"{}")
        with pytest.raises(UpstreamError) as err:
            await resp.read()
        return err.value

    exc, _ = _run(serve, client, read_timeout=0.2)
    assert isinstance(exc, UpstreamTimeout) == stall
    assert str(exc) == (
        "no data from the backend for 0.2 s" if stall else "connection closed before the end of the body"
    )


def test_a_closed_port_is_a_connect_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> str:
        pool = UpstreamPool(f"http://127.0.0.1:{port}")
        with pytest.raises(UpstreamConnectError) as err:
            await pool.post("/v1/completions", b"{}")
        await pool.aclose()
        return str(err.value)

    assert asyncio.run(main()) == "cannot connect (ClientConnectorError)"  # (no address: a client may read it)


def test_extra_headers_and_the_key_go_out_with_the_body() -> None:
    async def client(pool: UpstreamPool, backend: _Backend) -> bytes:
        await _whole(await pool.post("/v1/completions", b'{"a":1}', headers={"X-Tenant": "t1"}))
        return backend.requests[0]

    raw, _ = _run(lambda b, r, w, n: _answer_once(OK, b, r, w), client, "/prefix/", api_key="sk-up")
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /prefix/v1/completions HTTP/1.1"
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    assert fields[b"authorization"] == b"Bearer sk-up"
    assert fields[b"x-tenant"] == b"t1"
    assert fields[b"content-type"] == b"application/json"
    assert body == b'{"a":1}'


def test_only_http_and_https_backends() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        UpstreamPool("ftp://x")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # trailer fields after the last chunk (RFC 9112 7.1.2): read to their end, so the next
        # answer on the connection starts where it should
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n",
            (200, b"ok"),
        ),
        # interim answers (100 Continue, 103 Early Hints) come before the final one
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK, (200, b"ok")),
        # a 204 has no body, whatever its headers say
        (b"HTTP/1.1 204 No Content\r\n\r\n", (204, b"")),
    ],
    ids=["trailers", "interim", "no-content"],
)
def test_answers_read_to_their_end_keep_the_connection_usable(answer: bytes, expected: tuple[int, bytes]) -> None:
    async def client(pool: UpstreamPool, backend: _Backend) -> list[tuple[int, bytes]]:
        return [await _whole(await pool.post("/v1/completions", b"{}", headers_timeout=2.0)) for _ in range(2)]

    answers, backend = _run(lambda *a: _answer_each(answer, *a), client, read_timeout=2.0)
    assert answers == [expected] * 2
    assert backend.connections == 1
