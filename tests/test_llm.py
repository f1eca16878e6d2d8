"""The LLM client against a real local chat-completions server (tests/chat_server.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import urllib.request

import pytest

from chat_server import ChatServer, Reply, chat_server, count_tokens  # noqa: F401  (fixture)
from cuda_l1.errors import UserError
from cuda_l1.llm import (
    EndpointConfig,
    LLMClient,
    MultiEndpointClient,
    endpoint_from_flags,
    load_endpoints,
    make_client,
)

MESSAGES = [{"role": "system", "content": "You write CUDA."}, {"role": "user", "content": "Make it faster."}]
KEY_ENV = "CUDA_L1_TEST_API_KEY"
SECRET = "sk-test-5f3a9c0e7d1b"


def endpoint(server: ChatServer, **kw) -> EndpointConfig:
    # A long default timeout: on a busy host a local request can take seconds, and an attempt timing
    # out would change the request and retry counts the tests assert. Tests of timeouts set their own.
    settings = dict(base_url=server.base_url, model="test-model", api_key_env=KEY_ENV,
                    backoff_base_s=0.01, backoff_max_s=0.05, timeout_s=60.0)
    settings.update(kw)
    return EndpointConfig(**settings)


def run(client, coro_fn):
    """Run `coro_fn(client)` in a fresh event loop and close the client there."""
    async def main():
        try:
            return await coro_fn(client)
        finally:
            await client.aclose()
    return asyncio.run(main())


# -- round trip ------------------------------------------------------------------------------
def test_round_trip_text_usage_latency_and_model(chat_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    chat_server.enqueue(Reply(text="class ModelNew(nn.Module): pass", delay_s=0.05))
    cfg = endpoint(chat_server, model="my-coder", temperature=0.7, max_tokens=512,
                   price_prompt_per_1m=2.0, price_completion_per_1m=8.0, extra_body={"top_k": 20})
    client = LLMClient(cfg)
    [c] = run(client, lambda cl: cl.complete(MESSAGES))

    assert c.ok and c.error is None
    assert c.text == "class ModelNew(nn.Module): pass"
    assert c.finish_reason == "stop"
    assert c.model == "my-coder"
    assert c.endpoint == chat_server.base_url
    prompt_tokens = count_tokens("You write CUDA.Make it faster.")
    assert c.prompt_tokens == prompt_tokens
    assert c.completion_tokens == count_tokens(c.text)
    assert c.cost == pytest.approx((prompt_tokens * 2.0 + c.completion_tokens * 8.0) / 1e6)
    # At least the server's scripted delay, and in seconds (milliseconds would read 50 or more); the
    # ceiling is loose because a busy host may take a while to set up the first connection.
    assert 0.05 <= c.latency_s < 30.0

    [req] = chat_server.chat_requests()
    assert req.body["model"] == "my-coder"
    assert req.body["messages"] == MESSAGES
    assert req.body["temperature"] == 0.7 and req.body["max_tokens"] == 512
    assert req.body["top_k"] == 20  # extra_body passed through
    assert "n" not in req.body

    stats = client.stats()[cfg.label]
    assert stats["requests"] == 1 and stats["completions"] == 1 and stats["failures"] == 0
    assert stats["prompt_tokens"] == prompt_tokens
    assert stats["completion_tokens"] == c.completion_tokens
    assert stats["cost"] == pytest.approx(c.cost)


def test_a_lone_surrogate_in_a_completion_can_still_be_stored(chat_server, tmp_path):
    # JSON's "\ud800" decodes to a str no UTF-8 store can hold; the completion arrives cleaned.
    from cuda_l1.store import Store
    from cuda_l1.tasks import load_builtin

    chat_server.enqueue(Reply(text="x = '\ud800'"))
    client = LLMClient(endpoint(chat_server))
    [c] = run(client, lambda cl: cl.complete(MESSAGES))
    assert c.ok and c.text == "x = '?'"
    with Store(tmp_path / "history.sqlite") as store:
        task_id = store.add_task(load_builtin()[0])
        prompt_id = store.record_prompt(task_id, MESSAGES)
        store.record_completion(prompt_id, c.text, parse_status="parse_error")


@pytest.mark.parametrize("reply, tokens", [
    (Reply(body={"usage": {"prompt_tokens": "a", "completion_tokens": 3}}), (0, 3)),
    (Reply(body={"usage": {"prompt_tokens": float("nan"), "completion_tokens": float("inf")}}), (0, 0)),
    (Reply(body={"usage": {"prompt_tokens": -100, "completion_tokens": -7}}), (0, 0)),
    (Reply(choice={"finish_reason": {"x": [1]}}), None),
    (Reply(body={"model": {"name": 1}}), None),
])
def test_a_malformed_completion_is_kept_with_what_it_says_that_fits(chat_server, tmp_path, reply, tokens):
    # A server's usage counts, finish reason and model name are input: a string or NaN as a count stopped the
    # whole optimize run, a negative one was stored as it was, a dict as a finish reason was taken for a
    # damaged store when it was written.
    from cuda_l1.store import Store
    from cuda_l1.tasks import load_builtin

    chat_server.enqueue(reply)
    [c] = run(LLMClient(endpoint(chat_server)), lambda cl: cl.complete(MESSAGES))
    assert c.ok and c.text == "ok" and c.model == "test-model"
    assert c.finish_reason in ("stop", None) and (c.finish_reason is None) == ("finish_reason" in reply.choice)
    if tokens is not None:
        assert (c.prompt_tokens, c.completion_tokens) == tokens
    with Store(tmp_path / "history.sqlite") as store:
        prompt_id = store.record_prompt(store.add_task(load_builtin()[0]), MESSAGES)
        store.record_completion(prompt_id, c.text, model=c.model, finish_reason=c.finish_reason,
                                prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens)


@pytest.mark.parametrize("choices", [5, "x", [], None])
def test_choices_that_are_no_list_make_a_failed_request(chat_server, choices):
    chat_server.enqueue(Reply(body={"choices": choices}))
    [c] = run(LLMClient(endpoint(chat_server, max_retries=0)), lambda cl: cl.complete(MESSAGES))
    assert not c.ok and c.text == "" and "bad response" in c.error


def test_a_web_page_in_place_of_a_completion_says_so(chat_server):
    """A --base-url that names a web server's page (a UI, a proxy's login) answers 200 with HTML: the
    failure says so and where the API usually is, not "no choices"."""
    chat_server.enqueue(Reply(html="<!DOCTYPE html><html><body>Sign in</body></html>"))
    [c] = run(LLMClient(endpoint(chat_server, max_retries=0)), lambda cl: cl.complete(MESSAGES))
    assert not c.ok and "not a chat completion" in c.error and "<!DOCTYPE html>" in c.error, c.error
    assert "/v1" in c.error


def test_length_finish_reason_and_overrides(chat_server):
    chat_server.enqueue(Reply(text="x" * 400))
    client = LLMClient(endpoint(chat_server))
    [c] = run(client, lambda cl: cl.complete(MESSAGES, max_tokens=10, temperature=0.0, seed=7))
    assert c.finish_reason == "length" and len(c.text) == 40 and c.completion_tokens == 10
    body = chat_server.chat_requests()[0].body
    assert body["max_tokens"] == 10 and body["temperature"] == 0.0 and body["seed"] == 7


def test_n_choices_in_one_request(chat_server):
    chat_server.enqueue(Reply(texts=["a" * 8, "b" * 40, "c" * 4]))
    client = LLMClient(endpoint(chat_server))
    out = run(client, lambda cl: cl.complete(MESSAGES, n=3))
    assert [c.text for c in out] == ["a" * 8, "b" * 40, "c" * 4]
    [req] = chat_server.chat_requests()
    assert req.body["n"] == 3
    # Per-choice shares add up to the request's usage.
    assert sum(c.prompt_tokens for c in out) == count_tokens("You write CUDA.Make it faster.")
    assert sum(c.completion_tokens for c in out) == 2 + 10 + 1
    assert client.totals()["completions"] == 3


def test_n_choices_as_separate_requests_when_server_lacks_n(chat_server):
    client = LLMClient(endpoint(chat_server, native_n=False))
    out = run(client, lambda cl: cl.complete(MESSAGES, n=4))
    assert len(out) == 4 and all(c.ok for c in out)
    reqs = chat_server.chat_requests()
    assert len(reqs) == 4 and all("n" not in r.body for r in reqs)


# -- retries and failures --------------------------------------------------------------------
def test_retries_429_and_500_then_succeeds(chat_server):
    chat_server.enqueue(Reply(status=429), Reply(status=500), Reply(text="finally"))
    cfg = endpoint(chat_server, max_retries=3)
    client = LLMClient(cfg)
    [c] = run(client, lambda cl: cl.complete(MESSAGES))
    assert c.ok and c.text == "finally"
    assert len(chat_server.chat_requests()) == 3
    stats = client.stats()[cfg.label]
    assert stats["requests"] == 3 and stats["retries"] == 2 and stats["failures"] == 0


def test_retry_after_header_is_respected(chat_server):
    chat_server.enqueue(Reply(status=429, headers={"Retry-After": "0.3"}), Reply(text="ok"))
    client = LLMClient(endpoint(chat_server, backoff_max_s=1.0))
    [c] = run(client, lambda cl: cl.complete(MESSAGES))
    assert c.ok
    first, second = chat_server.chat_requests()
    # Without the header the backoff would be about 0.01 s, so the lower bound is the property. The
    # ceiling only rules out some unrelated, much longer wait; it is loose so that a busy host, which
    # can delay a sleeping task's wake-up, cannot fail it.
    assert 0.3 <= second.at - first.at < 10.0


def test_no_retry_on_400(chat_server):
    chat_server.enqueue(Reply(status=400, error_message="context length exceeded"))
    cfg = endpoint(chat_server, max_retries=3)
    client = LLMClient(cfg)
    out = run(client, lambda cl: cl.complete(MESSAGES, n=2))
    assert len(chat_server.chat_requests()) == 1
    assert len(out) == 2 and all(not c.ok and c.text == "" for c in out)
    assert "400" in out[0].error and "context length exceeded" in out[0].error
    stats = client.stats()[cfg.label]
    assert stats["failures"] == 1 and stats["retries"] == 0 and stats["completions"] == 0


def test_timeout_is_retried_then_reported_without_raising(chat_server):
    # The server would answer only after a minute (it stops waiting when the test ends).
    chat_server.responder = lambda req: Reply(delay_s=60.0, text="too late")
    cfg = endpoint(chat_server, timeout_s=0.5, max_retries=1)
    client = LLMClient(cfg)
    t0 = time.monotonic()
    [c] = run(client, lambda cl: cl.complete(MESSAGES))
    # Two attempts of 0.5 s each under the client's own timeout. Without it, the HTTP library's
    # fallback (timeout_s + 5 s per attempt) would take over 11 s, so the bound keeps a wide margin
    # on both sides: a busy host cannot reach it, a missing timeout cannot stay under it.
    assert time.monotonic() - t0 < 8.0
    assert not c.ok and "timed out" in c.error and "2 attempts" in c.error
    assert len(chat_server.chat_requests()) == 2
    stats = client.stats()[cfg.label]
    assert stats["failures"] == 1 and stats["retries"] == 1 and stats["requests"] == 2


def test_dropped_connection_is_retried(chat_server):
    chat_server.enqueue(Reply(drop=True), Reply(text="second try"))
    client = LLMClient(endpoint(chat_server))
    [c] = run(client, lambda cl: cl.complete(MESSAGES))
    assert c.ok and c.text == "second try"
    assert len(chat_server.chat_requests()) == 2


def test_unreachable_endpoint_is_a_failed_completion():
    # A port bound but never listened on refuses connections, and stays ours for the whole test
    # (a port freed by a stopped server could be taken by another process in the meantime).
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
        cfg = EndpointConfig(base_url=f"http://127.0.0.1:{port}/v1", model="test-model", api_key_env=KEY_ENV,
                             backoff_base_s=0.01, backoff_max_s=0.05, timeout_s=60.0, max_retries=1)
        client = LLMClient(cfg)
        [c] = run(client, lambda cl: cl.complete(MESSAGES))
    assert not c.ok and "connection error" in c.error
    assert client.stats()[cfg.label]["requests"] == 2  # retried once, then reported


# -- concurrency -----------------------------------------------------------------------------
def test_concurrency_is_bounded_per_endpoint(chat_server):
    lock, state = threading.Lock(), {"now": 0, "peak": 0}
    overlapped = threading.Event()

    def responder(req):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            if state["now"] >= 2:
                overlapped.set()
        # Hold the first request until a second one is in flight, so that "really parallel" does not
        # depend on how fast the host sends the second request. A client that sends one at a time
        # never sets the event: the wait runs out and the peak stays 1.
        overlapped.wait(timeout=20)
        time.sleep(0.15)  # time for a third request to arrive, were the bound not kept
        with lock:
            state["now"] -= 1
        return Reply(text="done")

    chat_server.responder = responder
    client = LLMClient(endpoint(chat_server, max_concurrency=2))
    t0 = time.monotonic()
    results = run(client, lambda cl: asyncio.gather(*(cl.complete(MESSAGES) for _ in range(6))))
    elapsed = time.monotonic() - t0
    assert all(r[0].ok for r in results)
    assert len(chat_server.chat_requests()) == 6
    assert state["peak"] == 2 and chat_server.max_in_flight == 2  # bounded, yet really parallel
    assert elapsed >= 3 * 0.15


# -- several endpoints -----------------------------------------------------------------------
def test_weighted_endpoints_share_requests():
    with ChatServer() as a, ChatServer() as b:
        cfgs = [endpoint(a, name="big", weight=3), endpoint(b, name="small", weight=1)]
        client = MultiEndpointClient(cfgs, seed=1)
        out = run(client, lambda cl: cl.complete_many([MESSAGES] * 200))
        seen_a, seen_b = len(a.chat_requests()), len(b.chat_requests())
        assert seen_a + seen_b == 200
        assert 0.65 <= seen_a / 200 <= 0.85
        assert sum(1 for [c] in out if c.endpoint == a.base_url) == seen_a
        stats = client.stats()
        assert stats["big"]["requests"] == seen_a and stats["small"]["requests"] == seen_b
        assert stats["big"]["completions"] == seen_a
        assert client.totals()["requests"] == 200


def test_round_robin_and_per_endpoint_failures():
    with ChatServer() as a, ChatServer(responder=lambda r: Reply(status=400)) as b:
        cfgs = [endpoint(a, name="good"), endpoint(b, name="bad")]
        client = make_client(cfgs, strategy="round_robin")
        assert isinstance(client, MultiEndpointClient)
        out = run(client, lambda cl: asyncio.gather(*(cl.complete(MESSAGES) for _ in range(10))))
        assert len(a.chat_requests()) == 5 and len(b.chat_requests()) == 5
        assert sum(1 for [c] in out if c.ok) == 5
        stats = client.stats()
        assert stats["good"]["failures"] == 0 and stats["bad"]["failures"] == 5


# -- credentials -----------------------------------------------------------------------------
def test_key_sent_but_never_exposed(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)

    def echo_auth(req):  # a hostile server that echoes credentials back in its error message
        return Reply(status=400, error_message=f"bad key {server.requests[-1].authorization}")

    with ChatServer() as server:
        cfg = endpoint(server)
        client = LLMClient(cfg)
        multi = MultiEndpointClient([cfg])
        server.enqueue(Reply(text="fine"))
        good = run(client, lambda cl: cl.complete(MESSAGES))
        server.responder = echo_auth
        bad = run(multi, lambda cl: cl.complete(MESSAGES))
        auths = [r.authorization for r in server.chat_requests()]
    assert auths == [f"Bearer {SECRET}"] * 2
    assert "bad key" in bad[0].error
    exposed = [repr(client), repr(multi), repr(cfg), str(cfg.redacted()), repr(good), repr(bad),
               str(client.stats()), str(multi.stats())]
    for text in exposed:
        assert SECRET not in text
    assert cfg.redacted()["api_key_env"] == KEY_ENV and cfg.redacted()["api_key_set"] is True


def test_unset_key_uses_placeholder(chat_server, monkeypatch, caplog):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with caplog.at_level(logging.DEBUG, logger="cuda_l1.llm"):
        client = LLMClient(endpoint(chat_server))
    assert any(KEY_ENV in r.getMessage() and "placeholder" in r.getMessage() for r in caplog.records)
    [c] = run(client, lambda cl: cl.complete(MESSAGES))
    assert c.ok
    assert chat_server.chat_requests()[0].authorization == "Bearer EMPTY"


# -- config files ----------------------------------------------------------------------------
def test_load_toml_and_json(tmp_path):
    toml = tmp_path / "endpoints.toml"
    toml.write_text(
        '[[endpoints]]\nbase_url = "http://localhost:8000/v1"\nmodel = "qwen"\nweight = 3\n'
        'max_concurrency = 16\n[endpoints.extra_body]\ntop_k = 20\n\n'
        '[[endpoints]]\nbase_url = "https://api.example.com/v1"\nmodel = "big"\n'
        'api_key_env = "EXAMPLE_KEY"\nprice_prompt_per_1m = 0.27\nmax_tokens = 8192\n'
    )
    a, b = load_endpoints(toml)
    assert (a.model, a.weight, a.max_concurrency, a.extra_body) == ("qwen", 3, 16, {"top_k": 20})
    assert (b.api_key_env, b.price_prompt_per_1m, b.max_tokens) == ("EXAMPLE_KEY", 0.27, 8192)

    js = tmp_path / "endpoints.json"
    js.write_text(json.dumps({"endpoints": [{"base_url": "http://h:1/v1", "model": "m", "timeout_s": 30}]}))
    [c] = load_endpoints(js)
    assert c.timeout_s == 30 and c.api_key_env == "OPENAI_API_KEY"
    js.write_text(json.dumps([{"base_url": "http://h:1/v1", "model": "m2"}]))
    assert load_endpoints(js)[0].model == "m2"


@pytest.mark.parametrize("name, text, expected", [
    ("bad.toml", "[[endpoints]\nmodel = ", "malformed TOML"),
    ("bad.json", '{"endpoints": [', "malformed JSON"),
    ("nomodel.toml", '[[endpoints]]\nbase_url = "http://h/v1"\n', "missing required key(s): model"),
    ("key.json", '[{"base_url": "http://h/v1", "model": "m", "api_key": "sk-x"}]', "api_key_env"),
    ("typo.toml", '[[endpoints]]\nbase_url = "http://h/v1"\nmodel = "m"\nmax_concurency = 4\n', "max_concurency"),
    ("range.toml", '[[endpoints]]\nbase_url = "http://h/v1"\nmodel = "m"\nmax_concurrency = 0\n', "max_concurrency"),
    ("type.json", '[{"base_url": "http://h/v1", "model": "m", "timeout_s": "fast"}]', "timeout_s"),
    ("url.json", '[{"base_url": "localhost:8000", "model": "m"}]', "base_url"),
    ("empty.toml", "", "non-empty list"),
    ("cfg.yaml", "endpoints: []", ".toml or .json"),
])
def test_bad_config_names_file_and_problem(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_endpoints(path)
    message = str(info.value)
    assert str(path) in message and expected in message


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        load_endpoints(tmp_path / "nope.toml")


def test_endpoint_from_flags():
    cfg = endpoint_from_flags("http://localhost:30000/v1", "deepseek-coder", "MY_KEY", max_concurrency=4)
    assert (cfg.base_url, cfg.model, cfg.api_key_env, cfg.max_concurrency) == (
        "http://localhost:30000/v1", "deepseek-coder", "MY_KEY", 4)
    with pytest.raises(UserError, match="model"):
        endpoint_from_flags("http://localhost:30000/v1", "")


def test_models_route(chat_server):
    with urllib.request.urlopen(chat_server.base_url + "/models", timeout=5) as resp:
        data = json.load(resp)
    assert data["data"][0]["id"] == "test-model"
    assert chat_server.requests[0].method == "GET" and not chat_server.requests[0].has_auth


def test_vllm_engine_explains_missing_vllm():
    pytest.importorskip("cuda_l1.llm.vllm_engine")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    from cuda_l1.llm.vllm_engine import VLLMEngine

    with pytest.raises(UserError, match="install the vllm extra on a GPU host"):
        VLLMEngine("some/model")
