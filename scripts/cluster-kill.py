#!/usr/bin/env python3
"""kill -9 of one node agent in the middle of `gyre train --tiny --cluster
local`, and how the run recovered: from the kill to the node back in the
run (its restarted agent rebuilt, the scheduler told), to the next update
published, and the updates made again by a restored core.

usage: scripts/cluster-kill.py GYRE [RUNS] [head [EVERY]]   (e.g.
target/release/gyre 3; `head` runs only the head's rows, EVERY sets the
checkpoints' period for them, 2 by default)

Each run trains 40 steps with checkpoints every 2 updates, waits for 3
updates, then kills node 11 (cell 1: serving or a satellite), node 5 (the
pool) or node 10 (cell 0, the core). Killing the head ends the run's
control; the script starts a new head at once with `--resume` and times
the kill to the new head's first update, the updates made again, and the
update the checkpoint held, twice: with agents that exit with their head
(`--agent-wait-s 0`, every process started again) and with agents that
wait for the new head, which adopts them (the default). In both, the
core's agent leaves its state on disk when it finds its head gone (the
core's last word), and the resume starts from it when it can: the
"role" column says from which version and whether the word was taken.
Times are
wall-clock seconds from the head's log; real time is not reproducible, so
read medians.
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def stamp(line):
    t = line.split()[0].rstrip("Z")
    return datetime.fromisoformat(t[:26]).timestamp()


def fresh_config(ckdir, every=2):
    """A config checkpointing every `every` updates into an emptied `ckdir`."""
    cfg = os.path.join(ckdir, "ck.toml")
    with open(cfg, "w") as f:
        f.write(f'[checkpoint]\nevery = {every}\ndir = "{ckdir}"\n')
    for name in os.listdir(ckdir):
        if name.endswith(".ckpt") or name in ("run.jsonl", "agents.json", "core.last.json"):
            os.remove(os.path.join(ckdir, name))
    return cfg


def one(gyre, victim, ckdir):
    cfg = fresh_config(ckdir)
    env = dict(os.environ, RUST_LOG="info")
    head = subprocess.Popen(
        [gyre, "train", "--tiny", "--steps", "40", "--cluster", "local",
         "--config", cfg, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    pids, updates, lines = {}, 0, []
    killed_at = None
    for raw in head.stderr:
        line = ANSI.sub("", raw)
        lines.append(line)
        m = re.search(r"node agent started node=(\d+) pid=(\d+)", line)
        if m and m.group(1) not in pids:
            pids[m.group(1)] = int(m.group(2))
        updates += "update published" in line
        if killed_at is None and updates >= 3 and len(pids) == 3:
            os.kill(pids[victim], signal.SIGKILL)
            killed_at = time.time()
    out = head.stdout.read()
    head.wait()
    report = json.loads(out)
    loss = report["node_losses"][0]
    mark = {"11": "node lost engine=cell1 ", "5": "node lost engine=pool ",
            "10": "the core's node lost "}[victim]
    role = next((m.group(1) for l in lines if mark in l
                 for m in [re.search(r"role=(Some\((\w+)\)|None)", l)] if m), "-")
    role = role.replace("Some(", "").rstrip(")")
    after = [stamp(l) for l in lines if "update published" in l and stamp(l) > killed_at]
    back = loss["back_at_secs"] - loss["at_secs"] if loss["back_at_secs"] else None
    return {
        "role": role,
        "back": back,
        "next_update": after[0] - killed_at if after else None,
        "redone": report["redone_updates"],
        "steps": report["steps"],
    }


def drain(stream):
    """Reads `stream` to its end on a thread: the killed head's node agents
    inherited its stderr and go on writing to it while they wait."""
    import threading
    t = threading.Thread(target=lambda: [None for _ in stream], daemon=True)
    t.start()


def head_one(gyre, ckdir, wait, every):
    """kill -9 of the head after 3 updates, then `--resume` at once."""
    cfg = fresh_config(ckdir, every)
    env = dict(os.environ, RUST_LOG="info")
    argv = [gyre, "train", "--tiny", "--steps", "40", "--cluster", "local",
            "--config", cfg, "--json", "--agent-wait-s", wait]
    head = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True)
    updates, agents = 0, 0
    for raw in head.stderr:
        line = ANSI.sub("", raw)
        agents += "node agent started" in line
        updates += "update published" in line
        if updates >= 3 and agents >= 3:
            head.kill()
            killed_at = time.time()
            break
    head.wait()
    drain(head.stderr)
    resumed = subprocess.Popen(argv + ["--resume"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, text=True)
    first, new = None, None
    lines = []
    for raw in resumed.stderr:
        line = ANSI.sub("", raw)
        lines.append(line)
        if "update published" in line:
            if first is None:
                first = stamp(line) - killed_at
            m = re.search(r"version=(\d+)", line)
            if new is None and m and int(m.group(1)) > updates:
                new = stamp(line) - killed_at
    out = resumed.stdout.read()
    if resumed.wait() != 0:
        sys.exit("the resumed head failed:\n" + "".join(lines[-30:]))
    report = json.loads(out)
    adopted = report["resumed"].get("agents_adopted", 0)
    word = report["resumed"].get("core_last_word")
    said = ("no word" if word is None else
            "word taken" if word["taken"] else f"word refused: {word['why']}")
    return {
        "role": f"resumed from v{report['resumed']['from_version']} ({said}), "
                f"{adopted} agents adopted",
        "back": None,
        "next_update": first,
        "new_version": new,
        "redone": report["redone_updates"],
        "steps": report["steps"],
    }


def main():
    gyre = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory() as ckdir:
        victims = [("11", "cell 1"), ("5", "pool"), ("10", "cell 0 (core)")]
        every = 2
        if sys.argv[3:4] == ["head"]:
            victims = []
            every = int(sys.argv[4]) if len(sys.argv) > 4 else 2
        else:
            print("| killed | run | role at loss | node back after (s) | next update after (s) | updates redone | steps |")
            print("|---|---|---|---|---|---|---|")
        for victim, what in victims:
            backs, nexts = [], []
            for r in range(runs):
                o = one(gyre, victim, ckdir)
                backs.append(o["back"])
                nexts.append(o["next_update"])
                fmt = lambda x: "-" if x is None else f"{x:.3f}"
                print(f"| {what} | {r + 1} | {o['role']} | {fmt(o['back'])} | "
                      f"{fmt(o['next_update'])} | {o['redone']} | {o['steps']} |")
            ok = [b for b in backs if b is not None]
            nx = [n for n in nexts if n is not None]
            if ok and nx:
                print(f"| {what} | median | | {statistics.median(ok):.3f} | "
                      f"{statistics.median(nx):.3f} | | |")
        # The head's rows: "next update" is the resumed run's first
        # (perhaps a version made again), "new version" its first past
        # what the lost head had published.
        print()
        print("| killed | run | resumed | next update after (s) | new version after (s) | updates redone | steps |")
        print("|---|---|---|---|---|---|---|")
        for wait, what in [("0", "head, agents exit"), ("60", "head, agents adopted")][::-1]:
            nexts, news, redone = [], [], []
            for r in range(runs):
                o = head_one(gyre, ckdir, wait, every)
                nexts.append(o["next_update"])
                news.append(o["new_version"])
                redone.append(o["redone"])
                fmt = lambda x: "-" if x is None else f"{x:.3f}"
                print(f"| {what} | {r + 1} | {o['role']} | {fmt(o['next_update'])} | "
                      f"{fmt(o['new_version'])} | {o['redone']} | {o['steps']} |")
            nx = [n for n in nexts if n is not None]
            nw = [n for n in news if n is not None]
            if nx and nw:
                print(f"| {what} | median | | {statistics.median(nx):.3f} | "
                      f"{statistics.median(nw):.3f} | {statistics.median(redone)} | |")


if __name__ == "__main__":
    main()
