"""The OpenAI-compatible backend against a real HTTP server on loopback: request shape, retry on 429/5xx with
backoff, the response cache (counted requests), the client-side rate limit and clear errors for bad answers."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dice_pipeline.synthesis.openai_compatible import (
    EndpointError,
    MalformedResponseError,
    OpenAICompatibleConfig,
    OpenAICompatibleGenerator,
    RateLimiter,
)

TASK = "import torch\nclass Model(torch.nn.Module):\n    pass\n"
ANSWER = "Here it is:\n```python\nclass ModelNew:\n    pass\n```\n"


class FakeEndpoint:
    """A chat-completions server whose next answers are scripted: ("ok",), ("status", code), ("raw", bytes)."""

    def __init__(self):
        self.script: list[tuple] = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append({"path": self.path, **body})
                endpoint.headers.append(dict(self.headers))
                action = endpoint.script.pop(0) if endpoint.script else ("ok",)
                if action[0] == "status":
                    self.send_response(action[1])
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(b'{"error": "busy"}')
                    return
                if action[0] == "raw":
                    payload = action[1]
                else:
                    payload = json.dumps({
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": ANSWER + f"seed={body['seed']}"}}],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 7},
                    }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    with FakeEndpoint() as server:
        yield server


def make_generator(endpoint, tmp_path=None, sleeps=None, **overrides):
    settings = {"base_url": endpoint.base_url, "model": "tiny-coder", "api_key": "sk-test", "requests_per_minute": 0,
                "backoff_initial_s": 0.01, "timeout_s": 5, "cache_dir": str(tmp_path / "cache") if tmp_path else ""}
    config = OpenAICompatibleConfig(**{**settings, **overrides})
    sleep = (lambda s: sleeps.append(s)) if sleeps is not None else (lambda s: None)
    return OpenAICompatibleGenerator(config, sleep=sleep)


def test_generates_candidates_with_prompt_code_and_per_sample_seeds(endpoint):
    generator = make_generator(endpoint, max_concurrency=1)
    candidates = generator.generate(TASK, 3, seed=10)
    assert [c.seed for c in candidates] == [10, 11, 12]
    assert [r["seed"] for r in endpoint.requests] == [10, 11, 12]
    request = endpoint.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["model"] == "tiny-coder"
    assert request["messages"][-1]["role"] == "user" and TASK in request["messages"][-1]["content"]
    assert endpoint.headers[0]["Authorization"] == "Bearer sk-test"
    c = candidates[0]
    assert c.code == "class ModelNew:\n    pass\n"
    assert c.backend == "openai_compatible" and c.model == "tiny-coder" and c.finish_reason == "stop"
    assert c.usage == {"prompt_tokens": 11, "completion_tokens": 7} and not c.cached
    assert c.prompt_messages == request["messages"]


def test_retries_429_and_503_with_backoff_then_succeeds(endpoint):
    endpoint.script = [("status", 429), ("status", 503)]
    sleeps: list[float] = []
    generator = make_generator(endpoint, sleeps=sleeps)
    [candidate] = generator.generate(TASK, 1, seed=0)
    assert candidate.code is not None
    assert generator.requests_sent == 3 and len(endpoint.requests) == 3
    assert sleeps == [0.0, 0.0]  # the server's Retry-After: 0 is honoured


def test_gives_up_after_max_retries_with_the_last_problem(endpoint):
    endpoint.script = [("status", 500)] * 3
    generator = make_generator(endpoint, max_retries=2)
    with pytest.raises(EndpointError, match="giving up after 3 attempts; last problem: HTTP 500"):
        generator.generate(TASK, 1, seed=0)
    assert len(endpoint.requests) == 3


def test_client_errors_are_not_retried(endpoint):
    endpoint.script = [("status", 401)]
    generator = make_generator(endpoint)
    with pytest.raises(EndpointError, match="HTTP 401") as info:
        generator.generate(TASK, 1, seed=0)
    assert info.value.status == 401 and len(endpoint.requests) == 1


def test_unreachable_endpoint_is_retried_then_reported():
    config = OpenAICompatibleConfig(base_url="http://127.0.0.1:9/v1", model="m", requests_per_minute=0,
                                    max_retries=1, timeout_s=2)
    generator = OpenAICompatibleGenerator(config, sleep=lambda s: None)
    with pytest.raises(EndpointError, match="giving up after 2 attempts"):
        generator.generate(TASK, 1, seed=0)


def test_cache_serves_repeated_requests_without_network(endpoint, tmp_path):
    first = make_generator(endpoint, tmp_path).generate(TASK, 2, seed=5)
    assert len(endpoint.requests) == 2
    again = make_generator(endpoint, tmp_path)  # a fresh client, same cache directory
    second = again.generate(TASK, 2, seed=5)
    assert again.requests_sent == 0 and len(endpoint.requests) == 2
    assert [c.text for c in second] == [c.text for c in first] and all(c.cached for c in second)
    # A different sample seed, model or sampling setting is a different key.
    make_generator(endpoint, tmp_path).generate(TASK, 1, seed=99)
    make_generator(endpoint, tmp_path, temperature=0.2).generate(TASK, 1, seed=5)
    assert len(endpoint.requests) == 4


def test_api_key_is_not_part_of_the_cache_key(endpoint, tmp_path):
    make_generator(endpoint, tmp_path).generate(TASK, 1, seed=0)
    config = OpenAICompatibleConfig(base_url=endpoint.base_url, model="tiny-coder", api_key="another-key",
                                    requests_per_minute=0, cache_dir=str(tmp_path / "cache"))
    assert OpenAICompatibleGenerator(config).generate(TASK, 1, seed=0)[0].cached
    assert "sk-test" not in "".join(p.read_text() for p in (tmp_path / "cache").rglob("*.json"))


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"<html>gateway</html>", "not JSON"),
        (b"[1, 2]", "JSON list"),
        (b'{"id": "x"}', "no choices"),
        (b'{"choices": [{"text": "legacy"}]}', "no message"),
        (b'{"choices": [{"message": {"content": 5}}]}', "not a string"),
    ],
)
def test_malformed_responses_raise_clear_errors(endpoint, payload, message):
    endpoint.script = [("raw", payload)]
    with pytest.raises(MalformedResponseError, match=message):
        make_generator(endpoint).generate(TASK, 1, seed=0)


def test_concurrent_samples_keep_their_order(endpoint):
    candidates = make_generator(endpoint, max_concurrency=4).generate(TASK, 6, seed=0)
    assert [c.sample_index for c in candidates] == list(range(6))
    assert [c.text.rsplit("seed=", 1)[1] for c in candidates] == [str(i) for i in range(6)]


def test_rate_limiter_spaces_requests_across_threads():
    now = [100.0]
    sleeps: list[float] = []
    limiter = RateLimiter(120, clock=lambda: now[0], sleep=sleeps.append)  # one request every 0.5 s
    threads = [threading.Thread(target=limiter.acquire) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sleeps) == [0.5, 1.0, 1.5]


def test_rate_limit_applies_to_real_requests(endpoint):
    sleeps: list[float] = []
    generator = make_generator(endpoint, sleeps=sleeps, requests_per_minute=600, max_concurrency=1)
    generator.generate(TASK, 3, seed=0)
    # The fake sleep does not advance the real clock, so the 2nd and 3rd requests wait ~0.1 s and ~0.2 s.
    assert len(sleeps) == 2 and 0 < sleeps[0] <= 0.1 and sleeps[0] < sleeps[1] <= 0.2


def test_config_from_env_and_validation(monkeypatch):
    monkeypatch.setenv("DICE_GENERATOR_BASE_URL", "http://localhost:8000/v1")
    monkeypatch.setenv("DICE_GENERATOR_MODEL", "qwen-coder")
    monkeypatch.setenv("DICE_GENERATOR_API_KEY", "k")
    config = OpenAICompatibleConfig.from_env(temperature=0.0)
    assert (config.base_url, config.model, config.api_key, config.temperature) == (
        "http://localhost:8000/v1", "qwen-coder", "k", 0.0)
    monkeypatch.delenv("DICE_GENERATOR_BASE_URL")
    with pytest.raises(ValueError, match="DICE_GENERATOR_BASE_URL"):
        OpenAICompatibleGenerator(OpenAICompatibleConfig.from_env())
    with pytest.raises(ValueError, match="http"):
        OpenAICompatibleGenerator(OpenAICompatibleConfig(base_url="localhost:8000", model="m"))
