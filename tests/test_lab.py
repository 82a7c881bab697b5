"""`make lab` starts JupyterLab on notebooks/ with the kit importable in its kernel, and saves notebooks output-free.

The tests run the real target (its install step is a no-op once .venv is up to
date), wait for the server, and talk to it through its REST API: one starts a
kernel and runs `import kit` over the kernel's websocket; one saves a notebook
with outputs (as autosave does after a run) and reads what reached the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from .servers import free_port, stop_process_group, wait_until_up

ROOT = Path(__file__).resolve().parents[1]


def _api(port: int, token: str, path: str, body: dict | None = None, method: str | None = None) -> dict | list:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        method=method or ("GET" if body is None else "POST"),
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


@contextlib.contextmanager
def make_lab(*make_args: str) -> Iterator[tuple[int, str]]:
    """`make lab` on a free port with a token, until the block ends; yields (port, token)."""
    port, token = free_port(), secrets.token_hex(16)
    flags = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={token}"
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"LAB_FLAGS={flags}", *make_args],
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
        yield port, token
    finally:
        if proc.poll() is None:
            stop_process_group(proc)


@pytest.mark.slow
def test_make_lab_serves_notebooks_with_kit_importable():
    with make_lab() as (port, token):
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


def test_make_lab_saves_notebooks_output_free_with_checkpoints_outside(tmp_path):
    # A copy of a notebook in a folder of its own (`make lab LAB_DIR=...`): notebooks/ is left alone.
    name = "01_start_here.ipynb"
    shutil.copy(ROOT / "notebooks" / name, tmp_path / name)
    with make_lab(f"LAB_DIR={tmp_path}") as (port, token):
        model = _api(port, token, f"/api/contents/{name}")
        notebook = model["content"]
        code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
        code[0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
        code[0]["execution_count"] = 1
        notebook["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
        _api(port, token, f"/api/contents/{name}", {"type": "notebook", "format": "json", "content": notebook}, "PUT")
        checkpoint = _api(port, token, f"/api/contents/{name}/checkpoints", {})
    saved = nbformat.read(tmp_path / name, as_version=4)
    assert [c.source for c in saved.cells] == [c["source"] for c in notebook["cells"]], "the save lost the cells"
    assert not [c for c in saved.cells if c.cell_type == "code" and (c.outputs or c.execution_count)], "outputs saved"
    assert "widgets" not in saved.metadata, "widget state saved"
    assert checkpoint["id"] and not (tmp_path / ".ipynb_checkpoints").exists(), "a checkpoint next to the notebook"
    assert list((ROOT / "build" / "lab_checkpoints").glob(f"01_start_here-{checkpoint['id']}.ipynb"))
