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

AGENT_TURNS (default 3) sets the number of main calls and AGENT_COMPACT_EVERY
(default 2) how many main calls a conversation holds before it is compacted:
more calls per process spread the SDK's import (most of a run's CPU time)
over more of the policy's answers. AGENT_MAX_TOKENS (default 4) bounds each
answer (only its first byte is graded; longer answers keep calls in flight
longer, so role changes find them there).

AGENT_MAX_RETRIES (default 0) is the SDK's own retry count: a harness
that must live through a restart of the head (a warm resume adopts it)
retries refused connections and 503s, with the SDK's backoff, meanwhile.
AGENT_PAUSE (seconds, default 0) is a think time before every main call
after the first, so runs last long enough to span such a restart.

AGENT_CRITIQUE_TOKENS (default 0: none) adds a critique call after every
main answer: the model reviews its answer in up to that many tokens, and
the next main call reads the review. The call carries `x-gyre-purpose:
critique`, so the gateway records it as one and its tokens never become
training targets (SPEC 3.3): long critiques keep the engines busy (calls
in flight when a cell switches) without diluting the graded answers.
"""

import hashlib
import json
import os
import sys
import time

from openai import OpenAI

TURNS = int(os.environ.get("AGENT_TURNS", "3"))
COMPACT_EVERY = max(1, int(os.environ.get("AGENT_COMPACT_EVERY", "2")))
MAX_TOKENS = int(os.environ.get("AGENT_MAX_TOKENS", "4"))
CRITIQUE_TOKENS = int(os.environ.get("AGENT_CRITIQUE_TOKENS", "0"))
MAX_RETRIES = int(os.environ.get("AGENT_MAX_RETRIES", "0"))
PAUSE = float(os.environ.get("AGENT_PAUSE", "0"))
SUB_AGENT_SHARE = 64  # of 256: about one run in four


def target(q: int) -> str:
    return chr(ord("a") + q % 8)


def ask(client: OpenAI, messages: list, max_tokens: int = MAX_TOKENS, critique: bool = False) -> str:
    headers = {"x-gyre-purpose": "critique"} if critique else None
    r = client.chat.completions.create(
        model="gyre-policy",
        messages=messages,
        max_tokens=max_tokens,
        temperature=1.0,
        extra_headers=headers,
    )
    return r.choices[0].message.content or ""


def main() -> int:
    q = int(os.environ["GYRE_QUERY"])
    client = OpenAI(max_retries=MAX_RETRIES, timeout=300)
    want = target(q)
    messages = [{"role": "user", "content": f"task {q}"}]
    answers, hits = [], 0
    draw = hashlib.sha256(os.environ.get("GYRE_EXECUTION", "").encode()).digest()[0]
    for turn in range(TURNS):
        if turn > 0 and PAUSE > 0:
            time.sleep(PAUSE)
        if turn > 0 and turn % COMPACT_EVERY == 0:
            messages = [
                {"role": "user", "content": f"task {q}"},
                {"role": "user", "content": f"summary: {hits} of {turn}"},
            ]
        text = ask(client, messages)
        answers.append(text)
        hit = text[:1] == want
        hits += hit
        messages.append({"role": "assistant", "content": text})
        verdict = "ok" if hit else "retry"
        if CRITIQUE_TOKENS > 0:
            review = messages + [{"role": "user", "content": "critique"}]
            note = ask(client, review, CRITIQUE_TOKENS, critique=True)
            verdict = f"{verdict}; critique: {note}"
        messages.append({"role": "user", "content": verdict})
        if turn == 0 and draw < SUB_AGENT_SHARE:
            ask(client, [{"role": "system", "content": "helper"}, {"role": "user", "content": f"task {q}"}])
    with open("answers.json", "w") as f:
        json.dump({"query": q, "turns": TURNS, "answers": answers}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
