"""Helpers shared by the process-level tests: start child scripts, read their output and events."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def child_env() -> Dict[str, str]:
    """os.environ with this checkout first on PYTHONPATH (the child imports this trainkit)."""
    env = dict(os.environ)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + old if old else "")
    env["PYTHONUNBUFFERED"] = "1"
    # Never let the environment of the test runner make a plain child look like a torchrun rank.
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return env


def stop_server(server: "subprocess.Popen[bytes]", log: Any) -> None:
    """End a server started for a test (SIGTERM, then SIGKILL after 20 s) and close its log."""
    server.terminate()
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)
    log.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _sigint_default_in_children:
    """Children start with SIGINT at its default, as a program run from a terminal does.

    A shell starts background jobs with SIGINT ignored (``cmd &`` in a script), children inherit
    that, and Python then raises no KeyboardInterrupt: the SIGINT tests would test nothing. exec
    resets a *handled* signal to its default but keeps an ignored one ignored, so while a child
    starts this process handles SIGINT (as Python does by default) instead of ignoring it.
    """

    def __enter__(self) -> None:
        self.prev = signal.getsignal(signal.SIGINT)
        self.swap = self.prev == signal.SIG_IGN and threading.current_thread() is threading.main_thread()
        if self.swap:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: object) -> None:
        if self.swap:
            signal.signal(signal.SIGINT, self.prev)


class Child:
    """A child process whose stdout lines are collected by a thread (no blocking readline)."""

    def __init__(self, args: Sequence[str], *, new_session: bool = False) -> None:
        """``new_session``: the child leads a process group of its own (to be signalled whole)."""
        with _sigint_default_in_children():
            self.proc = subprocess.Popen(
                [str(a) for a in args], cwd=str(REPO), env=child_env(),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                start_new_session=new_session)
        self.lines: List[str] = []
        self.stderr = ""
        self._cond = threading.Condition()
        self._out = threading.Thread(target=self._read_out, daemon=True)
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._out.start()
        self._err.start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _read_err(self) -> None:
        self.stderr = self.proc.stderr.read()

    def wait_for(self, pred: Callable[[str], bool], timeout: float) -> str:
        """The first output line for which ``pred`` is true; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if pred(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (not self._out.is_alive() and seen == len(self.lines)):
                    break
                self._cond.wait(min(left, 0.5))
        self.kill()
        raise AssertionError(f"child never printed the expected line within {timeout}s; "
                             f"rc={self.proc.returncode}; last lines={self.lines[-5:]}; "
                             f"stderr={self.stderr[-3000:]}")

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"child did not exit within {timeout}s; last lines={self.lines[-5:]}")
        self._out.join(10)
        self._err.join(10)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.join(10)
        self._err.join(10)

    def steps(self) -> List[Tuple[int, float, float]]:
        """(step, loss, monotonic time) of every ``step N LOSS T`` line printed."""
        out = []
        for line in self.lines:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "step":
                out.append((int(parts[1]), float(parts[2]), float(parts[3])))
        return out


def event_files(logdir: Path) -> List[Path]:
    return sorted(p for p in Path(logdir).iterdir() if p.name.startswith("events.out.tfevents."))


def read_scalars(logdir: Path) -> Dict[str, List[Tuple[int, float]]]:
    """tag -> [(step, value), ...] as TensorBoard's EventAccumulator reads ``logdir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def steps_of(scalars: Dict[str, List[Tuple[int, float]]], tag: str) -> List[int]:
    return [step for step, _ in scalars.get(tag, [])]
