#!/usr/bin/env python3
"""Modern (2026-07-28) MCP client peer built on mcp==2.3.0's `Client`.

Runs ONE scenario against a 2026-07-28 streamable-HTTP endpoint and prints ONE
JSON object on stdout (logs go to stderr):

  {"scenario", "ok", "result", "error", "callbacks", "progress", "rounds", ...}

Exit status: 0 when the scenario ran (protocol errors are reported in the
JSON), 2 on a harness bug.  See README.md for the scenario list and fields.

Default mode lets the SDK's automatic input_required loop do the rounds.
`--raw` drives the rounds by hand through `ClientSession.send_request`, reads
every result as the raw dict the server sent, and checks each round's shape
against the MRTR rules, listing problems under "violations".
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx2
from pydantic import TypeAdapter, ValidationError

import answers
import mcp.types as types
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

log = logging.getLogger("modern_client")

CAPABILITIES = ("elicitation", "sampling", "roots")
# Which capability each embedded request method needs.
INPUT_METHODS = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}
WIRE_METHOD = {"tool": "tools/call", "prompt": "prompts/get", "resource": "resources/read"}
MAX_ROUNDS = 10
RAW = TypeAdapter(dict[str, Any])
INPUT_REQUEST = TypeAdapter(types.InputRequest)


def scenario_table(tag: str) -> dict[str, tuple[str, str | None, dict[str, Any]]]:
    """scenario -> (kind, target name/uri, arguments)."""
    return {
        "greet": ("tool", "greet", {}),
        "two_step": ("tool", "two_step", {}),
        "elicit_then_sample": ("tool", "elicit_then_sample", {}),
        "sample_only": ("tool", "sample_only", {}),
        "list_my_roots": ("tool", "list_my_roots", {}),
        "parallel_three": ("tool", "parallel_three", {}),
        "progress_task": ("tool", "progress_task", {"steps": 3}),
        "declined": ("tool", "greet", {}),
        "confirm_delete": ("tool", "confirm_delete", {"item": "report.txt"}),
        "no_elicitation": ("tool", "greet", {}),
        "log_levels": ("tool", "log_levels", {}),
        "unique_flow": ("tool", "unique_flow", {"client_tag": tag}),
        "counter_flow": ("tool", "counter_flow", {}),
        "add": ("tool", "add", {"a": 2, "b": 3}),
        "prompt": ("prompt", "review_prompt", {"code": "x=1"}),
        "resource": ("resource", "profile://ada", {}),
        "static_resource": ("resource", "info://static", {}),
        "list_tools": ("list_tools", None, {}),
        "discover": ("discover", None, {}),
        "call": ("tool", None, {}),  # --tool/--args pick the target
    }


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json") if model is not None else None


class ScenarioError(Exception):
    """The SDK or the server failed the scenario; carries the JSON error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error["message"])
        self.error = error


def describe(exc: BaseException) -> dict[str, Any]:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return {"code": exc.code, "message": exc.message, "data": exc.data}
    if isinstance(exc, TimeoutError):
        return {"code": None, "message": "TimeoutError: scenario timed out", "data": None}
    if isinstance(exc, ValidationError):
        return {"code": None, "message": f"ValidationError: {short_errors(exc)}", "data": None}
    return {"code": None, "message": f"{type(exc).__name__}: {exc}", "data": None}


def short_errors(exc: ValidationError, limit: int = 3) -> str:
    errs = exc.errors()
    parts = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errs[:limit]]
    return f"{len(errs)} error(s): " + "; ".join(parts)


SDK_INTERRUPTED: list[bool] = []  # set when an SDK call was cancelled from below (transport died)


async def sdk(awaitable):
    """Await an SDK call, turning whatever it raises into a ScenarioError."""
    try:
        return await awaitable
    except Exception as exc:  # any failure here is the server's or the SDK's, not ours
        log.debug("SDK call failed", exc_info=exc)
        raise ScenarioError(describe(exc)) from exc
    except BaseException:
        SDK_INTERRUPTED.append(True)
        raise


# --------------------------------------------------------------------- callbacks
class Peer:
    def __init__(self, tag: str, decline: bool, roots: list[str] | None = None) -> None:
        self.tag = tag
        self.decline = decline
        # The roots this client answers with: answers.ROOTS, or the URIs given with --roots.
        self.root_list = answers.ROOTS if roots is None else [{"uri": u, "name": u.rsplit("/", 1)[-1]} for u in roots]
        self.calls = {"elicitation": 0, "sampling": 0, "roots": 0}
        self.progress: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        self.harness_errors: list[str] = []

    async def elicitation(self, context: ClientRequestContext, params: types.ElicitRequestParams):
        self.calls["elicitation"] += 1
        try:
            if self.decline:
                return types.ElicitResult(action="decline")
            schema = getattr(params, "requested_schema", None)
            return types.ElicitResult(action="accept", content=answers.elicitation_content(schema, self.tag))
        except Exception as exc:
            self.harness_errors.append(f"elicitation callback: {exc!r}")
            raise

    async def sampling(self, context: ClientRequestContext, params: types.CreateMessageRequestParams):
        self.calls["sampling"] += 1
        try:
            prompt = answers.prompt_text([dump(m) for m in params.messages])
            return types.CreateMessageResult(
                role="assistant",
                content=types.TextContent(type="text", text=answers.sampling_text(prompt)),
                model=answers.SAMPLING_MODEL,
                stop_reason=answers.SAMPLING_STOP_REASON,
            )
        except Exception as exc:
            self.harness_errors.append(f"sampling callback: {exc!r}")
            raise

    async def roots(self, context: ClientRequestContext):
        self.calls["roots"] += 1
        return types.ListRootsResult(roots=[types.Root(uri=r["uri"], name=r["name"]) for r in self.root_list])

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append({"progress": progress, "total": total, "message": message})

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(dump(params))


# ------------------------------------------------------------------ wire capture
def _loads_checking_duplicates(text: str, dupes: list[str]) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                dupes.append(key)
            seen[key] = value
        return seen

    return json.loads(text, object_pairs_hook=hook)


def _parse_body(content_type: str, text: str, dupes: list[str]) -> list[Any]:
    """JSON-RPC messages in a response body: one JSON object or SSE `data:` events."""
    if not text.strip():
        return []
    if content_type.startswith("application/json"):
        return [_loads_checking_duplicates(text, dupes)]
    messages, data = [], []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n") + [""]:
        if line == "":
            if data:
                messages.append(_loads_checking_duplicates("\n".join(data), dupes))
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return messages


class Wire:
    """httpx2 event hooks recording each POST (and, with bodies=True, each response body)."""

    KEEP_HEADERS = ("mcp-protocol-version", "mcp-method", "mcp-name", "mcp-session-id", "accept")

    def __init__(self, bodies: bool) -> None:
        self.bodies = bodies
        self.exchanges: list[dict[str, Any]] = []

    async def on_request(self, request: httpx2.Request) -> None:
        entry: dict[str, Any] = {"httpMethod": request.method, "headers": {}}
        for name in self.KEEP_HEADERS:
            if name in request.headers:
                entry["headers"][name] = request.headers[name]
        try:
            entry["body"] = json.loads(request.content) if request.content else None
        except (ValueError, httpx2.RequestNotRead):
            entry["body"] = None
        request.extensions["wire_entry"] = entry
        self.exchanges.append(entry)

    async def on_response(self, response: httpx2.Response) -> None:
        entry = response.request.extensions.get("wire_entry")
        if entry is None:
            return
        entry["status"] = response.status_code
        entry["contentType"] = response.headers.get("content-type", "")
        entry["responseSessionId"] = response.headers.get("mcp-session-id")
        # The local port of the connection the response came on (HTTP/1.1), to tell
        # whether calls shared one connection.
        stream = response.extensions.get("network_stream")
        addr = stream.get_extra_info("client_addr") if stream is not None else None
        entry["clientPort"] = addr[1] if addr else None
        if self.bodies and response.request.method == "POST":
            await response.aread()  # buffered; the SDK then reads the cached bytes
            dupes: list[str] = []
            try:
                entry["messages"] = _parse_body(entry["contentType"], response.text, dupes)
            except ValueError as exc:
                entry["messages"] = []
                entry["bodyError"] = f"unparseable body: {exc}"
                entry["rawBody"] = response.text[:4000]
            entry["duplicateKeys"] = dupes

    def requests_for(self, method: str, start: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.exchanges[start:] if (e.get("body") or {}).get("method") == method]


# ----------------------------------------------------------------- raw MRTR loop
def note(violations: list[str], text: str) -> None:
    if text not in violations:
        violations.append(text)


def wire_result(wire: Wire, start: int, method: str) -> dict[str, Any] | None:
    """The `result` object the server sent for this round's request, from the capture."""
    for entry in wire.requests_for(method, start):
        rid = (entry.get("body") or {}).get("id")
        for msg in entry.get("messages") or []:
            if isinstance(msg, dict) and msg.get("id") == rid and isinstance(msg.get("result"), dict):
                return msg["result"]
    return None


def check_input_required(raw: dict[str, Any], declared: set[str]) -> list[str]:
    problems: list[str] = []
    requests = raw.get("inputRequests")
    state = raw.get("requestState")
    if requests is None and state is None:
        problems.append("input_required result has neither inputRequests nor requestState")
    if state is not None and not isinstance(state, str):
        problems.append("requestState is not a string")
    if requests is None:
        return problems
    if not isinstance(requests, dict):
        return problems + ["inputRequests is not an object"]
    for key, req in requests.items():
        if not isinstance(req, dict):
            problems.append(f"inputRequests[{key}] is not an object")
            continue
        method = req.get("method")
        if method not in INPUT_METHODS:
            problems.append(f"inputRequests[{key}].method {method!r} is not an allowed input request method")
        elif INPUT_METHODS[method] not in declared:
            problems.append(f"inputRequests[{key}] asks {method} but the client did not declare {INPUT_METHODS[method]}")
        for banned in ("jsonrpc", "id"):
            if banned in req:
                problems.append(f"inputRequests[{key}] carries a JSON-RPC field {banned!r}")
        if method in ("elicitation/create", "sampling/createMessage") and "params" not in req:
            problems.append(f"inputRequests[{key}] ({method}) has no params")
    return problems


def build_request(kind: str, target: str, arguments: dict[str, Any], responses: Any, state: str | None):
    if kind == "tool":
        return types.CallToolRequest(
            params=types.CallToolRequestParams(
                name=target, arguments=arguments, input_responses=responses, request_state=state
            )
        )
    if kind == "prompt":
        return types.GetPromptRequest(
            params=types.GetPromptRequestParams(
                name=target, arguments=arguments, input_responses=responses, request_state=state
            )
        )
    return types.ReadResourceRequest(
        params=types.ReadResourceRequestParams(uri=target, input_responses=responses, request_state=state)
    )


FINAL_TYPE = {"tool": types.CallToolResult, "prompt": types.GetPromptResult, "resource": types.ReadResourceResult}


async def run_raw(client: Client, peer: Peer, wire: Wire, kind: str, target: str, arguments: dict[str, Any],
                  declared: set[str], out: dict[str, Any]) -> Any:
    session = client.session
    method = WIRE_METHOD[kind]
    rounds, violations = out["rounds"], out["violations"]
    responses: dict[str, Any] | None = None
    state: str | None = None
    seen_ids: list[Any] = []
    for _ in range(MAX_ROUNDS):
        start = len(wire.exchanges)
        request = build_request(kind, target, arguments, responses, state)
        try:
            raw = await session.send_request(request, RAW, progress_callback=peer.on_progress)
        except ValidationError as exc:
            # The SDK validates results against the 2026-07-28 schema before handing
            # them over; keep going with the copy captured on the wire.
            raw = wire_result(wire, start, method)
            note(violations, f"result rejected by the SDK's schema validation: {short_errors(exc)}")
            if raw is None:
                raise ScenarioError(describe(exc)) from exc
        except Exception as exc:
            raise ScenarioError(describe(exc)) from exc
        except BaseException:
            SDK_INTERRUPTED.append(True)
            raise

        # What actually went out and came back for this round.
        sent = wire.requests_for(method, start)
        if len(sent) != 1:
            note(violations, f"expected one {method} POST for this round, saw {len(sent)}")
        for entry in sent:
            params = (entry.get("body") or {}).get("params") or {}
            if params.get("requestState") != state:
                note(violations, "retry did not carry the previous requestState byte-for-byte")
            rid = (entry.get("body") or {}).get("id")
            if rid in seen_ids:
                note(violations, f"JSON-RPC id {rid!r} reused across rounds")
            seen_ids.append(rid)
            if entry.get("duplicateKeys"):
                note(violations, f"duplicate JSON keys in response: {sorted(set(entry['duplicateKeys']))}")
            if entry.get("responseSessionId"):
                note(violations, "2026-07-28 response carried an Mcp-Session-Id header")
            if entry.get("bodyError"):
                note(violations, entry["bodyError"])

        result_type = raw.get("resultType")
        requests = raw.get("inputRequests")
        record: dict[str, Any] = {"resultType": result_type}
        if isinstance(requests, dict):
            record["inputRequests"] = {
                k: {f: v[f] for f in ("method", "params") if f in v} if isinstance(v, dict) else v
                for k, v in requests.items()
            }
        if "requestState" in raw:
            record["requestStateLength"] = len(raw["requestState"]) if isinstance(raw["requestState"], str) else None
        rounds.append(record)

        if result_type != "input_required":
            if result_type is None:
                note(violations, "final result has no resultType (2026-07-28 servers MUST send it)")
            elif result_type != "complete":
                note(violations, f"unknown resultType {result_type!r}")
            try:
                return dump(FINAL_TYPE[kind].model_validate(raw))
            except ValidationError as exc:
                note(violations, f"final result does not parse as {FINAL_TYPE[kind].__name__}: {short_errors(exc)}")
                return raw

        problems = check_input_required(raw, declared)
        for problem in problems:
            note(violations, problem)
        state = raw.get("requestState")
        if not requests:
            responses = None
            await anyio.sleep(0.05)  # state-only round: retry at once (small pause)
            continue
        parsed = {}
        for key, value in requests.items():
            try:
                parsed[key] = INPUT_REQUEST.validate_python(value)
            except ValidationError as exc:
                note(violations, f"inputRequests[{key}] does not parse: {short_errors(exc)}")
        if len(parsed) != len(requests):
            return None
        responses = {}

        async def answer(key: str, req: Any) -> None:
            ctx = ClientRequestContext(session=session, request_id=key, meta=None)
            responses[key] = await session.dispatch_input_request(ctx, req)

        async with anyio.create_task_group() as tg:
            for key, req in parsed.items():
                tg.start_soon(answer, key, req)
        refused = [r for r in responses.values() if isinstance(r, types.ErrorData)]
        if refused:
            # Same as the SDK's own loop: a refused input ends the call with that error.
            raise ScenarioError({"code": refused[0].code, "message": refused[0].message, "data": refused[0].data})
    note(violations, f"still input_required after {MAX_ROUNDS} rounds")
    return None


# -------------------------------------------------------------------- scenarios
def auto_rounds(wire: Wire, method: str) -> list[dict[str, Any]]:
    """Rounds as seen on the wire when the SDK drives the loop."""
    rounds = []
    for entry in wire.requests_for(method):
        params = (entry.get("body") or {}).get("params") or {}
        state = params.get("requestState")
        rounds.append(
            {
                "status": entry.get("status"),
                "inputResponseKeys": sorted(params["inputResponses"]) if "inputResponses" in params else None,
                "requestStateLength": len(state) if isinstance(state, str) else None,
            }
        )
    return rounds


async def run_scenario(args: argparse.Namespace, out: dict[str, Any]) -> None:
    kind, target, arguments = scenario_table(args.tag)[args.scenario]
    if args.scenario == "call":
        target, arguments = args.tool, json.loads(args.args)
    declared = set() if args.scenario == "no_elicitation" else set(args.capabilities)
    roots = [u.strip() for u in args.roots.split(",") if u.strip()] if args.roots else None
    peer = Peer(args.tag, decline=args.scenario == "declined", roots=roots)
    wire = Wire(bodies=args.raw)
    out["declaredCapabilities"] = sorted(declared)
    body_done = False
    try:
        async with AsyncExitStack() as stack:
            body_done = await _scenario_body(stack, args, out, peer, wire, kind, target, arguments, declared)
    except Exception as exc:
        if not body_done and not SDK_INTERRUPTED:
            raise  # our own code failed: a harness bug
        # The transport's task group failed (e.g. a POST could not connect) and
        # cancelled the SDK call or the teardown; report it unless already explained.
        log.warning("error while closing the client: %r", exc)
        if out["error"] is None and out["result"] is None:
            out["error"] = describe(exc)
    out["callbacks"] = peer.calls
    out["progress"] = peer.progress
    out["logs"] = peer.logs
    if kind in WIRE_METHOD and not args.raw:
        out["rounds"] = auto_rounds(wire, WIRE_METHOD[kind])
    if args.raw or args.wire:
        out["http"] = wire.exchanges
    if peer.harness_errors:
        out["harness_errors"] = peer.harness_errors


async def _scenario_body(stack: AsyncExitStack, args: argparse.Namespace, out: dict[str, Any], peer: Peer,
                         wire: Wire, kind: str, target: str | None, arguments: dict[str, Any],
                         declared: set[str]) -> bool:
    """Connect and run the scenario; returns True once our own part is done (see run_scenario)."""
    http = await stack.enter_async_context(
        httpx2.AsyncClient(
            timeout=httpx2.Timeout(args.timeout),
            event_hooks={"request": [wire.on_request], "response": [wire.on_response]},
        )
    )
    # The 2.3.0 Client advertises a capability exactly when its callback is set.
    client = Client(
        streamable_http_client(args.url, http_client=http),
        mode="auto" if args.probe else "2026-07-28",
        elicitation_callback=peer.elicitation if "elicitation" in declared else None,
        sampling_callback=peer.sampling if "sampling" in declared else None,
        list_roots_callback=peer.roots if "roots" in declared else None,
        logging_callback=peer.on_log,
        log_level=args.log_level or ("debug" if args.scenario == "log_levels" else None),
        client_info=types.Implementation(name="modern-peer-client", version="1.0"),
        read_timeout_seconds=args.timeout,
        cache=None,
    )
    try:
        await sdk(stack.enter_async_context(client))
        out["protocolVersion"] = client.protocol_version
        if kind == "list_tools":
            out["result"] = dump(await sdk(client.list_tools()))
        elif kind == "discover":
            out["result"] = await discover(client, args.probe)
        elif args.raw:
            out["violations"] = []
            out["result"] = await run_raw(client, peer, wire, kind, target, arguments, declared, out)
        elif kind == "tool":
            out["result"] = dump(await sdk(client.call_tool(target, arguments, progress_callback=peer.on_progress)))
            if args.repeat_after is not None:
                # The same call again on the same client after a pause (its pooled
                # connection has been quiet that long).
                out["firstResult"] = out["result"]
                await anyio.sleep(args.repeat_after)
                out["result"] = dump(await sdk(client.call_tool(target, arguments, progress_callback=peer.on_progress)))
        elif kind == "prompt":
            out["result"] = dump(await sdk(client.get_prompt(target, arguments)))
        else:
            out["result"] = dump(await sdk(client.read_resource(target)))
    except ScenarioError as exc:
        out["error"] = exc.error
    return True


async def discover(client: Client, probed: bool) -> dict[str, Any]:
    """Send a real server/discover (mode='2026-07-28' only synthesizes one locally)."""
    raw = await sdk(client.session.send_discover("2026-07-28"))
    meta = raw.get("_meta") or {}
    return {
        "discover": raw,
        "serverInfo": meta.get("io.modelcontextprotocol/serverInfo"),
        "capabilities": raw.get("capabilities"),
        "supportedVersions": raw.get("supportedVersions"),
        # What the Client itself adopted at connect time (a synthesized stub unless --probe).
        "adopted": {
            "probed": probed,
            "protocolVersion": client.protocol_version,
            "serverInfo": dump(client.server_info),
            "serverCapabilities": dump(client.server_capabilities),
        },
    }


def parse_capabilities(text: str) -> list[str]:
    if text.strip().lower() == "none":
        return []
    caps = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in caps if c not in CAPABILITIES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown capability {bad}; choose from {CAPABILITIES} or 'none'")
    return caps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="2026-07-28 endpoint, e.g. http://127.0.0.1:PORT/mcp")
    parser.add_argument("--scenario", required=True, choices=sorted(scenario_table("t")))
    parser.add_argument("--raw", action="store_true", help="drive MRTR rounds by hand and check their shape")
    parser.add_argument("--capabilities", type=parse_capabilities, default=list(CAPABILITIES),
                        help="comma list of elicitation,sampling,roots, or 'none' (default: all three)")
    parser.add_argument("--tag", default="t", help="answer prefix for `first`/`second` (unique_flow)")
    parser.add_argument("--probe", action="store_true", help="mode='auto' (server/discover probe) instead of a pinned version")
    parser.add_argument("--tool", help="tool name for --scenario call")
    parser.add_argument("--args", default="{}", help="JSON arguments for --scenario call")
    parser.add_argument("--log-level", help="stamp io.modelcontextprotocol/logLevel on requests")
    parser.add_argument("--roots", help="comma list of root URIs to answer roots/list with (default: answers.ROOTS)")
    parser.add_argument("--repeat-after", type=float, help="tool scenarios: call again after this many seconds")
    parser.add_argument("--wire", action="store_true", help="include captured HTTP requests in the output")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request and whole-scenario limit (s)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.scenario == "call" and not args.tool:
        parser.error("--scenario call needs --tool")
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.verbose else logging.WARNING)

    out: dict[str, Any] = {"scenario": args.scenario, "ok": False, "result": None, "error": None,
                           "callbacks": {}, "progress": [], "rounds": []}

    async def bounded() -> None:
        try:
            with anyio.fail_after(args.timeout * 2):
                await run_scenario(args, out)
        except TimeoutError:
            out["error"] = out["error"] or describe(TimeoutError())

    try:
        anyio.run(bounded)
    except Exception:
        traceback.print_exc()
        return 2
    result = out["result"] if isinstance(out["result"], dict) else {}
    out["ok"] = out["error"] is None and out["result"] is not None and not result.get("isError", False) \
        and not out.get("violations")
    print(json.dumps(out), flush=True)
    return 2 if out.get("harness_errors") else 0


if __name__ == "__main__":
    sys.exit(main())
