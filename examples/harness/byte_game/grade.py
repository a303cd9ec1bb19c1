#!/usr/bin/env python3
"""Scores a byte-game workspace: the mean credit of the main answers, 1 for
the target byte first, half credit fading over 16 bytes around it (the
built-in task's shaping, so a random byte model finds a gradient), over the
run's "turns" main calls (3 when the file does not say). Prints
{"score": x, "valid": true}; a workspace without answers.json is invalid.

`grade.py WORKSPACE --every-byte` credits every byte of an answer (its
mean), not only the first: the task becomes "answer with the target byte
throughout". Long answers then keep calls in flight long enough for role
changes to find them (KV migration, resumed attempts) while every sampled
token carries the reward's signal, where first-byte grading leaves the
other tokens to dilute it."""

import json
import sys

TURNS = 3
WIDTH = 16


def byte_credit(b: int, want: int) -> float:
    if b == want:
        return 1.0
    return max(0.0, 0.5 * (1.0 - abs(b - want) / WIDTH))


def credit(text: str, want: int, every_byte: bool) -> float:
    data = text.encode("utf-8", "replace")
    if not data:
        return 0.0
    if not every_byte:
        return byte_credit(data[0], want)
    return sum(byte_credit(b, want) for b in data) / len(data)


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--every-byte"]
    every_byte = "--every-byte" in sys.argv[1:]
    ws = args[0] if args else "."
    try:
        with open(f"{ws}/answers.json") as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        print(json.dumps({"score": 0.0, "valid": False, "detail": str(e)}))
        return 0
    want = ord("a") + int(run["query"]) % 8
    turns = int(run.get("turns", TURNS))
    score = sum(credit(a, want, every_byte) for a in run["answers"][:turns]) / turns
    print(json.dumps({"score": score, "valid": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
