"""`make lab` starts JupyterLab on notebooks/ with the kit importable in its kernel.

The test runs the real target (its install step is a no-op once .venv is up to
date), waits for the server, starts a kernel through the server's REST API,
runs `import kit` over the kernel's websocket, and stops the server.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

from .servers import free_port, stop_process_group, wait_until_up

ROOT = Path(__file__).resolve().parents[1]


def _api(port: int, token: str, path: str, body: dict | None = None) -> dict | list:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


async def _execute(port: int, token: str, kernel_id: str, code: str) -> str:
    from tornado.websocket import websocket_connect

    url = f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?token={token}"
    ws = await websocket_connect(url)
    msg_id = uuid.uuid4().hex
    ws.write_message(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "username": "test",
                    "session": uuid.uuid4().hex,
                    "msg_type": "execute_request",
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "buffers": [],
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                },
            }
        )
    )
    out = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        raw = await asyncio.wait_for(ws.read_message(), timeout=120)
        assert raw is not None, "kernel websocket closed"
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            out.append("ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"])
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            break
    ws.close()
    return "".join(out)


def test_make_lab_serves_notebooks_with_kit_importable():
    port, token = free_port(), secrets.token_hex(16)
    flags = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={token}"
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"LAB_FLAGS={flags}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until_up(  # the first `make lab` may still install
            proc,
            lambda: _api(port, token, "/api/status"),
            timeout=600,
            why_it_died=lambda: proc.stdout.read().decode(errors="replace")[-3000:],
        )
        contents = _api(port, token, "/api/contents")
        names = {c["name"] for c in contents["content"]}
        assert "01_start_here.ipynb" in names, f"the server's root is not notebooks/: {names}"
        kernel = _api(port, token, "/api/kernels", {"name": "python3"})
        code = "import kit, sys; print(kit.__file__); print(sys.prefix)"
        out = asyncio.run(_execute(port, token, kernel["id"], code))
        assert "ERROR" not in out, out
        kit_file, prefix = out.split()
        assert Path(kit_file) == ROOT / "kit" / "__init__.py"
        assert Path(prefix) == ROOT / ".venv"
    finally:
        stop_process_group(proc)
