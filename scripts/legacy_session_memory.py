"""What an idle legacy session costs the Python SDK's FastMCP 1.x server.

Starts the test suite's legacy peer (tests/peers/legacy_server.py, streamable HTTP), opens
20 sessions to warm it up, then N more, each as the gateway opens one (`initialize`, its
`notifications/initialized`, and the standalone GET stream, kept open), and prints the
server's resident memory before and after the N: the cost the gateway's idle pool
(`pool.max_idle`) puts on such a server, per session it keeps. With `--no-get-stream` the
sessions open no GET stream.

Run through scripts/legacy-session-memory.sh, which installs the peer first.
"""

from __future__ import annotations

import http.client
import json
import resource
import subprocess
import sys
import time

WARM_UP = 20
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "legacy-session-memory", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def vm_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def post(port: int, body: dict, session: str | None = None) -> str | None:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if session:
        headers["mcp-session-id"] = session
        headers["mcp-protocol-version"] = INIT["params"]["protocolVersion"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/mcp", json.dumps(body), headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status >= 300:
            raise RuntimeError(f"{body.get('method')}: HTTP {resp.status}")
        return resp.getheader("mcp-session-id")
    finally:
        conn.close()


def open_session(port: int, get_stream: bool) -> http.client.HTTPResponse | None:
    """Opens a session; returns its GET stream's response (its socket kept open) if asked for."""
    session = post(port, INIT)
    if not session:
        raise RuntimeError("initialize answered without a session id")
    post(port, INITIALIZED, session)
    if not get_stream:
        return None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(
        "GET",
        "/mcp",
        headers={
            "accept": "text/event-stream",
            "mcp-session-id": session,
            "mcp-protocol-version": INIT["params"]["protocolVersion"],
        },
    )
    resp = conn.getresponse()  # the head only: the stream stays open
    if resp.status != 200:
        raise RuntimeError(f"GET stream: HTTP {resp.status}")
    return resp


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    get_stream = "--no-get-stream" not in sys.argv[1:]
    n = int(args[0]) if args else 1024
    # Each GET stream is a socket here and one in the server.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * (n + WARM_UP) + 256
    if hard != resource.RLIM_INFINITY and hard < want:
        raise SystemExit(f"needs {want} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    streams = []
    server = subprocess.Popen(
        [sys.executable, "tests/peers/legacy_server.py", "--port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = server.stdout.readline()  # "LISTENING <port>"
        port = int(line.split()[1])
        for _ in range(WARM_UP):
            streams.append(open_session(port, get_stream))
        time.sleep(1)
        before = vm_rss_kb(server.pid)
        for _ in range(n):
            streams.append(open_session(port, get_stream))
        time.sleep(2)
        after = vm_rss_kb(server.pid)
        what = "with a GET stream each" if get_stream else "without GET streams"
        print(
            f"FastMCP 1.x legacy server: {n} idle sessions opened ({what}); VmRSS {before} -> "
            f"{after} kB; {(after - before) * 1024 / n:.0f} bytes per idle session"
        )
    finally:
        for stream in streams:
            if stream is not None:
                stream.close()
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
