#!/usr/bin/env python3
"""Generates the golden chat-encoding and output-parsing fixtures in tests/data/chat/.

The prompts come from DeepSeek's official V4 encoder (encoding_dsv4.py; vLLM
ships a copy as vllm/tokenizers/deepseek_v4_encoding.py). The encoder is only
*run* here to produce expected strings; it is never committed or imported by
affinity itself.

usage: gen_chat_fixtures.py --encoder PATH/TO/deepseek_v4_encoding.py [--out tests/data/chat]

Request-level handling that is not part of the encoder (attaching `tools` and
`response_format` to the first system message, mapping `reasoning_content` to the
encoder's `reasoning` key) is done here the way an OpenAI front end does it.
"""
import argparse
import copy
import importlib.util
import json
import os

ABSOLUTE_MAX = None  # filled from the encoder's own table (0731 "high")


def load_encoder(path):
    spec = importlib.util.spec_from_file_location("dsv4_encoding", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def effort_table(enc, variant):
    """The encoder ships the 0731 table; the April preview had high (default,
    no prefix) and max (the text 0731 later reused for high)."""
    table = dict(enc.REASONING_EFFORT_PROMPTS)
    if variant == "v4-0731":
        return table, "low"
    return {"high": "", "max": table["high"]}, "high"


def to_official(messages, tools, response_format):
    msgs = []
    for m in messages:
        m = copy.deepcopy(m)
        if m.get("role") == "assistant" and "reasoning_content" in m:
            m["reasoning"] = m.pop("reasoning_content")
        msgs.append(m)
    has_format = isinstance(response_format, dict) and response_format.get("type") != "text"
    if tools or has_format:
        idx = next((i for i, m in enumerate(msgs) if m.get("role") == "system"), None)
        if idx is None:
            msgs.insert(0, {"role": "system"})
            idx = 0
        if tools:
            msgs[idx]["tools"] = tools
        if has_format:
            msgs[idx]["response_format"] = response_format
    return msgs


def encode(enc, case):
    opts = case["options"]
    table, default = effort_table(enc, opts["variant"])
    saved = (enc.REASONING_EFFORT_PROMPTS, enc.DEFAULT_REASONING_EFFORT)
    enc.REASONING_EFFORT_PROMPTS, enc.DEFAULT_REASONING_EFFORT = table, default
    try:
        return enc.encode_messages(
            to_official(case["messages"], case.get("tools"), case.get("response_format")),
            thinking_mode="thinking" if opts["thinking"] else "chat",
            drop_thinking=opts["drop_thinking"],
            reasoning_effort=opts["reasoning_effort"] or None,
        )
    finally:
        enc.REASONING_EFFORT_PROMPTS, enc.DEFAULT_REASONING_EFFORT = saved


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city. Ünïcode «ok» \"quoted\"",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
        "units": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.\nReturns top hits.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "number"}, "filters": {"type": "object"}}}}}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def opts(variant="v4-0731", thinking=True, effort="", drop=True):
    return {"variant": variant, "thinking": thinking, "reasoning_effort": effort, "drop_thinking": drop}


def encoding_cases():
    tool_turns = [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "Weather in Paris and Tokyo? Also search news."},
        {"role": "assistant", "content": None, "reasoning_content": "Need three calls.",
         "tool_calls": [call("c1", "get_weather", {"city": "Paris", "days": 3}),
                        call("c2", "get_weather", {"city": "東京", "units": "c"}),
                        call("c3", "search", {"query": "news <today>", "limit": 2.5,
                                              "filters": {"lang": ["en", "fr"], "safe": True, "since": None}})]},
        # Results arrive out of order: the encoder re-orders them by call order.
        {"role": "tool", "tool_call_id": "c3", "content": "headline A\nheadline B"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "18C"}, {"type": "text", "text": "sunny"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "22C"},
    ]
    cases = [
        ("single_user_thinking", [{"role": "user", "content": "Hello!"}], None, None, opts()),
        ("single_user_chat", [{"role": "user", "content": "Hello!"}], None, None, opts(thinking=False)),
        ("system_user_thinking", [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "2+2?"}], None, None, opts()),
        ("multi_turn_drop_thinking", [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Simple sum."},
            {"role": "user", "content": "And 3+3?"}], None, None, opts()),
        ("multi_turn_keep_thinking", [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Simple sum."},
            {"role": "user", "content": "And 3+3?"}], None, None, opts(drop=False)),
        ("multi_turn_chat", [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "ignored in chat mode"},
            {"role": "user", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]}],
         None, None, opts(thinking=False)),
        ("effort_0731_high", [{"role": "user", "content": "Prove it."}], None, None, opts(effort="high")),
        ("effort_0731_max", [{"role": "system", "content": "sys"}, {"role": "user", "content": "Prove it."}],
         None, None, opts(effort="max")),
        ("effort_0731_low", [{"role": "user", "content": "Prove it."}], None, None, opts(effort="low")),
        ("effort_v4_max", [{"role": "user", "content": "Prove it."}], None, None, opts(variant="v4", effort="max")),
        ("effort_v4_high", [{"role": "user", "content": "Prove it."}], None, None, opts(variant="v4", effort="high")),
        ("effort_ignored_in_chat", [{"role": "user", "content": "Prove it."}], None, None,
         opts(thinking=False, effort="max")),
        ("tools_no_system", [{"role": "user", "content": "Weather in Oslo?"}], [WEATHER], None, opts()),
        ("tools_with_system_chat", [{"role": "system", "content": "Use tools."},
                                    {"role": "user", "content": "Weather in Oslo?"}], [WEATHER, SEARCH], None,
         opts(thinking=False)),
        ("tool_round_trip_thinking", tool_turns, [WEATHER, SEARCH], None, opts()),
        ("tool_round_trip_chat", tool_turns, [WEATHER, SEARCH], None, opts(thinking=False)),
        ("tool_round_trip_then_answer_then_user", tool_turns + [
            {"role": "assistant", "content": "Paris 18C sunny, Tokyo 22C.", "reasoning_content": "Summarise."},
            {"role": "user", "content": "Thanks. Tomorrow?"}], [WEATHER, SEARCH], None, opts()),
        ("tool_call_with_text_content", [
            {"role": "user", "content": "Check Rome"},
            {"role": "assistant", "content": "Let me check.", "reasoning_content": "r",
             "tool_calls": [call("x", "get_weather", {"city": "Rome"})]},
            {"role": "tool", "tool_call_id": "x", "content": "warm"},
            {"role": "user", "content": "and?"}], [WEATHER], None, opts()),
        ("consecutive_users", [{"role": "user", "content": "first"}, {"role": "user", "content": "second"}],
         None, None, opts()),
        ("latest_reminder_after_user", [
            {"role": "user", "content": "What day is it?"},
            {"role": "latest_reminder", "content": "Today is 2026-05-01."}], None, None, opts()),
        ("system_last", [{"role": "system", "content": "Only a system prompt."}], None, None, opts()),
        ("response_format", [{"role": "user", "content": "Give JSON."}], None,
         {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                          "properties": {"a": {"type": "integer"}}}}},
         opts(thinking=False)),
        ("unicode_and_controls", [{"role": "system", "content": "Ünïcødé ✓ 日本語\ttab"},
                                  {"role": "user", "content": "emoji 🎉 and \"quotes\" \\ back"}], None, None, opts()),
        ("assistant_history_no_reasoning_thinking", [
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d", "reasoning_content": "rd"},
            {"role": "user", "content": "e"}], None, None, opts(drop=False)),
    ]
    out = []
    for name, messages, tools, response_format, o in cases:
        case = {"name": name, "messages": messages, "options": o}
        if tools:
            case["tools"] = tools
        if response_format:
            case["response_format"] = response_format
        out.append(case)
    return out


def parser_cases(enc):
    user = [{"role": "user", "content": "q"}]
    replies = [
        ("plain_thinking", True, {"role": "assistant", "reasoning_content": "Let me think.\nOK.", "content": "The answer is 4."}),
        ("plain_chat", False, {"role": "assistant", "content": "Hello there, <b>bold</b> and </think-ish> text."}),
        ("empty_reasoning", True, {"role": "assistant", "reasoning_content": "", "content": "Direct."}),
        ("unicode", True, {"role": "assistant", "reasoning_content": "日本語で考える…", "content": "答え: 🎉 «ok»"}),
        ("one_tool_call", True, {"role": "assistant", "reasoning_content": "Need weather.", "content": "",
                                 "tool_calls": [call("a", "get_weather", {"city": "Paris", "days": 3})]}),
        ("tool_call_with_content", True, {"role": "assistant", "reasoning_content": "r", "content": "Checking now.",
                                          "tool_calls": [call("a", "search", {"query": "a \"quoted\" \\ path\nline2 </x>"})]}),
        ("parallel_calls_chat", False, {"role": "assistant", "content": None, "tool_calls": [
            call("a", "get_weather", {"city": "東京", "units": "c"}),
            call("b", "search", {"query": "news", "limit": 2.5, "filters": {"lang": ["en"], "safe": True, "n": None}}),
            call("c", "noop", {})]}),
        ("nested_values", True, {"role": "assistant", "reasoning_content": "x", "content": "", "tool_calls": [
            call("a", "f", {"list": [1, 2, {"k": "v"}], "flag": False, "num": -0.125, "text": "tab\tand\u0001ctl"})]}),
    ]
    out = []
    for name, thinking, reply in replies:
        mode = "thinking" if thinking else "chat"
        prefix = enc.encode_messages(to_official(user, None, None), thinking_mode=mode)
        full = enc.encode_messages(to_official(user + [reply], None, None), thinking_mode=mode)
        assert full.startswith(prefix), name
        completion = full[len(prefix):]
        assert completion.endswith(enc.eos_token), name
        completion = completion[: -len(enc.eos_token)]  # EOS is a stop token, never parser input
        expected_calls = []
        for tc in reply.get("tool_calls") or []:
            args = json.loads(tc["function"]["arguments"])
            expected_calls.append({"name": tc["function"]["name"], "arguments": enc.to_json(args)})
        out.append({"name": name, "thinking": thinking, "completion": completion,
                    "expected": {"reasoning_content": reply.get("reasoning_content", "") if thinking else "",
                                 "content": reply.get("content") or "", "tool_calls": expected_calls}})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoder", default=os.environ.get("DSV4_ENCODER"), required=os.environ.get("DSV4_ENCODER") is None)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "chat"))
    args = ap.parse_args()
    enc = load_encoder(args.encoder)
    cases = encoding_cases()
    for c in cases:
        c["prompt"] = encode(enc, c)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "encoding_cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "parser_cases.json"), "w", encoding="utf-8") as f:
        json.dump(parser_cases(enc), f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} encoding cases and parser cases to {args.out}")


if __name__ == "__main__":
    main()
