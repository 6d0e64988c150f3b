#!/usr/bin/env python3
"""Tasks-extension (io.modelcontextprotocol/tasks, SEP-2663) client peer on mcp==2.3.0.

mcp 2.3.0 ships no ready-made Tasks client, but it ships the extension API the
extension is meant to be built on, and this peer uses only that:
`Client(extensions=[...])` with a `ClientExtension` whose `ResultClaim` claims
`resultType: "task"` on `tools/call`; `Client.call_tool` hands the claimed
result to the claim's resolver, which polls `tasks/get` and answers questions
with `tasks/update`, both sent through `ClientSession.send_request` as typed
`Request` subclasses whose `name_param` makes the SDK set `Mcp-Name` to the
task id. Embedded input requests go through `ClientSession.dispatch_input_request`,
i.e. the client's own elicitation callback. The SDK stamps the `_meta`
envelope (with the extension in the capability ad) and the 2026-07-28 headers.

Calls ONE tool (`--tool`, `--args`) against a 2026-07-28 endpoint and prints ONE
JSON object on stdout (logs go to stderr):

  {"ok", "error", "created", "statuses", "inputRequestKeys", "questions",
   "updates", "result", "callbacks", "http"}

`created` is the task-creation result as the server sent it, `statuses` the
task statuses seen in order (consecutive repeats folded), `inputRequestKeys`
and `questions` the keys and messages of the questions answered, `updates` the
`tasks/update` results, `result` the final `CallToolResult`, and `http` the
method, status and MCP headers of every POST. Exit status: 0 when the call ran
(protocol errors are reported in the JSON), 2 on a harness bug.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from typing import Any, Literal

import anyio
import httpx2
from pydantic import TypeAdapter

import answers
import mcp.types as types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from modern_client import Wire, describe, dump

log = logging.getLogger("tasks_client")

EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")
MAX_POLLS = 2000
INPUT_REQUEST = TypeAdapter(types.InputRequest)


# ------------------------------------------------------ the extension's wire types
class CreateTaskResult(types.Result):
    """`tools/call` answered with a task (`resultType: "task"`)."""

    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class DetailedTask(types.Result):
    """The `tasks/get` result."""

    result_type: str | None = None
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class AckResult(types.Result):
    """The `tasks/update` result."""

    result_type: str | None = None


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTaskRequest(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTaskRequest(types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


# ------------------------------------------------------------------- the extension
class TasksExtension(ClientExtension):
    identifier = EXTENSION

    def __init__(self, report: dict[str, Any]) -> None:
        self.report = report

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self.resolve)]

    def _saw(self, status: str) -> None:
        statuses = self.report["statuses"]
        if not statuses or statuses[-1] != status:
            statuses.append(status)

    async def resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        session = ctx.session
        self.report["created"] = dump(created)
        self._saw(created.status)
        interval = (created.poll_interval_ms or 100) / 1000
        answered: set[str] = set()
        for _ in range(MAX_POLLS):
            task = await session.send_request(
                GetTaskRequest(params=TaskIdParams(task_id=created.task_id)),
                DetailedTask,
                request_read_timeout_seconds=ctx.read_timeout_seconds,
            )
            self._saw(task.status)
            if task.poll_interval_ms:
                interval = task.poll_interval_ms / 1000
            if task.status == "completed":
                return types.CallToolResult.model_validate(task.result or {})
            if task.status in TERMINAL:
                raise RuntimeError(f"task {task.status}: {task.error}")
            if task.status == "input_required" and task.input_requests:
                fresh = {k: v for k, v in task.input_requests.items() if k not in answered}
                if fresh:
                    responses: dict[str, Any] = {}
                    for key, raw in fresh.items():
                        request = INPUT_REQUEST.validate_python(raw)
                        self.report["inputRequestKeys"].append(key)
                        self.report["questions"].append(getattr(request.params, "message", None))
                        rctx = ClientRequestContext(session=session, request_id=key, meta=None)
                        responses[key] = dump(await session.dispatch_input_request(rctx, request))
                        answered.add(key)
                    ack = await session.send_request(
                        UpdateTaskRequest(params=UpdateTaskParams(task_id=created.task_id, input_responses=responses)),
                        AckResult,
                        request_read_timeout_seconds=ctx.read_timeout_seconds,
                    )
                    self.report["updates"].append(dump(ack))
                    continue
            await anyio.sleep(interval)
        raise RuntimeError(f"task {created.task_id} did not finish in {MAX_POLLS} polls")


# ------------------------------------------------------------------------ the run
async def run(args: argparse.Namespace, report: dict[str, Any]) -> None:
    calls = {"elicitation": 0}

    async def elicitation(context: ClientRequestContext, params: types.ElicitRequestParams):
        calls["elicitation"] += 1
        schema = getattr(params, "requested_schema", None)
        return types.ElicitResult(action="accept", content=answers.elicitation_content(schema, "t"))

    report["callbacks"] = calls
    wire = Wire(bodies=False)
    async with httpx2.AsyncClient(
        timeout=httpx2.Timeout(args.timeout),
        event_hooks={"request": [wire.on_request], "response": [wire.on_response]},
    ) as http:
        client = Client(
            streamable_http_client(args.url, http_client=http),
            mode="2026-07-28",
            elicitation_callback=elicitation,
            extensions=[TasksExtension(report)],
            client_info=types.Implementation(name="tasks-peer-client", version="1.0"),
            read_timeout_seconds=args.timeout,
            cache=None,
        )
        try:
            async with client:
                result = await client.call_tool(args.tool, json.loads(args.args))
                report["result"] = dump(result)
        except Exception as exc:  # the SDK's or the server's failure: reported, not a harness bug
            log.debug("call failed", exc_info=exc)
            report["error"] = describe(exc)
    report["http"] = [
        {
            "method": (e.get("body") or {}).get("method"),
            "status": e.get("status"),
            "headers": e["headers"],
        }
        for e in wire.exchanges
        if e["httpMethod"] == "POST"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="2026-07-28 endpoint, e.g. http://127.0.0.1:PORT/mcp")
    parser.add_argument("--tool", required=True)
    parser.add_argument("--args", default="{}", help="JSON arguments")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request and whole-run limit (s)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.verbose else logging.WARNING)

    report: dict[str, Any] = {"ok": False, "error": None, "created": None, "statuses": [],
                              "inputRequestKeys": [], "questions": [], "updates": [], "result": None}

    async def bounded() -> None:
        try:
            with anyio.fail_after(args.timeout * 2):
                await run(args, report)
        except TimeoutError:
            report["error"] = report["error"] or describe(TimeoutError())

    try:
        anyio.run(bounded)
    except Exception:
        traceback.print_exc()
        return 2
    result = report["result"] if isinstance(report["result"], dict) else {}
    report["ok"] = report["error"] is None and bool(result) and not result.get("isError", False)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
