"""Generator backend for any OpenAI-compatible `/v1/chat/completions` endpoint (vLLM, SGLang, TGI, hosted APIs):
one request per sample with retries and backoff on 429/5xx/timeouts, a client-side requests-per-minute limit and an
on-disk response cache. Standard library only (urllib): no SDK dependency.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dice_pipeline import settings
from dice_pipeline.synthesis.candidates import GeneratedCandidate, GenerationError, check_sample_count

ENV_BASE_URL = settings.GENERATOR_BASE_URL.name
ENV_MODEL = settings.GENERATOR_MODEL.name
ENV_API_KEY = settings.GENERATOR_API_KEY.name
RETRYABLE_HTTP_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
CACHE_FORMAT_VERSION = 1


class MalformedResponseError(GenerationError):
    """The endpoint answered 200 with something that is not a chat completion."""


class EndpointError(GenerationError):
    """A non-retryable HTTP error, or retries exhausted."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass
class OpenAICompatibleConfig:
    base_url: str = ""  # e.g. http://127.0.0.1:8000/v1 ; requests go to {base_url}/chat/completions
    model: str = ""
    api_key: str = ""  # never part of the cache key, never logged
    temperature: float = 1.0
    top_p: float = 0.95
    max_tokens: int = 4096
    extra_body: dict[str, Any] = field(default_factory=dict)  # e.g. {"top_k": 20} for vLLM
    timeout_s: float = 300.0
    max_retries: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    requests_per_minute: float = 60.0  # 0 disables the client-side limit
    max_concurrency: int = 4
    cache_dir: str = ""  # empty: no cache

    @classmethod
    def from_env(cls, **overrides: Any) -> OpenAICompatibleConfig:
        """Config with base URL, model and key from DICE_GENERATOR_* env vars unless given explicitly."""
        values = {
            "base_url": settings.GENERATOR_BASE_URL.get(),
            "model": settings.GENERATOR_MODEL.get(),
            "api_key": settings.GENERATOR_API_KEY.get(),
        }
        values.update({k: v for k, v in overrides.items() if v is not None and v != ""})
        return cls(**values)

    def validate(self) -> None:
        if not self.base_url:
            raise ValueError(f"no endpoint: set base_url or {ENV_BASE_URL}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.model:
            raise ValueError(f"no model: set model or {ENV_MODEL}")
        if self.max_retries < 0 or self.max_concurrency < 1 or self.requests_per_minute < 0:
            raise ValueError("max_retries >= 0, max_concurrency >= 1 and requests_per_minute >= 0 are required")


class RateLimiter:
    """Spaces request starts at least 60/requests_per_minute seconds apart, across threads."""

    def __init__(self, requests_per_minute: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.interval_s = 60.0 / requests_per_minute if requests_per_minute > 0 else 0.0
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next_start = 0.0

    def acquire(self) -> None:
        if self.interval_s <= 0:
            return
        with self._lock:  # reserve a slot, then wait for it outside the lock
            now = self._clock()
            start = max(now, self._next_start)
            self._next_start = start + self.interval_s
        if start > now:
            self._sleep(start - now)


class ResponseCache:
    """One JSON file per (base_url, model, messages, sampling params, sample index), written atomically."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    @staticmethod
    def key(request_identity: dict[str, Any]) -> str:
        payload = json.dumps({"v": CACHE_FORMAT_VERSION, **request_identity}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError):
            return None  # a torn or corrupt entry is a miss; the next write replaces it

    def put(self, key: str, entry: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(entry, sort_keys=True))
        os.replace(tmp, path)


def parse_chat_completion(body: bytes) -> tuple[str, str, dict[str, Any]]:
    """(content, finish_reason, usage) of a chat completion, or MalformedResponseError saying what is wrong."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedResponseError(f"response is not JSON: {exc}; body starts {body[:200]!r}") from None
    if not isinstance(data, dict):
        raise MalformedResponseError(f"response is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponseError(f"response has no choices: keys {sorted(data)}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise MalformedResponseError("choices[0] has no message object")
    content = message.get("content")
    if content is None:
        content = ""  # some servers send null content with a non-"stop" finish reason (e.g. length at 0 tokens)
    if not isinstance(content, str):
        raise MalformedResponseError(f"choices[0].message.content is {type(content).__name__}, not a string")
    finish_reason = choice.get("finish_reason") or "unknown"
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return content, str(finish_reason), usage


class OpenAICompatibleGenerator:
    """`KernelGenerator` over an OpenAI-compatible chat endpoint. Sample i of a call uses seed + i, so each sample
    is cached and reproducible on its own (servers that honour `seed`, such as vLLM, return the same text)."""

    backend = "openai_compatible"

    def __init__(self, config: OpenAICompatibleConfig | None = None, *, messages_fn=None, extract_fn=None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.config = config if config is not None else OpenAICompatibleConfig.from_env()
        self.config.validate()
        if messages_fn is None or extract_fn is None:
            from dice_pipeline import prompts

            messages_fn = messages_fn or prompts.kernel_generation_messages
            extract_fn = extract_fn or prompts.extract_code_block
        self._messages_fn = messages_fn
        self._extract_fn = extract_fn
        self._sleep = sleep
        self._rate_limiter = RateLimiter(self.config.requests_per_minute, clock=clock, sleep=sleep)
        self._cache = ResponseCache(self.config.cache_dir) if self.config.cache_dir else None
        self.requests_sent = 0  # HTTP attempts, retries included: how the tests prove the cache works
        self._count_lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self.config.model

    @property
    def url(self) -> str:
        return self.config.base_url.rstrip("/") + "/chat/completions"

    def sampling_params(self) -> dict[str, Any]:
        c = self.config
        return {"temperature": c.temperature, "top_p": c.top_p, "max_tokens": c.max_tokens, **c.extra_body}

    def generate(self, task_pytorch_code: str, n: int, *, seed: int = 0) -> list[GeneratedCandidate]:
        check_sample_count(n)
        messages = self._messages_fn(task_pytorch_code)
        workers = min(n, self.config.max_concurrency)
        if workers == 1:
            return [self._sample(messages, index, seed + index) for index in range(n)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(self._sample, messages, index, seed + index) for index in range(n)]
            return [future.result() for future in futures]

    def _sample(self, messages: list[dict[str, str]], sample_index: int, seed: int) -> GeneratedCandidate:
        params = self.sampling_params()
        identity = {"base_url": self.config.base_url.rstrip("/"), "model": self.config.model, "messages": messages,
                    "params": params, "seed": seed, "sample_index": sample_index}
        cache_key = ResponseCache.key(identity) if self._cache else ""
        started = time.perf_counter()
        entry = self._cache.get(cache_key) if self._cache else None
        cached = entry is not None
        if entry is None:
            body = self._post({"model": self.config.model, "messages": messages, "seed": seed, "n": 1, **params})
            content, finish_reason, usage = parse_chat_completion(body)
            entry = {"content": content, "finish_reason": finish_reason, "usage": usage,
                     "latency_s": time.perf_counter() - started}
            if self._cache:
                self._cache.put(cache_key, entry)
        return GeneratedCandidate(
            text=entry["content"],
            code=self._extract_fn(entry["content"]),
            backend=self.backend,
            model=self.config.model,
            prompt_messages=messages,
            finish_reason=entry["finish_reason"],
            latency_s=float(entry["latency_s"]),  # the original request's latency, also on a cache hit
            sample_index=sample_index,
            seed=seed,
            cached=cached,
            usage=dict(entry.get("usage") or {}),
            variant={"base_url": self.config.base_url, **params},
        )

    def _backoff_s(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.config.backoff_max_s)
            except ValueError:
                pass  # an HTTP-date Retry-After: fall back to exponential backoff
        base = min(self.config.backoff_initial_s * 2**attempt, self.config.backoff_max_s)
        return base * (0.5 + random.random() / 2)  # jitter keeps parallel workers from retrying in lockstep

    def _post(self, payload: dict[str, Any]) -> bytes:
        data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        last_problem = ""
        retry_after: str | None = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                self._sleep(self._backoff_s(attempt - 1, retry_after))
            retry_after = None
            self._rate_limiter.acquire()
            with self._count_lock:
                self.requests_sent += 1
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                    return response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:500].decode("utf-8", "replace")
                if exc.code not in RETRYABLE_HTTP_STATUSES:
                    raise EndpointError(f"{self.url} answered HTTP {exc.code}: {detail}", status=exc.code) from None
                retry_after = exc.headers.get("Retry-After") if exc.headers else None
                last_problem = f"HTTP {exc.code}: {detail}"
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as exc:
                reason = getattr(exc, "reason", exc)
                last_problem = f"{type(exc).__name__}: {reason}"
        raise EndpointError(
            f"{self.url}: giving up after {self.config.max_retries + 1} attempts; last problem: {last_problem}"
        )
