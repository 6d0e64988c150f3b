#!/usr/bin/env python3
"""A deliberately faulty stdio MCP server (standard library only) for the gateway's tests.

It speaks just enough newline-delimited JSON-RPC: `initialize`, notifications (ignored),
`tools/list`, and `tools/call` of its one tool, `work`, which answers "ok from pid N".

    stdio_faults.py --mode crash|hang|garbage|huge --state-dir DIR [--huge-bytes N]

Every process started with the same --state-dir shares a call counter there; only the
first `tools/call` of all of them misbehaves, so the next call (on a fresh process) works:

    crash    exit with status 1 without answering
    hang     ignore SIGTERM, stop reading stdin and never answer (only SIGKILL ends it)
    garbage  write a line that is not JSON
    huge     write one JSON line of --huge-bytes bytes (default 65536)

Each process appends its pid to DIR/pids when it starts; the tests check those processes
are gone afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

SUPPORTED = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def first_call(state_dir: str) -> bool:
    """Counts this call; true for the very first one across processes."""
    path = os.path.join(state_dir, "calls")
    with open(path, "a+", encoding="utf-8") as fh:
        fh.seek(0)
        seen = len(fh.read().splitlines())
        fh.write(f"{os.getpid()}\n")
    return seen == 0


def misbehave(mode: str, huge_bytes: int) -> None:
    if mode == "crash":
        sys.stderr.write("stdio_faults: crashing on purpose\n")
        sys.stderr.flush()
        os._exit(1)
    if mode == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.stderr.write("stdio_faults: hanging on purpose\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)
    if mode == "garbage":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
        # Then behave as if nothing happened; the gateway must not wait for more.
        while True:
            time.sleep(3600)
    if mode == "huge":
        padding = "x" * huge_bytes
        send({"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": "info", "data": padding}})
        while True:
            time.sleep(3600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["crash", "hang", "garbage", "huge"], required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--huge-bytes", type=int, default=65536)
    args = parser.parse_args()
    with open(os.path.join(args.state_dir, "pids"), "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()}\n")

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        method = msg.get("method")
        if "id" not in msg or method is None:
            continue  # a notification or a response: nothing to answer
        rid = msg["id"]
        if method == "initialize":
            asked = msg.get("params", {}).get("protocolVersion")
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": asked if asked in SUPPORTED else SUPPORTED[0],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "stdio-faults", "version": "1"},
            }})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [
                {"name": "work", "inputSchema": {"type": "object"}}]}})
        elif method == "tools/call":
            if first_call(args.state_dir):
                misbehave(args.mode, args.huge_bytes)
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [{"type": "text", "text": f"ok from pid {os.getpid()}"}]}})
        else:
            send({"jsonrpc": "2.0", "id": rid,
                  "error": {"code": -32601, "message": f"method not found: {method}"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
