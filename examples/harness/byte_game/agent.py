#!/usr/bin/env python3
"""The byte game, played by an external harness through Gyre's gateway.

An ordinary OpenAI-SDK agent: it knows nothing of Gyre beyond the
OPENAI_BASE_URL / OPENAI_API_KEY it is given (plus GYRE_QUERY, its task).
Task q asks every main answer to start with the byte 'a' + q mod 8. The
agent makes three main calls in one conversation (each reply goes back in
the history, then "ok" or "retry"), compacts its context before the third
(a fresh conversation with a summary: a new root of the trajectory tree),
and now and then asks a sub-agent (its own system prompt, its own root).
It writes what it answered to answers.json in its workspace (its working
directory); grade.py scores that file.
"""

import hashlib
import json
import os
import sys

from openai import OpenAI

TURNS = 3
COMPACT_BEFORE = 2
SUB_AGENT_SHARE = 64  # of 256: about one run in four


def target(q: int) -> str:
    return chr(ord("a") + q % 8)


def ask(client: OpenAI, messages: list) -> str:
    r = client.chat.completions.create(
        model="gyre-policy", messages=messages, max_tokens=4, temperature=1.0
    )
    return r.choices[0].message.content or ""


def main() -> int:
    q = int(os.environ["GYRE_QUERY"])
    client = OpenAI(max_retries=0, timeout=300)
    want = target(q)
    messages = [{"role": "user", "content": f"task {q}"}]
    answers, hits = [], 0
    draw = hashlib.sha256(os.environ.get("GYRE_EXECUTION", "").encode()).digest()[0]
    for turn in range(TURNS):
        if turn == COMPACT_BEFORE:
            messages = [
                {"role": "user", "content": f"task {q}"},
                {"role": "user", "content": f"summary: {hits} of {turn}"},
            ]
        text = ask(client, messages)
        answers.append(text)
        hit = text[:1] == want
        hits += hit
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "ok" if hit else "retry"})
        if turn == 0 and draw < SUB_AGENT_SHARE:
            ask(client, [{"role": "system", "content": "helper"}, {"role": "user", "content": f"task {q}"}])
    with open("answers.json", "w") as f:
        json.dump({"query": q, "answers": answers}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
