"""A real, scriptable OpenAI chat-completions server for tests (stdlib only).

It listens on 127.0.0.1 on an ephemeral port in a background thread and speaks enough of the
protocol for the openai client: `POST /v1/chat/completions` (non-streaming, `n` choices, `usage`,
`finish_reason` "stop" or "length") and `GET /v1/models`.

What it answers is scripted with `Reply` specs, taken first from a queue (`enqueue`), then from a
`responder(request_json) -> Reply | dict | str`, else a default reply. Every request is recorded.

    from chat_server import ChatServer, Reply

    with ChatServer(responder=lambda req: Reply(text="class ModelNew: ...")) as server:
        server.enqueue(Reply(status=429), Reply(delay_s=0.2, text="slow answer"))
        client = LLMClient(EndpointConfig(base_url=server.base_url, model="test-model"))
        ...
        assert len(server.requests) == 3
        assert server.requests[0].body["model"] == "test-model"

Token counts are `ceil(len(text) / 4)`: the prompt's is over all message contents, and a reply
longer than `max_tokens` tokens is cut to `4 * max_tokens` characters with finish_reason "length".
Other test files can use the `chat_server` fixture: `from chat_server import chat_server`.
"""

from __future__ import annotations

import collections
import json
import math
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

try:
    import pytest
except ImportError:  # usable outside pytest too (`python tests/chat_server.py`)
    pytest = None


@dataclass
class Reply:
    """How the server answers one request."""

    text: str = "ok"  # content of every choice (unless `texts` is given)
    texts: list[str] | None = None  # content per choice, cycled when n > len(texts)
    finish_reason: str | None = None  # force a finish_reason; default "stop", or "length" when cut
    status: int = 200  # HTTP status; anything but 200 sends an OpenAI-style error body
    error_message: str = "scripted error"  # message in the error body
    delay_s: float = 0.0  # sleep before answering (to provoke timeouts, overlap requests)
    drop: bool = False  # close the connection without any response
    model: str | None = None  # model name in the response; default: the one requested
    usage: bool = True  # include a `usage` object
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers (e.g. Retry-After)
    body: dict[str, Any] = field(default_factory=dict)  # fields set in the response body, as they are (malformed ones)
    choice: dict[str, Any] = field(default_factory=dict)  # fields set in every choice, as they are
    html: str | None = None  # answer 200 with this as a text/html page instead (a web server at the wrong URL)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it."""

    method: str  # "GET" or "POST"
    path: str  # e.g. "/v1/chat/completions"
    body: Any  # parsed JSON body (None for GET or unparsable bodies)
    authorization: str | None  # the Authorization header value, None when absent
    at: float  # time.monotonic() when it arrived

    @property
    def has_auth(self) -> bool:
        return self.authorization is not None


Responder = Callable[[dict], "Reply | dict | str"]


def count_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _as_reply(spec: Reply | dict | str) -> Reply:
    if isinstance(spec, Reply):
        return spec
    if isinstance(spec, str):
        return Reply(text=spec)
    known = {f.name for f in fields(Reply)}
    unknown = set(spec) - known
    if unknown:
        raise ValueError(f"unknown reply keys {sorted(unknown)}")
    return Reply(**spec)


class ChatServer:
    """Scriptable chat-completions server; a context manager that starts and stops it."""

    def __init__(self, responder: Responder | None = None, *, model: str = "test-model"):
        self.responder = responder
        self.model = model  # listed by GET /v1/models
        self._queue: collections.deque[Reply | dict | str] = collections.deque()
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._in_flight = 0
        self.max_in_flight = 0  # most chat requests handled at once since start
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "ChatServer":
        handler = type("Handler", (_Handler,), {"chat_server": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # don't wait for handlers sleeping on a scripted delay
        # A short poll interval keeps stop() (and so each test's teardown) fast.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), name="chat-server",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "ChatServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """What to pass as an endpoint's base_url."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting and inspection -----------------------------------------------------------
    def enqueue(self, *specs: Reply | dict | str) -> None:
        """Answer the next chat requests with these specs, in order, before using the responder."""
        with self._lock:
            self._queue.extend(specs)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _next_reply(self, body: dict) -> Reply:
        with self._lock:
            queued = self._queue.popleft() if self._queue else None
        if queued is not None:
            return _as_reply(queued)
        if self.responder is not None:
            return _as_reply(self.responder(body))
        return Reply()

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)


def chat_response(body: dict, reply: Reply) -> dict:
    """The chat.completion object answering `body` as scripted by `reply`."""
    n = int(body.get("n") or 1)
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    prompt_text = "".join(
        m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
        for m in body.get("messages", [])
    )
    choices, completion_tokens = [], 0
    for i in range(n):
        text = reply.texts[i % len(reply.texts)] if reply.texts else reply.text
        finish = "stop"
        if max_tokens is not None and count_tokens(text) > int(max_tokens):
            text, finish = text[: 4 * int(max_tokens)], "length"
        completion_tokens += count_tokens(text)
        choices.append({
            "index": i,
            "message": {"role": "assistant", "content": text},
            "finish_reason": reply.finish_reason or finish,
            "logprobs": None,
            **reply.choice,
        })
    out: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.model or body.get("model", "test-model"),
        "choices": choices,
    }
    if reply.usage:
        prompt_tokens = count_tokens(prompt_text)
        out["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens}
    return {**out, **reply.body}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    chat_server: ChatServer  # set on the per-server subclass

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: Any) -> None:
        self.chat_server._record(RecordedRequest(
            method=self.command, path=self.path.split("?")[0], body=body,
            authorization=self.headers.get("Authorization"), at=time.monotonic(),
        ))

    def do_GET(self) -> None:
        self._record(None)
        if self.path.split("?")[0].rstrip("/") == "/v1/models":
            model = {"id": self.chat_server.model, "object": "model", "created": 0, "owned_by": "tests"}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except json.JSONDecodeError:
            body = None
        self._record(body)
        if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            error = {"message": "body must be JSON with `messages`", "type": "invalid_request_error"}
            self._send_json(400, {"error": error})
            return
        server = self.chat_server
        server._enter()
        try:
            reply = server._next_reply(body)
            if reply.delay_s:
                server._sleep(reply.delay_s)
            if reply.drop:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if reply.status != 200:
                error = {"message": reply.error_message, "type": "scripted", "code": reply.status}
                self._send_json(reply.status, {"error": error}, reply.headers)
                return
            if reply.html is not None:
                page = reply.html.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            self._send_json(200, chat_response(body, reply), reply.headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (e.g. its timeout fired); nothing to answer
        finally:
            server._leave()


if pytest is not None:

    @pytest.fixture
    def chat_server():
        """A started ChatServer, stopped after the test."""
        with ChatServer() as server:
            yield server


if __name__ == "__main__":  # a manual endpoint: python tests/chat_server.py
    with ChatServer() as srv:
        print(f"serving on {srv.base_url} (Ctrl-C to stop)")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
