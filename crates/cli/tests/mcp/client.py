"""End-to-end scenarios for `cordon mcp`, driven by the official MCP Python SDK.

Usage: client.py SCENARIO WORKSPACE -- CORDON_ARGV...   (stdio: the client starts the server)
       client.py SCENARIO WORKSPACE --url URL           (streamable HTTP: the server runs;
                                                          the token is in $CORDON_MCP_TOKEN)

WORKSPACE is the server's root. Each scenario asserts what it can see over the protocol and
prints one JSON object on stdout for the Rust side to check further (files on disk, audit
log, tool schemas). Any failure exits non-zero with the reason on stderr.
"""

import base64
import json
import os
import random
import struct
import sys
import zlib
from pathlib import Path

try:
    import anyio
    from mcp import ClientSession, StdioServerParameters, types
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
except ImportError as error:  # pragma: no cover - reported to the Rust test
    print(
        f"the MCP Python SDK is not installed ({error}); install it with: "
        "python3 -m pip install mcp",
        file=sys.stderr,
    )
    sys.exit(3)

# Upper bound for any one scenario; generous for a loaded 2-core machine.
SCENARIO_TIMEOUT = 240


class ScenarioFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise ScenarioFailed(message)


def text_of(result):
    return "\n".join(block.text for block in result.content if block.type == "text")


def details_of(result):
    meta = result.meta or {}
    return meta.get("dev.cordon/details") or {}


async def call(session, name, arguments, **kwargs):
    return await session.call_tool(name, arguments, **kwargs)


async def call_ok(session, name, arguments):
    result = await call(session, name, arguments)
    check(not result.is_error, f"{name} {arguments} failed: {text_of(result)}")
    return result


def png_1x1():
    """A valid 1x1 RGB PNG."""

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


# --- scenarios --------------------------------------------------------------------------


async def scenario_list(session, workspace, init):
    check(init.server_info.name == "cordon", f"server name {init.server_info.name!r}")
    check(init.capabilities.tools is not None, "server does not declare the tools capability")
    listed = await session.list_tools()
    tools = [tool.model_dump(by_alias=True, exclude_none=True, mode="json") for tool in listed.tools]
    for tool in tools:
        check(tool.get("description"), f"tool {tool['name']} has no description")
        check(tool["inputSchema"].get("type") == "object", f"tool {tool['name']} schema")
    return {"tools": tools}


async def scenario_calls(session, workspace, init):
    written = await call_ok(session, "write", {"path": "notes/todo.txt", "content": "alpha\nbeta\n"})
    check("11 bytes" in text_of(written), f"write reports {text_of(written)!r}")

    read = await call_ok(session, "read", {"path": "notes/todo.txt"})
    check(text_of(read) == "alpha\nbeta\n", f"read returned {text_of(read)!r}")

    edited = await call_ok(
        session,
        "edit",
        {"path": "notes/todo.txt", "edits": [{"oldText": "beta", "newText": "gamma"}]},
    )
    check("Successfully replaced 1 block(s)" in text_of(edited), text_of(edited))
    patch = details_of(edited).get("patch", "")
    check("+gamma" in patch and "-beta" in patch, f"edit details carry no patch: {details_of(edited)}")

    reread = await call_ok(session, "read", {"path": "notes/todo.txt"})
    check(text_of(reread) == "alpha\ngamma\n", f"read after edit returned {text_of(reread)!r}")

    bash = await call_ok(session, "bash", {"command": "cat notes/todo.txt; echo done"})
    structured = bash.structured_content
    check(isinstance(structured, dict), f"bash has no structuredContent: {structured!r}")
    check(structured.get("exitCode") == 0, f"bash structuredContent {structured}")
    check(structured.get("output") == "alpha\ngamma\ndone\n", f"bash output {structured}")
    check(structured.get("truncated") is False, f"bash structuredContent {structured}")

    failing = await call(session, "bash", {"command": "echo partial; exit 4"})
    check(failing.is_error, "a failing command is not an error result")
    check("Command exited with code 4" in text_of(failing), text_of(failing))
    check(failing.structured_content.get("exitCode") == 4, f"{failing.structured_content}")

    listing = await call_ok(session, "ls", {"path": "notes"})
    check("todo.txt" in text_of(listing), text_of(listing))
    found = await call_ok(session, "find", {"pattern": "*.txt"})
    check("notes/todo.txt" in text_of(found), text_of(found))
    grepped = await call_ok(session, "grep", {"pattern": "gamma"})
    check("todo.txt" in text_of(grepped), text_of(grepped))

    (workspace / "pixel.png").write_bytes(png_1x1())
    image = await call_ok(session, "read", {"path": "pixel.png"})
    images = [block for block in image.content if block.type == "image"]
    check(len(images) == 1, f"read of a PNG returned {image.content}")
    check(images[0].mime_type == "image/png", images[0].mime_type)
    check(base64.b64decode(images[0].data).startswith(b"\x89PNG"), "image data is not a PNG")
    return {"ok": True}


async def scenario_denied(session, workspace, init):
    result = await call(session, "write", {"path": ".git/config", "content": "[core]\n\tpwned = 1\n"})
    check(result.is_error, "writing .git/config was not refused")
    text = text_of(result)
    check("policy" in text.lower() and ".git" in text, f"denial does not say why: {text!r}")
    # The session goes on after a denial.
    await call_ok(session, "read", {"path": ".git/config"})
    return {"denial": text}


async def scenario_invalid(session, workspace, init):
    missing = await call(session, "read", {})
    check(missing.is_error, "read without a path was not an error")
    check("path" in text_of(missing), f"validation error does not name the field: {text_of(missing)!r}")

    wrong_type = await call(session, "edit", {"path": "a.txt", "edits": 42})
    check(wrong_type.is_error, "edit with a numeric edits list was not an error")

    unknown = await call(session, "no_such_tool", {"x": 1})
    check(unknown.is_error, "an unknown tool was not an error")
    check("no_such_tool" in text_of(unknown), text_of(unknown))

    # The server is still fine.
    await call_ok(session, "ls", {})
    return {
        "missing": text_of(missing),
        "wrongType": text_of(wrong_type),
        "unknown": text_of(unknown),
    }


async def scenario_progress(session, workspace, init):
    updates = []
    go = workspace / "go"

    async def on_progress(progress, total, message):
        updates.append({"progress": progress, "message": message})
        if message and "first-line" in message:
            go.touch()

    # The command cannot finish until the client has seen its first line as progress.
    command = (
        "echo first-line; "
        "for i in $(seq 1 1200); do [ -e go ] && break; sleep 0.05; done; "
        "[ -e go ] || { echo 'no progress reached the client'; exit 9; }; "
        "echo second-line"
    )
    result = await call(session, "bash", {"command": command, "timeout": 120}, progress_callback=on_progress)
    check(not result.is_error, f"progress command failed: {text_of(result)}")
    check("second-line" in text_of(result), text_of(result))
    values = [update["progress"] for update in updates]
    check(all(a < b for a, b in zip(values, values[1:])), f"progress values not increasing: {values}")
    check(any(u["message"] and "first-line" in u["message"] for u in updates), f"{updates}")

    # Without a progress token there are no notifications (and the call still works).
    quiet = await call_ok(session, "bash", {"command": "echo quiet"})
    check("quiet" in text_of(quiet), text_of(quiet))
    return {"updates": updates}


def processes_with(marker):
    """Host pids whose command line contains `marker` (works across PID namespaces)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(entry))
    return pids


def alive(pid):
    """`kill -0`, counting a zombie (already dead, not yet reaped) as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "")
    return state not in ("Z", "X")


async def wait_for(condition, what, timeout=120):
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.05)


async def scenario_cancel(session, workspace, init):
    marker = f"3{random.randint(100, 999)}.{random.randint(100000, 999999)}"
    command = f"sleep {marker} & echo $! > child.pid; echo $$ > shell.pid; wait"
    outcome = {}

    async def run():
        try:
            outcome["result"] = await call(session, "bash", {"command": command, "timeout": 900})
        finally:
            outcome["finished"] = True

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        shell_pid_file, child_pid_file = workspace / "shell.pid", workspace / "child.pid"
        await wait_for(
            lambda: shell_pid_file.exists()
            and shell_pid_file.read_text().strip()
            and child_pid_file.exists()
            and child_pid_file.read_text().strip(),
            "pid files",
        )
        await wait_for(lambda: len(processes_with(marker)) >= 2, "the shell and its child")
        pids = processes_with(marker)
        file_pids = {int(shell_pid_file.read_text()), int(child_pid_file.read_text())}
        group.cancel_scope.cancel()

    check("result" not in outcome, f"the cancelled call returned a result: {outcome}")
    # Without a PID namespace the pid files name the same processes; check them too.
    to_check = set(pids) | (file_pids if file_pids <= set(pids) else set())
    await wait_for(lambda: not any(alive(pid) for pid in to_check), "the process tree to die")
    check(not processes_with(marker), f"processes survived the cancellation: {processes_with(marker)}")

    after = await call_ok(session, "bash", {"command": "echo still-serving"})
    check("still-serving" in text_of(after), text_of(after))
    return {"killed": sorted(to_check)}


async def scenario_parallel(session, workspace, init):
    def rendezvous(me, other):
        return (
            f"touch started-{me}; "
            f"for i in $(seq 1 1200); do [ -e started-{other} ] && exit 0; sleep 0.05; done; "
            f"echo 'call {me} never overlapped with call {other}'; exit 7"
        )

    results = {}

    async def run(me, other):
        results[me] = await call(session, "bash", {"command": rendezvous(me, other), "timeout": 120})

    async with anyio.create_task_group() as group:
        group.start_soon(run, "a", "b")
        group.start_soon(run, "b", "a")
    for me, result in results.items():
        check(not result.is_error, f"call {me}: {text_of(result)}")

    # Many concurrent edits of one file: serialised by the mutation queue, none is lost.
    slots = 16
    (workspace / "slots.txt").write_text("".join(f"slot-{n}\n" for n in range(slots)))
    edits = {}

    async def edit(n):
        edits[n] = await call(
            session,
            "edit",
            {"path": "slots.txt", "edits": [{"oldText": f"slot-{n}\n", "newText": f"done-{n}\n"}]},
        )

    async with anyio.create_task_group() as group:
        for n in range(slots):
            group.start_soon(edit, n)
    for n, result in edits.items():
        check(not result.is_error, f"edit {n}: {text_of(result)}")
    expected = "".join(f"done-{n}\n" for n in range(slots))
    actual = (workspace / "slots.txt").read_text()
    check(actual == expected, f"concurrent edits lost updates: {actual!r}")
    return {"ok": True}


class Asker:
    """The person behind the client: answers elicitation requests from a script.

    Each answer is an `ElicitResult`, or "hang" (never answer: the request stays pending until
    the server withdraws it)."""

    def __init__(self):
        self.answers = []
        self.asked = []
        self.arrived = anyio.Event()

    async def __call__(self, context, params):
        self.asked.append(
            {
                "message": params.message,
                "mode": params.mode,
                "schema": params.requested_schema.model_dump(by_alias=True, exclude_none=True, mode="json")
                if hasattr(params.requested_schema, "model_dump")
                else params.requested_schema,
            }
        )
        self.arrived.set()
        check(self.answers, f"an unexpected question: {params.message!r}")
        answer = self.answers.pop(0)
        if answer == "hang":
            await anyio.sleep_forever()
        return answer


ASKER = Asker()


def choose(decision):
    return types.ElicitResult(action="accept", content={"decision": decision})


async def asked_call(session, path, answer, expect_question=True):
    """Write `path`, answering the question it raises (if one is expected) with `answer`."""
    before = len(ASKER.asked)
    if answer is not None:
        ASKER.answers.append(answer)
    result = await call(session, "write", {"path": path, "content": f"{path}\n"})
    questions = len(ASKER.asked) - before
    check(questions == (1 if expect_question else 0), f"{path}: {questions} question(s)")
    check(not ASKER.answers, f"{path}: unused answers {ASKER.answers}")
    return {"error": result.is_error, "text": text_of(result)}


async def scenario_approvals(session, workspace, init):
    results = {}
    results["once"] = await asked_call(session, "once/a.txt", choose("allow_once"))
    # Allowed once: the same call asks again.
    results["onceAgain"] = await asked_call(session, "once/a.txt", choose("allow_once"))
    results["deny"] = await asked_call(session, "once/b.txt", choose("deny"))
    results["decline"] = await asked_call(session, "once/c.txt", types.ElicitResult(action="decline"))
    results["cancel"] = await asked_call(session, "once/d.txt", types.ElicitResult(action="cancel"))
    results["malformed"] = await asked_call(session, "once/e.txt", choose("perhaps"))
    results["session"] = await asked_call(session, "session/x.txt", choose("allow_session"))
    # Allowed for the session: later calls this rule asks about do not ask.
    results["sessionAgain"] = await asked_call(session, "session/y.txt", None, expect_question=False)
    # Another rule still asks.
    results["otherRule"] = await asked_call(session, "once/f.txt", choose("deny"))
    return {"results": results, "asked": ASKER.asked}


async def scenario_approval_timeout(session, workspace, init):
    ASKER.answers.append("hang")
    result = await call(session, "write", {"path": "once/late.txt", "content": "late\n"})
    # The question reached the client before the call ended without an answer.
    with anyio.fail_after(SCENARIO_TIMEOUT):
        await ASKER.arrived.wait()
    check(len(ASKER.asked) == 1, f"{len(ASKER.asked)} questions")
    after = await call_ok(session, "ls", {})
    return {"error": result.is_error, "text": text_of(result), "after": text_of(after)}


async def scenario_approval_unsupported(session, workspace, init):
    result = await call(session, "write", {"path": "once/a.txt", "content": "a\n"})
    return {"error": result.is_error, "text": text_of(result)}


class HostServer:
    """A plain HTTP server on the host at 127.0.0.2 (outside the sandbox's network), serving
    `hello.txt`; commands reach it only through Cordon's egress proxy."""

    def __init__(self, directory):
        import functools
        import http.server
        import threading

        (directory / "hello.txt").write_text("hello from the host\n")
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


async def fetched(session, port, answer, expect_question=True):
    """Fetch hello.txt with unmodified curl in a bash call, answering the question the
    connection raises (if one is expected) with `answer`."""
    before = len(ASKER.asked)
    if answer is not None:
        ASKER.answers.append(answer)
    command = f"curl -sS --max-time 100 http://127.0.0.2:{port}/hello.txt"
    result = await call(session, "bash", {"command": command, "timeout": 120})
    questions = len(ASKER.asked) - before
    check(questions == (1 if expect_question else 0), f"{questions} question(s): {text_of(result)}")
    check(not ASKER.answers, f"unused answers {ASKER.answers}")
    return {"error": result.is_error, "text": text_of(result)}


async def scenario_egress_approvals(session, workspace, init):
    import tempfile

    with tempfile.TemporaryDirectory() as served:
        host = HostServer(Path(served))
        try:
            port = host.port
            results = {
                "once": await fetched(session, port, choose("allow_once")),
                # Allowed once: the next connection asks again.
                "declined": await fetched(session, port, types.ElicitResult(action="decline")),
                "session": await fetched(session, port, choose("allow_session")),
                # Allowed for the session: later commands are not asked.
                "sessionAgain": await fetched(session, port, None, expect_question=False),
            }
        finally:
            host.close()
    return {"port": port, "results": results, "asked": ASKER.asked}


async def scenario_egress_unsupported(session, workspace, init):
    import tempfile

    with tempfile.TemporaryDirectory() as served:
        host = HostServer(Path(served))
        try:
            result = await fetched(session, host.port, None, expect_question=False)
        finally:
            host.close()
    return {"port": host.port, "result": result}


SCENARIOS = {
    "list": scenario_list,
    "calls": scenario_calls,
    "denied": scenario_denied,
    "invalid": scenario_invalid,
    "progress": scenario_progress,
    "cancel": scenario_cancel,
    "parallel": scenario_parallel,
    "approvals": scenario_approvals,
    "approval-timeout": scenario_approval_timeout,
    "approval-unsupported": scenario_approval_unsupported,
    "egress-approvals": scenario_egress_approvals,
    "egress-unsupported": scenario_egress_unsupported,
}

# Scenarios whose client answers elicitation requests (and so declares the capability).
ANSWERING = {"approvals", "approval-timeout", "egress-approvals"}


async def run_session(name, workspace, read, write):
    answering = {"elicitation_callback": ASKER} if name in ANSWERING else {}
    async with ClientSession(read, write, **answering) as session:
        init = await session.initialize()
        return await SCENARIOS[name](session, workspace, init)


async def main(name, workspace, how, target):
    with anyio.fail_after(SCENARIO_TIMEOUT):
        if how == "--":
            server = StdioServerParameters(command=target[0], args=target[1:], cwd=str(workspace))
            async with stdio_client(server) as (read, write):
                report = await run_session(name, workspace, read, write)
        else:
            import httpx2

            token = os.environ["CORDON_MCP_TOKEN"]
            headers = {"Authorization": f"Bearer {token}"}
            timeout = httpx2.Timeout(SCENARIO_TIMEOUT, read=SCENARIO_TIMEOUT)
            async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
                async with streamable_http_client(target[0], http_client=http) as (read, write):
                    report = await run_session(name, workspace, read, write)
    print(json.dumps(report))


def usage():
    names = ",".join(SCENARIOS)
    print(
        f"usage: client.py {{{names}}} WORKSPACE (-- CORDON_ARGV... | --url URL)",
        file=sys.stderr,
    )
    sys.exit(2)


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[1] not in SCENARIOS:
        usage()
    how = sys.argv[3]
    if how not in ("--", "--url") or (how == "--url" and len(sys.argv) != 5):
        usage()
    try:
        anyio.run(main, sys.argv[1], Path(sys.argv[2]), how, sys.argv[4:])
    except ScenarioFailed as failure:
        print(f"scenario {sys.argv[1]} failed: {failure}", file=sys.stderr)
        sys.exit(1)
