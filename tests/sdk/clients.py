"""The official openai and anthropic SDKs drive multi-turn tool use against
`gyre gateway`, streamed and not. Run by tests/gateway_sdk.rs with the
gateway's address and one execution key per conversation in the
environment; prints one line per conversation and exits non-zero on failure."""

import json
import os
import sys

import anthropic
import openai

BASE = os.environ["GYRE_API"]
KEYS = json.loads(os.environ["GYRE_KEYS"])

A_TOOLS = [{"name": "bash", "description": "run a command",
            "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
O_TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def anthropic_conversation(key, stream):
    client = anthropic.Anthropic(base_url=BASE, api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "what is here?"}]

    def ask():
        kw = dict(model="gyre-policy", max_tokens=512, system="be brief", tools=A_TOOLS, messages=messages)
        if stream:
            with client.messages.stream(**kw) as s:
                deltas = [e for e in s if e.type == "content_block_delta"]
                msg = s.get_final_message()
            check(len(deltas) > 1, "streamed deltas")
            return msg
        return client.messages.create(**kw)

    first = ask()
    check(first.stop_reason == "tool_use", f"stop_reason {first.stop_reason}")
    use = [b for b in first.content if b.type == "tool_use"][0]
    check(use.input == {"cmd": "ls"}, f"tool input {use.input}")
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]})
    second = ask()
    check(second.stop_reason == "end_turn", f"stop_reason {second.stop_reason}")
    text = "".join(b.text for b in second.content if b.type == "text")
    check(text == "There is one file.", f"text {text!r}")
    count = client.messages.count_tokens(model="gyre-policy", messages=messages, tools=A_TOOLS)
    check(count.input_tokens > 0, "count_tokens")
    print("anthropic", "stream" if stream else "plain", "ok")


def openai_conversation(key, stream):
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=key, max_retries=0)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is here?"}]

    def ask():
        kw = dict(model="gyre-policy", messages=messages, tools=O_TOOLS)
        if not stream:
            return client.chat.completions.create(**kw).choices[0]
        content, calls, finish = "", {}, None
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if not chunk.choices:
                check(chunk.usage.prompt_tokens > 0, "usage chunk")
                continue
            d = chunk.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        return {"content": content, "calls": list(calls.values()), "finish": finish}

    first = ask()
    if stream:
        check(first["finish"] == "tool_calls", f"finish {first['finish']}")
        call = first["calls"][0]
        content = first["content"]
    else:
        check(first.finish_reason == "tool_calls", f"finish {first.finish_reason}")
        tc = first.message.tool_calls[0]
        call = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
        content = first.message.content
    check(json.loads(call["arguments"]) == {"cmd": "ls"}, f"arguments {call['arguments']}")
    messages.append({"role": "assistant", "content": content, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]})
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "a.txt"})
    second = ask()
    text = second["content"] if stream else second.message.content
    check(text == "There is one file.", f"text {text!r}")
    models = client.models.list()
    check(models.data[0].id == "gyre-policy", "models")
    print("openai", "stream" if stream else "plain", "ok")


R_TOOLS = [{"type": "function", "name": "bash", "description": "run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


def responses_conversation(key, stream):
    """Turn 1 gets a function call; turn 2 sends its output, by full input
    items (plain) or by previous_response_id (streamed)."""
    client = openai.OpenAI(base_url=BASE + "/v1", api_key=key, max_retries=0)
    items = [{"role": "user", "content": "what is here?"}]

    def ask(input_items, previous=None):
        kw = dict(model="gyre-policy", instructions="be brief", input=input_items, tools=R_TOOLS)
        if previous:
            kw["previous_response_id"] = previous
        if not stream:
            return client.responses.create(**kw)
        kinds, done = [], None
        for event in client.responses.create(stream=True, **kw):
            kinds.append(event.type)
            if event.type == "response.completed":
                done = event.response
        check(kinds[0] == "response.created" and kinds[-1] == "response.completed", f"events {kinds}")
        return done

    first = ask(items)
    calls = [o for o in first.output if o.type == "function_call"]
    check(len(calls) == 1 and json.loads(calls[0].arguments) == {"cmd": "ls"}, f"output {first.output}")
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "a.txt"}
    if stream:
        second = ask([result], previous=first.id)
    else:
        # As agents do: every output item goes back, then the result.
        items += [o.model_dump(exclude_none=True) for o in first.output] + [result]
        second = ask(items)
    check(second.output_text == "There is one file.", f"text {second.output_text!r}")
    print("responses", "stream" if stream else "plain", "ok")


anthropic_conversation(KEYS[0], stream=False)
anthropic_conversation(KEYS[1], stream=True)
openai_conversation(KEYS[2], stream=False)
openai_conversation(KEYS[3], stream=True)
responses_conversation(KEYS[4], stream=False)
responses_conversation(KEYS[5], stream=True)
