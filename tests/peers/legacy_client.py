#!/usr/bin/env python3
"""Legacy MCP client (mcp==1.30.0 ClientSession over streamable HTTP).

Initializes, calls one tool (or gets one prompt / reads one resource / lists the tools) while
answering elicitation / sampling / roots requests with the same deterministic
answers as modern_client.py, and prints exactly one JSON object on stdout:

    {"ok": bool, "result": {...} | null, "error": {...} | null,
     "callbacks": {"elicitation": n, "sampling": n, "roots": n},
     "asked": [{"method": ..., "params": {...}}, ...],
     "progress": [...], "logs": [...], "notifications": [method, ...],
     "protocolVersion": "...", "serverCapabilities": {...}}

Exit 0 when the call ran (even if it failed at the protocol level), 2 on a harness bug.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from datetime import timedelta
from typing import Any

import anyio

import answers
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

log = logging.getLogger("legacy_client")


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json") if model is not None else None


def unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class Peer:
    """Callbacks plus the record of what they saw."""

    def __init__(self, tag: str, decline: bool) -> None:
        self.tag = tag
        self.decline = decline
        self.calls = {"elicitation": 0, "sampling": 0, "roots": 0}
        # The params of every elicitation and sampling request, as received.
        self.asked: list[dict[str, Any]] = []
        self.progress: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.notifications: list[str] = []
        self.harness_errors: list[str] = []

    async def elicitation(self, context, params: types.ElicitRequestParams):
        self.calls["elicitation"] += 1
        self.asked.append({"method": "elicitation/create", "params": dump(params)})
        try:
            if self.decline:
                return types.ElicitResult(action="decline")
            schema = getattr(params, "requestedSchema", None)
            return types.ElicitResult(action="accept", content=answers.elicitation_content(schema, self.tag))
        except Exception as exc:  # a bug here is ours, not the server's
            self.harness_errors.append(f"elicitation callback: {exc!r}")
            raise

    async def sampling(self, context, params: types.CreateMessageRequestParams):
        self.calls["sampling"] += 1
        self.asked.append({"method": "sampling/createMessage", "params": dump(params)})
        try:
            prompt = answers.prompt_text([dump(m) for m in params.messages])
            return types.CreateMessageResult(
                role="assistant",
                content=types.TextContent(type="text", text=answers.sampling_text(prompt)),
                model=answers.SAMPLING_MODEL,
                stopReason=answers.SAMPLING_STOP_REASON,
            )
        except Exception as exc:
            self.harness_errors.append(f"sampling callback: {exc!r}")
            raise

    async def roots(self, context):
        self.calls["roots"] += 1
        return types.ListRootsResult(roots=[types.Root(uri=r["uri"], name=r["name"]) for r in answers.ROOTS])

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append({"progress": progress, "total": total, "message": message})

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(dump(params))

    async def on_message(self, message: Any) -> None:
        # Everything but progress/log (those have their own records), e.g. tools/list_changed.
        if isinstance(message, types.ServerNotification):
            method = message.root.method
            if method not in ("notifications/progress", "notifications/message"):
                self.notifications.append(method)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    peer = Peer(args.tag, args.decline)
    arguments = json.loads(args.args)  # bad JSON here is a harness bug (exit 2)
    out: dict[str, Any] = {"ok": False, "result": None, "error": None}
    try:
        async with streamable_http_client(args.url) as (read, write, _get_session_id):
            async with ClientSession(
                read,
                write,
                read_timeout_seconds=timedelta(seconds=args.timeout),
                sampling_callback=peer.sampling,
                elicitation_callback=peer.elicitation,
                list_roots_callback=peer.roots,
                logging_callback=peer.on_log,
                message_handler=peer.on_message,
                client_info=types.Implementation(name="legacy-peer-client", version="1.0"),
            ) as session:
                init = await session.initialize()
                out["protocolVersion"] = init.protocolVersion
                out["serverCapabilities"] = dump(init.capabilities)
                if args.list_tools:
                    result = await session.list_tools()
                elif args.prompt:
                    result = await session.get_prompt(args.prompt, arguments)
                elif args.resource:
                    result = await session.read_resource(args.resource)
                else:
                    result = await session.call_tool(args.tool, arguments, progress_callback=peer.on_progress)
                out["result"] = dump(result)
                out["ok"] = not getattr(result, "isError", False)
                if args.linger:
                    await anyio.sleep(args.linger)  # let late notifications arrive
    except Exception as exc:
        exc = unwrap(exc)
        if isinstance(exc, McpError):
            out["error"] = {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data}
        else:
            log.debug("call failed", exc_info=exc)
            out["error"] = {"code": None, "message": f"{type(exc).__name__}: {exc}", "data": None}
    out["callbacks"] = peer.calls
    out["asked"] = peer.asked
    out["progress"] = peer.progress
    out["logs"] = peer.logs
    out["notifications"] = peer.notifications
    if peer.harness_errors:
        out["harness_errors"] = peer.harness_errors
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description="Call one tool on a legacy MCP server.")
    parser.add_argument("--url", required=True, help="streamable HTTP endpoint, e.g. http://127.0.0.1:PORT/mcp")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--tool", help="tool to call")
    target.add_argument("--prompt", help="prompt to get instead of calling a tool")
    target.add_argument("--resource", help="resource URI to read instead of calling a tool")
    target.add_argument("--list-tools", action="store_true", help="list the tools instead of calling one")
    parser.add_argument("--args", default="{}", help="tool/prompt arguments as a JSON object")
    parser.add_argument("--tag", default="t", help="answer prefix for `first`/`second` fields")
    parser.add_argument("--decline", action="store_true", help="decline every elicitation")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay connected after the call")
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    try:
        out = anyio.run(run, args)
    except Exception:
        traceback.print_exc()
        return 2
    print(json.dumps(out), flush=True)
    return 2 if out.get("harness_errors") else 0


if __name__ == "__main__":
    sys.exit(main())
