#!/usr/bin/env python3
"""Head loss with the gateway in front, measured: issue 14's recovery time.

Runs `gyre train --tiny --cluster local` with the byte game's agent behind
the gateway and `[checkpoint] every = 1`, kills the head (kill -9) once
KILL_AT updates are journaled and harness processes are running, starts
the same command with `--resume` at once, and times from the kill to the
resumed run's first journaled update. Prints one line per run and the
medians; the steady step time of the killed run (between its journaled
updates) is printed beside it for scale.

With --warm, each run is made twice with slower harnesses (8 calls, a
second of think time before each, 40 SDK retries) killed a second after
two harnesses began since the KILL_AT-th update: once resumed on the gateway's own address, so the
resumed head adopts the groups whose harnesses still run (a warm resume),
and once resumed on another address, so it kills them and starts their
groups again (the cold resume, for comparison). Printed per run: the time
from the kill to the first resumed update and to the resumed run's end,
what was adopted (groups, running harnesses, recorded calls kept) and how
many harness processes were killed.

usage: scripts/head_recovery.py [RUNS] [GYRE] [--warm]   (defaults: 3, target/release/gyre)
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM = "--warm" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--warm"]
RUNS = int(ARGS[0]) if len(ARGS) > 0 else 3
GYRE = ARGS[1] if len(ARGS) > 1 else os.path.join(REPO, "target/release/gyre")
SLOW = {"AGENT_TURNS": "8", "AGENT_PAUSE": "1", "AGENT_MAX_RETRIES": "40"}
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


def leaders(tag):
    """Process ids of the run's harness process-group leaders."""
    want = f"GYRE_RUN={tag}".encode()
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0") and os.getpgid(int(pid)) == int(pid):
                    found.add(pid)
        except OSError:
            pass
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(i, mode=None):
    """One killed and resumed run; `mode` None (the original agent) or,
    with the slower agent, "warm" (resumed on the same address) or "cold"
    (resumed on another)."""
    d = tempfile.mkdtemp(prefix="gyre-head-recovery-")
    ck = os.path.join(d, "ck")
    os.makedirs(ck)
    cfg = os.path.join(d, "ck.toml")
    with open(cfg, "w") as f:
        f.write(f'[checkpoint]\nevery = 1\ndir = "{ck}"\n')
    args = [GYRE, "train", "--tiny", "--steps", str(STEPS), "--seed", str(i + 1),
            "--cluster", "local", "--json", "--config", cfg,
            "--gateway-listen", f"127.0.0.1:{free_port()}" if mode else "127.0.0.1:0",
            "--harness-cmd", f"python3 {AGENT}",
            "--evaluator-cmd", f"python3 {GRADER} {{workspace}}",
            "--run-dir", os.path.join(d, "runs"),
            "--gateway-store", os.path.join(d, "store")]
    env = dict(os.environ, RUST_LOG="warn", **(SLOW if mode else {}))
    journal = os.path.join(ck, "run.jsonl")
    tag = os.path.realpath(ck)
    head = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen, stamps = 0, []
    ready_at, before = None, None
    while True:
        n = updates(journal)
        if n > seen:
            stamps.append(time.monotonic())
            seen = n
        if mode is None and seen >= KILL_AT and of_run(tag) > 0:
            break
        if mode and seen >= KILL_AT:
            # A second after two harnesses began since that update: they
            # are early in their calls.
            if before is None:
                before = leaders(tag)
            if ready_at is None and len(leaders(tag) - before) >= 2:
                ready_at = time.monotonic() + 1.0
            if ready_at is not None and time.monotonic() >= ready_at:
                break
        if head.poll() is not None:
            raise SystemExit(f"run {i}: the head ended before it was killed")
        time.sleep(0.02)
    os.kill(head.pid, signal.SIGKILL)
    killed = time.monotonic()
    head.wait()
    step = statistics.median(b - a for a, b in zip(stamps, stamps[1:])) if len(stamps) > 1 else float("nan")
    if mode == "cold":
        args[args.index("--gateway-listen") + 1] = "127.0.0.1:0"
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
    ended = time.monotonic() - killed
    if resumed.returncode != 0:
        raise SystemExit(f"run {i}: the resume failed:\n{err}")
    r = json.loads(out)
    res = r["resumed"]
    row = {
        "mode": mode or "default",
        "kill_to_first_update_s": first,
        "kill_to_end_s": ended,
        "step_s": step,
        "journaled": seen,
        "from_version": res["from_version"],
        "redone": r["redone_updates"],
        "harnesses_killed": res["harnesses_killed"],
        "adopted": res.get("adopted"),
        "executions": r["gateway"]["task"]["executions"],
        "versions_ok": [u["version"] for u in r["updates"]] == list(range(1, STEPS + 1)),
    }
    subprocess.run(["rm", "-rf", d])
    return row


def report(rows, label):
    med = lambda k: statistics.median(r[k] for r in rows)
    adopted = lambda k: statistics.median((r["adopted"] or {}).get(k, 0) for r in rows)
    print(f"{label}median over {len(rows)}: kill -> first resumed update {med('kill_to_first_update_s'):.1f} s, "
          f"-> resumed run's end {med('kill_to_end_s'):.1f} s (a step {med('step_s'):.1f} s), "
          f"updates redone {med('redone')}, harness processes killed {med('harnesses_killed')}, "
          f"adopted groups {adopted('groups')} / running harnesses {adopted('running')} / "
          f"recorded calls kept {adopted('records')}, executions begun by the resume {med('executions')}, "
          f"histories 1..={STEPS}: {all(r['versions_ok'] for r in rows)}")


if WARM:
    by_mode = {"warm": [], "cold": []}
    for i in range(RUNS):
        for mode in by_mode:
            row = one(i, mode)
            by_mode[mode].append(row)
            print(json.dumps(row), flush=True)
    for mode, rows in by_mode.items():
        report(rows, f"{mode}: ")
else:
    rows = []
    for i in range(RUNS):
        row = one(i)
        rows.append(row)
        print(json.dumps(row), flush=True)
    report(rows, "")
