"""Start TensorBoard with the trainkit tab, installed or not (``python -m`` this module).

An installed trainkit registers the tab through the ``tensorboard_plugins`` entry point, so plain
``tensorboard --logdir runs`` shows it; from a source checkout, use this launcher instead.

Example::

    python -m trainkit.sinks.tbplugin.launch --logdir runs --port 6006
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Iterator, Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run TensorBoard (all its usual flags) with the trainkit tab until interrupted."""
    from tensorboard import default, program

    from .plugin import TrainkitPluginLoader

    plugins = default.get_plugins()  # with the entry points' plugins: ours when installed
    if not any(p is TrainkitPluginLoader or isinstance(p, TrainkitPluginLoader) for p in plugins):
        plugins = plugins + [TrainkitPluginLoader()]
    tb = program.TensorBoard(plugins=plugins)
    tb.configure(argv=[sys.argv[0]] + list(sys.argv[1:] if argv is None else argv))
    return int(tb.main() or 0)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (another process may still take it: rare on loopback)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve(logdir: str, *, python: str = sys.executable, timeout_s: float = 60.0,
          ready_path: str = "/data/plugins_listing", cwd: Optional[str] = None) -> Iterator[str]:
    """Run this launcher in a child process on loopback; yields its base URL; always stops it.

    Example::

        with serve("runs") as url:
            urllib.request.urlopen(url + "/data/plugin/trainkit/runs").read()
    """
    port = free_port()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    env = dict(os.environ)  # the child's own copy: os.environ itself is left alone
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    cmd = [python, "-m", "trainkit.sinks.tbplugin.launch", "--logdir", logdir,
           "--port", str(port), "--host", "127.0.0.1", "--load_fast=false", "--reload_interval=1"]
    log = tempfile.TemporaryFile()  # not a pipe: a chatty server must never block on it
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"TensorBoard exited with {proc.returncode}: "
                                   f"{log.read().decode(errors='replace')[-2000:]}")
            try:
                urllib.request.urlopen(url + ready_path, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"TensorBoard did not answer on {url} in {timeout_s} s")
                time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
