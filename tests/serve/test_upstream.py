"""The gateway's client for its backends (:class:`UpstreamPool`): keep-alive reuse, a stale kept-alive
connection retried on a fresh one, an unfinished response closing its connection, and the errors the
exchange tells apart (refused, lost, stalled, broken)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from headway.serve._upstream import (
    UpstreamConnectError,
    UpstreamConnectionLost,
    UpstreamError,
    UpstreamPool,
    UpstreamTimeout,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)


class _Backend:
    """A raw HTTP/1.1 server on a free port: ``serve(reader, writer, n)`` handles the n-th connection."""

    def __init__(self, serve: Handler) -> None:
        self._serve = serve
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()

    async def __aenter__(self) -> _Backend:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self._serve(reader, writer, self.connections)
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        raw = await _read_request(reader)
        self.requests.append(raw)
        return raw


def test_a_finished_response_leaves_its_connection_for_the_next_request() -> None:
    async def main() -> tuple[list[tuple[int, bytes]], int]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            while True:
                await backend.request(reader)
                writer.write(OK)
                await writer.drain()

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url, api_key="sk-up")
            out = []
            for _ in range(3):
                resp = await pool.post("/v1/completions", b"{}")
                out.append((resp.status_code, await resp.read()))
                resp.close()
            pool.close()
            return out, backend.connections

    answers, connections = asyncio.run(main())
    assert answers == [(200, b"ok")] * 3
    assert connections == 1


def test_a_kept_alive_connection_the_backend_closed_is_retried_on_a_fresh_one() -> None:
    """The backend answers one request per connection and closes the connection when the next
    request arrives on it (a keep-alive timeout racing the request): the request goes again on a
    new connection instead of failing as lost."""

    async def main() -> tuple[int, bytes, int, int]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await backend.request(reader)
            writer.write(OK)
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # the next request on this connection: closed unanswered

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url)
            first = await pool.post("/v1/completions", b"{}")
            await first.read()
            first.close()
            resp = await pool.post("/v1/completions", b'{"n":2}')
            body = await resp.read()
            resp.close()
            pool.close()
            return resp.status_code, body, backend.connections, len(backend.requests)

    status, body, connections, served = asyncio.run(main())
    assert (status, body) == (200, b"ok")
    assert connections == 2
    assert served == 2


def test_a_fresh_connection_closed_before_any_answer_is_lost_not_retried() -> None:
    async def main() -> tuple[str, int]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await backend.request(reader)  # then closed unanswered: the backend took it and went away

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url)
            with pytest.raises(UpstreamConnectionLost) as err:
                await pool.post("/v1/completions", b"{}")
            pool.close()
            return str(err.value), backend.connections

    message, connections = asyncio.run(main())
    assert connections == 1
    assert "before a response" in message


def test_closing_an_unfinished_stream_closes_its_connection() -> None:
    """The backend sees the client go away (vLLM aborts the request), and the connection is not
    used again."""

    async def main() -> tuple[bytes, bool, int]:
        gone = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await backend.request(reader)
            if n == 1:
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n")
                await writer.drain()
                if not await reader.read(1):  # EOF: the client closed the connection
                    gone.set()
                return
            writer.write(OK)
            await writer.drain()

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url)
            resp = await pool.post("/v1/completions", b"{}")
            chunks = resp.iter_chunks()
            first = await anext(chunks)
            resp.close()
            await asyncio.wait_for(gone.wait(), 5)
            again = await pool.post("/v1/completions", b"{}")
            await again.read()
            again.close()
            pool.close()
            return first, gone.is_set(), backend.connections

    first, gone, connections = asyncio.run(main())
    assert first == b"data: "
    assert gone
    assert connections == 2


def test_close_wakes_a_reader_waiting_for_the_next_event() -> None:
    """A drain or a cancel closes the response while the relay waits for the backend's next event:
    the wait ends at once."""

    async def main() -> tuple[type[BaseException] | None, float]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await backend.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n")
            await writer.drain()
            await reader.read(1)

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url)
            resp = await pool.post("/v1/completions", b"{}")
            chunks = resp.iter_chunks()
            await anext(chunks)
            waiting = asyncio.ensure_future(anext(chunks))
            await asyncio.sleep(0.05)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            resp.close()
            done, _ = await asyncio.wait({waiting}, timeout=5)
            took = loop.time() - t0
            pool.close()
            exc = waiting.exception() if done else None
            return (type(exc) if exc is not None else None), took

    exc, took = asyncio.run(main())
    assert took < 1.0
    assert exc is not None and issubclass(exc, UpstreamError | StopAsyncIteration)


def test_no_answer_within_the_headers_timeout_is_a_timeout() -> None:
    async def main() -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await backend.request(reader)
            await asyncio.sleep(10)

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url)
            with pytest.raises(UpstreamTimeout) as err:
                await pool.post("/v1/completions", b"{}", headers_timeout=0.2)
            pool.close()
            return str(err.value)

    assert asyncio.run(main()) == "no response within 0.2 s"


def test_a_body_silent_past_the_read_timeout_is_a_timeout() -> None:
    async def main() -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await backend.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()
            await asyncio.sleep(10)

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url, read_timeout=0.2)
            resp = await pool.post("/v1/completions", b"{}")
            with pytest.raises(UpstreamTimeout) as err:
                await resp.read()
            pool.close()
            return str(err.value)

    assert asyncio.run(main()) == "no data from the backend for 0.2 s"


def test_a_body_cut_short_is_an_upstream_error() -> None:
    async def main() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await backend.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url)
            resp = await pool.post("/v1/completions", b"{}")
            with pytest.raises(UpstreamError) as err:
                await resp.read()
            assert not isinstance(err.value, UpstreamTimeout)
            pool.close()

    asyncio.run(main())


def test_a_closed_port_is_a_connect_error() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> str:
        pool = UpstreamPool(f"http://127.0.0.1:{port}")
        with pytest.raises(UpstreamConnectError) as err:
            await pool.post("/v1/completions", b"{}")
        pool.close()
        return str(err.value)

    assert asyncio.run(main()).startswith(f"cannot connect to 127.0.0.1:{port}")


def test_extra_headers_and_the_key_go_out_with_the_body() -> None:
    async def main() -> bytes:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            await backend.request(reader)
            writer.write(OK)
            await writer.drain()

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url + "/prefix/", api_key="sk-up")
            resp = await pool.post("/v1/completions", b'{"a":1}', headers=b"X-Tenant: t1\r\n")
            await resp.read()
            resp.close()
            pool.close()
            return backend.requests[0]

    raw = asyncio.run(main())
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
    ("answer", "body"),
    [
        # trailer fields after the last chunk (RFC 9112 7.1.2): read to their end, so the next
        # answer on the connection starts where it should
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n", b"ok"),
        # interim answers (100 Continue, 103 Early Hints) come before the final one
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK, b"ok"),
        # a 204 has no body, whatever its headers say
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
    ids=["trailers", "interim", "no-content"],
)
def test_answers_read_to_their_end_keep_the_connection_usable(answer: bytes, body: bytes) -> None:
    async def main() -> tuple[list[tuple[int, bytes]], int]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
            while True:
                await backend.request(reader)
                writer.write(answer)
                await writer.drain()

        async with _Backend(serve) as backend:
            pool = UpstreamPool(backend.url, read_timeout=2.0)
            out = []
            for _ in range(2):
                resp = await pool.post("/v1/completions", b"{}", headers_timeout=2.0)
                out.append((resp.status_code, await resp.read()))
                resp.close()
            pool.close()
            return out, backend.connections

    answers, connections = asyncio.run(main())
    status = 204 if body == b"" else 200
    assert answers == [(status, body)] * 2
    assert connections == 1
