#!/usr/bin/env python3
"""Scores a byte-game workspace: the mean credit of the main answers, 1 for
the target byte first, half credit fading over 16 bytes around it (the
built-in task's shaping, so a random byte model finds a gradient), over the
run's "turns" main calls (3 when the file does not say). Prints
{"score": x, "valid": true}; a workspace without answers.json is invalid."""

import json
import sys

TURNS = 3
WIDTH = 16


def credit(text: str, want: int) -> float:
    if not text:
        return 0.0
    b = text.encode("utf-8", "replace")[0]
    if b == want:
        return 1.0
    return max(0.0, 0.5 * (1.0 - abs(b - want) / WIDTH))


def main() -> int:
    ws = sys.argv[1] if len(sys.argv) > 1 else "."
    try:
        with open(f"{ws}/answers.json") as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        print(json.dumps({"score": 0.0, "valid": False, "detail": str(e)}))
        return 0
    want = ord("a") + int(run["query"]) % 8
    turns = int(run.get("turns", TURNS))
    score = sum(credit(a, want) for a in run["answers"][:turns]) / turns
    print(json.dumps({"score": score, "valid": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
