"""A real Triton Inference Server (PyTriton's bundled tritonserver, CPU
only) serving two toy text models for tests/triton_real.rs:

- `toy`, classic: text_input (BYTES), max_tokens (INT32, optional) ->
  text_output (BYTES), the prompt's words numbered, max_tokens of them;
- `toy_stream`, decoupled: the same plus `stream` (BOOL, optional); with
  stream true, one response per token, TOY_TOKEN_DELAY seconds apart. A
  prompt starting with "fail" raises after its first response (a model
  failing mid-generation).

Usage: toy_triton.py HTTP_PORT GRPC_PORT METRICS_PORT. Prints
TOY_TRITON_SERVING once both models are loaded; stops on SIGTERM, and
when its parent (the test process) is gone, leaving nothing behind (the
server, its workspace, PyTriton's shared memory).
"""
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

HOME = tempfile.mkdtemp(prefix="fairway-triton-")
os.environ["PYTRITON_HOME"] = HOME

import numpy as np  # noqa: E402
from pytriton.model_config import ModelConfig, Tensor  # noqa: E402
from pytriton.triton import Triton, TritonConfig  # noqa: E402


def _args(req):
    text = req["text_input"].reshape(-1)[0]
    text = text.decode() if isinstance(text, bytes) else str(text)
    n = int(req["max_tokens"].reshape(-1)[0]) if "max_tokens" in req else 8
    return text, max(1, min(n, 256))


def _tokens(text, n):
    words = text.split() or ["x"]
    return [f"{words[i % len(words)]}{i}" for i in range(n)]


def toy(requests):
    return [{"text_output": np.array([" ".join(_tokens(*_args(r))).encode()], dtype=object)}
            for r in requests]


def toy_stream(requests):
    req = requests[0]
    text, n = _args(req)
    toks = _tokens(text, n)
    if not ("stream" in req and bool(req["stream"].reshape(-1)[0])):
        yield [{"text_output": np.array([" ".join(toks).encode()], dtype=object)}]
        if text.startswith("fail"):
            raise RuntimeError("the toy model failed after its response")
        return
    for i, tok in enumerate(toks):
        if i > 0:
            time.sleep(float(os.environ.get("TOY_TOKEN_DELAY", "0.02")))
        if i == 1 and text.startswith("fail"):
            raise RuntimeError("the toy model failed mid-generation")
        yield [{"text_output": np.array([(tok if i == 0 else " " + tok).encode()], dtype=object)}]


def _descendants(pid):
    """Every process below `pid`, children first, read from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _is_resource_tracker(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"resource_tracker" in f.read()
    except OSError:
        return False


def _shutdown():
    """Stops the server and what it started, removes the workspace and the
    shared memory PyTriton made, and exits: PyTriton's own SIGTERM path
    leaves the server running now and then, and its files always. The
    files go first (running processes keep what they opened): this
    process may end as soon as the server does."""
    shutil.rmtree(HOME, ignore_errors=True)
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"pytrtion{os.getpid()}-"):
            try:
                os.unlink(f"/dev/shm/{name}")
            except OSError:
                pass
    # Not Python's resource tracker: once this process is gone it removes
    # the shared memory PyTriton registered with it (/dev/shm/psm_*).
    procs = [p for p in _descendants(os.getpid()) if not _is_resource_tracker(p)]
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 2.0)):
        for p in procs:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in procs):
            for p in procs:
                try:
                    os.waitpid(p, os.WNOHANG)
                except ChildProcessError:
                    pass
            time.sleep(0.1)
    os._exit(0)


def _watch_parent(parent):
    while os.getppid() == parent:
        time.sleep(0.5)
    _shutdown()


for _sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, lambda *_: threading.Thread(target=_shutdown).start())

inputs = [Tensor(name="text_input", dtype=bytes, shape=(1,)),
          Tensor(name="max_tokens", dtype=np.int32, shape=(1,), optional=True)]
stream_inputs = inputs + [Tensor(name="stream", dtype=np.bool_, shape=(1,), optional=True)]
outputs = [Tensor(name="text_output", dtype=bytes, shape=(1,))]
http, grpc, metrics = (int(p) for p in sys.argv[1:4])
threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
cfg = TritonConfig(http_address="127.0.0.1", http_port=http, grpc_address="127.0.0.1",
                   grpc_port=grpc, metrics_address="127.0.0.1", metrics_port=metrics,
                   allow_gpu_metrics=False, metrics_config=["histogram_latencies=true"])
with Triton(config=cfg) as triton:
    triton.bind(model_name="toy", infer_func=toy, inputs=inputs, outputs=outputs,
                config=ModelConfig(batching=False))
    triton.bind(model_name="toy_stream", infer_func=toy_stream, inputs=stream_inputs,
                outputs=outputs, config=ModelConfig(batching=False, decoupled=True))
    print("TOY_TRITON_SERVING", flush=True)
    # Nothing more on stdout: once the test process is gone, a write to its
    # pipe would kill this process before it stops the server.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    triton.serve()
