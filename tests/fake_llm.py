"""A tiny OpenAI-compatible chat server on 127.0.0.1 for tests that talk real HTTP.

No LLM service is reachable from the test machines, so the live fixer is tested by
letting litellm (and the ``openai`` client under it) talk to this server. A test scripts
what the next requests get (an answer, an HTTP error, a delay, a broken body) and
afterwards reads the request bodies it received, so it can assert on the prompts, and
their headers, looked up case-insensitively (HTTP header names have no case; clients
differ in the spelling they send).

Use the ``fake_llm`` fixture (``tests/conftest.py``), or :class:`FakeLLM` as a context
manager. The module holds no assertions (PYTEST_DONT_REWRITE).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.fixers.base import Attempt, ProposalRequest
from pytest_kernelfix.locate.context import BugContext, SourceFile

#: Sent with every error so the ``openai`` client retries after 10 ms, not 0.5-8 s.
FAST_RETRY = {"retry-after-ms": "10"}


@dataclass(frozen=True)
class Reply:
    """A chat completion whose message content is ``content`` (``None``: no content)."""

    content: str | None
    prompt_tokens: int = 120
    completion_tokens: int = 30
    model: str = ""  # echo the requested model when empty
    finish_reason: str = "stop"


@dataclass(frozen=True)
class Status:
    """An HTTP error status with an OpenAI-style error body."""

    code: int
    message: str = "scripted failure"
    headers: Mapping[str, str] = field(default_factory=lambda: dict(FAST_RETRY))


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` (long enough for a client timeout), then do ``then``."""

    seconds: float
    then: Action = Reply("late answer")


@dataclass(frozen=True)
class Raw:
    """A 200 response with this exact body (for malformed JSON)."""

    body: str
    content_type: str = "application/json"


@dataclass(frozen=True)
class Hangup:
    """Drop the connection unanswered and stop listening: the server is gone, as when a
    model server crashes mid-session (later connections are refused)."""


Action = Reply | Status | Delay | Raw | Hangup


def answer(content: str, **usage: Any) -> Reply:
    return Reply(content, **usage)


def empty() -> Reply:
    return Reply("")


def huge(size: int = 1_200_000) -> Reply:
    return Reply("x" * size)


def malformed() -> Raw:
    return Raw('{"id": "chatcmpl-broken", "choices": [')


class FakeLLM:
    """The server: ``url`` to point clients at, ``script`` to queue actions."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[Message] = []  # case-insensitive: headers[0]["authorization"]
        self.paths: list[str] = []
        self._actions: deque[Action] = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._closed = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def script(self, *actions: Action) -> None:
        """Queue what the next requests get, one action per request, in order."""
        with self._lock:
            self._actions.extend(actions)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._actions)

    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next(self, path: str, headers: Message, body: dict[str, Any]) -> Action:
        with self._lock:
            self.paths.append(path)
            self.headers.append(headers)
            self.requests.append(body)
            if self._actions:
                return self._actions.popleft()
        return Status(500, "fake_llm: no scripted action left")


def _handler_for(fake: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def do_POST(self) -> None:
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = {"unparsed": raw.decode("utf-8", "replace")}
            action = fake._next(self.path, self.headers, body)
            with contextlib.suppress(OSError):  # the client gave up (timeout) and left
                self._act(action, body)

        def _act(self, action: Action, body: dict[str, Any]) -> None:
            while isinstance(action, Delay):
                if fake._closing.wait(action.seconds):
                    return
                action = action.then
            if isinstance(action, Hangup):
                self.close_connection = True
                threading.Thread(target=fake.close, daemon=True).start()
                fake._closing.wait(5)  # listening stops before the client tries again
                return
            if isinstance(action, Status):
                error = {"message": action.message, "type": "fake_error", "code": action.code}
                self._send(action.code, {"error": error}, action.headers)
            elif isinstance(action, Raw):
                self._send_bytes(200, action.body.encode(), action.content_type, {})
            else:
                self._send(200, _completion(action, str(body.get("model", ""))))

        def _send(
            self, code: int, payload: object, headers: Mapping[str, str] | None = None
        ) -> None:
            data = json.dumps(payload).encode()
            self._send_bytes(code, data, "application/json", headers or {})

        def _send_bytes(
            self, code: int, data: bytes, content_type: str, headers: Mapping[str, str]
        ) -> None:
            self.send_response(code)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _completion(reply: Reply, requested_model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-fake-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.model or requested_model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# --- a realistic request to send ------------------------------------------------------

GELU_SOURCE = '''\
"""GELU with the tanh approximation."""

import torch
import triton
import triton.language as tl


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    y = 0.5 * x * (1.0 + tl.tanh(u))
    tl.store(out_ptr + offsets, y, mask=mask)


def gelu(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n_elements = out.numel()
    gelu_kernel[(triton.cdiv(n_elements, 1024),)](x, out, n_elements, BLOCK_SIZE=1024)
    return out
'''

GELU_TEST = '''\
import pytest
import torch
from kernels.gelu import gelu


@pytest.mark.kernel
def test_gelu():
    x = torch.randn(1000)
    torch.testing.assert_close(gelu(x), torch.nn.functional.gelu(x, approximate="tanh"))
'''

GELU_ANSWER = json.dumps(
    {
        "analysis": "Triton 3.x has no tl.tanh.",
        "modifications": [
            {
                "file": "kernels/gelu.py",
                "old_string": "    y = 0.5 * x * (1.0 + tl.tanh(u))",
                "new_string": "    y = 0.5 * x * (1.0 + (2 * tl.sigmoid(2 * u) - 1))",
                "reason": "tanh(u) = 2 * sigmoid(2u) - 1",
                "replace_all": False,
                "anchor": "",
            }
        ],
        "summary": "Compute tanh with tl.sigmoid.",
    }
)


def sample_request(
    round: int = 1, group_id: str = "gelu_kernel-ab12cd", **changes: Any
) -> ProposalRequest:
    """A :class:`ProposalRequest` for the gelu bug above, as the healing loop builds it."""
    message = "module 'triton.language' has no attribute 'tanh'"
    kernel = SourceFile("kernels/gelu.py", GELU_SOURCE)
    context = BugContext(
        group_id=group_id,
        nodeids=("tests/test_gelu.py::test_gelu",),
        error=ErrorInfo("AttributeError", message,
                        (Frame("/proj/kernels/gelu.py", 15, "gelu_kernel",
                               "y = 0.5 * x * (1.0 + tl.tanh(u))"),)),
        error_log="Test: tests/test_gelu.py::test_gelu\n"
        f"Error: AttributeError: {message}\n\nE   InterpreterError: AttributeError(...)",
        editable=(kernel,),
        tests=(SourceFile("tests/test_gelu.py", GELU_TEST),),
        kernel_lines=("kernels/gelu.py:15 in gelu_kernel: y = 0.5 * x * (1.0 + tl.tanh(u))",),
        device="interpret",
        checks=("rerun tests/test_gelu.py::test_gelu on the Triton interpreter",
                "compile the kernel for cuda:90 (no GPU needed)"),
    )
    request = ProposalRequest(context=context, round=round, files=(kernel,))
    if round > 1:
        request = replace(
            request,
            feedback="tests/test_gelu.py::test_gelu still fails: NameError: name 'u2' is "
            "not defined",
            cumulative_diff="--- a/kernels/gelu.py\n+++ b/kernels/gelu.py\n@@ -1 +1 @@\n-a\n+b\n",
            history=(Attempt(1, "edit applied; the test failed with NameError"),),
        )
    return replace(request, **changes) if changes else request
