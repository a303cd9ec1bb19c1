#!/usr/bin/env python3
"""A plain coding agent on the official `openai` SDK, for Gyre job files.

    python3 openai_agent.py PROMPT_FILE

It knows nothing of Gyre: the SDK reads OPENAI_BASE_URL and OPENAI_API_KEY
from the environment (the gateway and this execution's key), and the agent
works in its current directory (the execution's workspace). It offers the
model three tools (write_file, read_file, run) and loops: each reply's tool
calls are executed and their results sent back; a reply without tool calls
gets one nudge, and a second one ends the run. Before the turn
AGENT_COMPACT_AT it compacts its context (a fresh conversation with a
summary, as long-horizon harnesses do), and after its first turn it asks a
sub-agent (its own system prompt) for a plan, so an execution's trajectory
tree has a main root, a compaction root and a sub-agent root.

Environment: AGENT_MODEL (default gyre-policy), AGENT_MAX_TURNS (6),
AGENT_MAX_TOKENS (256), AGENT_COMPACT_AT (3), AGENT_SUB_AGENT (1 = on).
"""

import json
import os
import subprocess
import sys

from openai import OpenAI

SYSTEM = (
    "You are a coding agent working in a repository. Use the tools to read and "
    "write files and to run commands. Finish with a short summary and no tool call."
)
TOOLS = [
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file in the workspace.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file in the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run", "description": "Run a shell command in the workspace.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
]


def inside(path):
    full = os.path.realpath(path)
    if not full.startswith(os.path.realpath(".") + os.sep):
        raise ValueError(f"{path} is outside the workspace")
    return full


def execute(name, args):
    try:
        if name == "write_file":
            with open(inside(args["path"]), "w") as f:
                f.write(args["content"])
            return "written"
        if name == "read_file":
            with open(inside(args["path"])) as f:
                return f.read()[:4000]
        if name == "run":
            p = subprocess.run(args["command"], shell=True, capture_output=True, text=True, timeout=60)
            return (p.stdout + p.stderr)[-4000:] + f"\n(exit {p.returncode})"
        return f"unknown tool {name}"
    except Exception as e:  # a tool error is the model's to read, not a crash
        return f"error: {e}"


def main():
    prompt = open(sys.argv[1]).read()
    model = os.environ.get("AGENT_MODEL", "gyre-policy")
    max_turns = int(os.environ.get("AGENT_MAX_TURNS", "6"))
    max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "256"))
    compact_at = int(os.environ.get("AGENT_COMPACT_AT", "3"))
    sub_agent = os.environ.get("AGENT_SUB_AGENT", "1") == "1"
    client = OpenAI(max_retries=2, timeout=600)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    idle, log = 0, []
    for turn in range(max_turns):
        if turn == compact_at:
            summary = "; ".join(log[-4:]) or "nothing done yet"
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"{prompt}\n\nSummary of the work so far: {summary}"}]
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           max_tokens=max_tokens)
        msg = r.choices[0].message
        calls = msg.tool_calls or []
        entry = {"role": "assistant", "content": msg.content or ""}
        if calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": c.function.arguments}} for c in calls]
        messages.append(entry)
        if turn == 0 and sub_agent:
            plan = client.chat.completions.create(model=model, max_tokens=max_tokens, messages=[
                {"role": "system", "content": "You are a planning sub-agent. Reply with a short plan."},
                {"role": "user", "content": prompt}])
            log.append("plan: " + (plan.choices[0].message.content or "")[:200])
        if not calls:
            idle += 1
            if idle == 2:
                break
            messages.append({"role": "user", "content": "Continue: use the tools to solve the task."})
            continue
        idle = 0
        for c in calls:
            try:
                args = json.loads(c.function.arguments or "{}")
            except ValueError:
                args = {}
            result = execute(c.function.name, args)
            log.append(f"{c.function.name} -> {result[:80]}")
            messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
    print(json.dumps({"turns": turn + 1, "log": log}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
