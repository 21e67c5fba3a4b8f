"""The official openai client against affinity serving the tiny model."""
import collections
import concurrent.futures
import json
import random
import time
import urllib.error
import urllib.request

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_models(client, model_id):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_id]


def test_chat_non_streaming(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hello"}],
                                       max_tokens=24, temperature=0, extra_body={"thinking": {"type": "disabled"}})
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert isinstance(choice.message.content, str)
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_with_usage(client, model_id):
    stream = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Count"}],
                                            max_tokens=16, stream=True, stream_options={"include_usage": True})
    finish, usage, pieces = None, None, 0
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            pieces += 1
            finish = c.finish_reason or finish
    assert pieces > 1
    assert finish in ("stop", "length", "tool_calls")
    assert usage is not None and usage.completion_tokens > 0


def test_tool_call_round_trip(client, model_id):
    """tool_calls out, tool result in, final answer (the tiny model was trained on such turns)."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=model_id, messages=messages, tools=[WEATHER_TOOL], max_tokens=96,
                                       temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", (r.choices[0].finish_reason, msg.content)
    assert msg.tool_calls, "the model did not call the tool"
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)  # always valid JSON
    assert call.id.startswith("call_")
    messages.append({"role": "assistant", "content": msg.content,
                     "tool_calls": [tc.model_dump() for tc in msg.tool_calls],
                     "reasoning_content": getattr(msg, "reasoning_content", None)})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"})
    final = client.chat.completions.create(model=model_id, messages=messages, tools=[WEATHER_TOOL], max_tokens=64,
                                           temperature=0)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content, "no final answer after the tool result"


def test_completions(client, model_id):
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert isinstance(r.choices[0].text, str)


def test_bounded_load(client, model_id):
    """32 clients x 20 requests, zero failures, no leaked threads, no memory growth."""
    from conftest import server_proc_status

    def one(i):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": f"hi {i}"}],
                                           max_tokens=4, extra_body={"thinking": {"type": "disabled"}})
        return r.choices[0].finish_reason

    def burst(n):
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            return list(pool.map(one, range(n)))

    burst(64)  # warm up: worker pools and session buffers reach their steady size
    threads0, rss0 = server_proc_status("Threads"), server_proc_status("VmRSS")
    results = burst(32 * 20)
    assert all(f in ("stop", "length") for f in results), collections.Counter(results)
    if threads0 is not None:
        time.sleep(1.0)  # let finished requests release their sessions
        threads1, rss1 = server_proc_status("Threads"), server_proc_status("VmRSS")
        assert threads1 <= threads0, (threads0, threads1)
        # 640 requests after warm-up: allow allocator noise, not per-request growth.
        assert rss1 - rss0 < 32 * 1024, (rss0, rss1)


def test_fuzzed_bodies_never_crash(base_url, model_id):
    valid = json.dumps({"model": model_id, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    rng = random.Random()
    for _ in range(200):
        b = bytearray(valid.encode())
        for _ in range(rng.randint(1, 5)):
            b[rng.randrange(len(b))] = rng.choice(b'{}[]",:0a\\ \x01\xff')
        req = urllib.request.Request(base_url + "/v1/chat/completions", data=bytes(b),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                assert r.status == 200
        except urllib.error.HTTPError as e:
            assert e.code in (400, 413), e.code
            assert "error" in json.loads(e.read())
    with urllib.request.urlopen(base_url + "/health", timeout=10) as r:
        assert r.status == 200
