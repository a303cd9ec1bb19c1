#!/usr/bin/env python3
"""Head loss with the gateway in front, measured: issue 14's recovery time.

Runs `gyre train --tiny --cluster local` with the byte game's agent behind
the gateway and `[checkpoint] every = 1`, kills the head (kill -9) once
KILL_AT updates are journaled and harness processes are running, starts
the same command with `--resume` at once, and times from the kill to the
resumed run's first journaled update. Prints one line per run and the
medians; the steady step time of the killed run (between its journaled
updates) is printed beside it for scale.

usage: scripts/head_recovery.py [RUNS] [GYRE]   (defaults: 3, target/release/gyre)
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
GYRE = sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "target/release/gyre")
STEPS, KILL_AT = 8, 3
AGENT = os.path.join(REPO, "examples/harness/byte_game/agent.py")
GRADER = os.path.join(REPO, "examples/harness/byte_game/grade.py")


def of_run(tag):
    """Processes whose environment names the run (GYRE_RUN=tag)."""
    want = f"GYRE_RUN={tag}".encode()
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                n += want in f.read().split(b"\0")
        except OSError:
            pass
    return n


def updates(journal):
    """How many updates the journal holds."""
    try:
        with open(journal) as f:
            return sum('"kind":"update"' in line for line in f)
    except OSError:
        return 0


def one(i):
    d = tempfile.mkdtemp(prefix="gyre-head-recovery-")
    ck = os.path.join(d, "ck")
    os.makedirs(ck)
    cfg = os.path.join(d, "ck.toml")
    with open(cfg, "w") as f:
        f.write(f'[checkpoint]\nevery = 1\ndir = "{ck}"\n')
    args = [GYRE, "train", "--tiny", "--steps", str(STEPS), "--seed", str(i + 1),
            "--cluster", "local", "--json", "--config", cfg,
            "--gateway-listen", "127.0.0.1:0",
            "--harness-cmd", f"python3 {AGENT}",
            "--evaluator-cmd", f"python3 {GRADER} {{workspace}}",
            "--run-dir", os.path.join(d, "runs"),
            "--gateway-store", os.path.join(d, "store")]
    env = dict(os.environ, RUST_LOG="warn")
    journal = os.path.join(ck, "run.jsonl")
    tag = os.path.realpath(ck)
    head = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen, stamps = 0, []
    while not (seen >= KILL_AT and of_run(tag) > 0):
        n = updates(journal)
        if n > seen:
            stamps.append(time.monotonic())
            seen = n
        if head.poll() is not None:
            raise SystemExit(f"run {i}: the head ended before it was killed")
        time.sleep(0.02)
    os.kill(head.pid, signal.SIGKILL)
    killed = time.monotonic()
    head.wait()
    step = statistics.median(b - a for a, b in zip(stamps, stamps[1:])) if len(stamps) > 1 else float("nan")
    resumed = subprocess.Popen(args + ["--resume"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    first = None
    while first is None:
        if updates(journal) > seen:
            first = time.monotonic() - killed
        elif resumed.poll() is not None:
            break
        time.sleep(0.02)
    out, err = resumed.communicate()
    if resumed.returncode != 0:
        raise SystemExit(f"run {i}: the resume failed:\n{err}")
    r = json.loads(out)
    res = r["resumed"]
    row = {
        "kill_to_first_update_s": first,
        "step_s": step,
        "journaled": seen,
        "from_version": res["from_version"],
        "redone": r["redone_updates"],
        "harnesses_killed": res["harnesses_killed"],
        "versions_ok": [u["version"] for u in r["updates"]] == list(range(1, STEPS + 1)),
    }
    subprocess.run(["rm", "-rf", d])
    return row


rows = []
for i in range(RUNS):
    row = one(i)
    rows.append(row)
    print(json.dumps(row), flush=True)
med = lambda k: statistics.median(r[k] for r in rows)
print(f"median over {RUNS}: kill -> first resumed update {med('kill_to_first_update_s'):.1f} s "
      f"(a step {med('step_s'):.1f} s), updates redone {med('redone')}, "
      f"harness processes killed {med('harnesses_killed')}, "
      f"histories 1..={STEPS}: {all(r['versions_ok'] for r in rows)}")
