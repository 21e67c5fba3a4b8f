"""End-to-end tests of `affinity --port` with real clients (openai, Chromium).

They need a running server or the means to start one:
  AFF_E2E_BASE_URL=http://127.0.0.1:8080        use a server that is already up, or
  AFF_E2E_AFFINITY_BIN=build/bin/affinity AFF_E2E_MODEL=path/to/tiny-model
                                                 start one on a free port for the session.
Without them (or without the `openai` package / a browser) the tests skip and say why.
"""
import os
import socket
import subprocess
import time
import urllib.request

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url, proc=None, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"affinity exited with {proc.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url}/health not ready after {timeout}s")


# The pid of the server this session started (None for AFF_E2E_BASE_URL), so
# tests can read its thread count and resident memory from /proc.
SERVER = {"pid": None}


def server_proc_status(field):
    """An integer field of /proc/<server pid>/status (e.g. Threads, VmRSS in kB), or None."""
    pid = SERVER["pid"]
    if pid is None:
        return None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


@pytest.fixture(scope="session")
def base_url():
    url = os.environ.get("AFF_E2E_BASE_URL")
    if url:
        _wait_healthy(url.rstrip("/"))
        yield url.rstrip("/")
        return
    binary, model = os.environ.get("AFF_E2E_AFFINITY_BIN"), os.environ.get("AFF_E2E_MODEL")
    if not binary or not model:
        pytest.skip("e2e server tests need AFF_E2E_BASE_URL, or AFF_E2E_AFFINITY_BIN and AFF_E2E_MODEL "
                    "(the tiny model) to start `affinity -m MODEL --port N`")
    port = _free_port()
    # --max-tokens-floor 0: honour the tests' max_tokens (the default floor raises
    # every chat request to 256000 tokens, as the reference design does).
    proc = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", str(port),
                             "--max-tokens-floor", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        SERVER["pid"] = proc.pid
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def client(base_url):
    openai = pytest.importorskip("openai", reason="the official `openai` package is not installed (pip install openai)")
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="session")
def model_id(client):
    return client.models.list().data[0].id
