"""Keep one process running under `make run`: restart it with backoff when it dies, stop it cleanly on request.

honcho (which runs the Procfile) stops every process as soon as one exits. Each Procfile entry therefore runs
a supervisor: honcho only ever sees the supervisor, which outlives any crash of its child, restarts it after
1, 2, 4, 8 then 10 s (back to 1 s once it has stayed up for a minute), and stops it on SIGTERM or SIGINT.

The child runs in a process group of its own, so it gets exactly one SIGTERM (from here), never a second one
from honcho's group signal or the terminal's Ctrl-C (a second SIGTERM makes an RQ worker abandon its job).
If the supervisor itself is killed outright, the kernel kills the child too (PR_SET_PDEATHSIG).
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

BACKOFF_SECONDS = [1, 2, 4, 8, 10]  # the last one repeats: a crashing process is retried every 10 s
HEALTHY_AFTER_SECONDS = 60  # a child that ran this long starts the backoff again from its first step
STOP_GRACE_SECONDS = 4  # honcho SIGKILLs everything 5 s after its SIGTERM
RESTART_CHECK_SECONDS = 2


@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    # Runs after each start; returns None once the child is ready, else what failed and what to do.
    self_test: Callable[[subprocess.Popen, Callable[[], bool]], str | None] | None = None
    before_start: Callable[[], None] = field(default=lambda: None)
    on_ready: Callable[[], None] = field(default=lambda: None)
    on_exit: Callable[[], None] = field(default=lambda: None)  # after each exit of the child
    before_stop: Callable[[], None] = field(default=lambda: None)  # before the child gets its SIGTERM
    # Asked every RESTART_CHECK_SECONDS while the child runs: a reason to restart it now (say, the local model
    # server once a model is installed), or None. Such a restart is no failure: no backoff.
    restart_when: Callable[[], str | None] | None = None


def say(name: str, text: str) -> None:
    print(f"[supervisor] {name}: {text}", file=sys.stderr, flush=True)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _die_with_parent() -> None:
    """In the child: if the supervisor is killed outright, the kernel kills the child too (Linux)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Supervisor:
    def __init__(self, service: Service, backoff: list[float] = BACKOFF_SECONDS):
        self.service = service
        self.backoff = backoff
        self.stop_requested = False
        self.restarting = False  # the child is being restarted on purpose (Service.restart_when)
        self.child: subprocess.Popen | None = None

    def _request_stop(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    def run(self) -> int:
        """Run the child until asked to stop; returns 0 (the exit of the supervisor is always deliberate)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._request_stop)
        failures = 0
        while not self.stop_requested:
            started = time.monotonic()
            code = self._run_once()
            self.service.on_exit()
            if self.stop_requested:
                break
            if self.restarting:
                self.restarting = False
                continue
            if time.monotonic() - started >= HEALTHY_AFTER_SECONDS:
                failures = 0
            delay = self.backoff[min(failures, len(self.backoff) - 1)]
            failures += 1
            say(self.service.name, f"{describe_exit(code)}; restarting in {delay:g} s")
            self._sleep(delay)
        return 0

    def _run_once(self) -> int:
        """Start the child, self-test it, wait for its exit or a stop request; its exit code."""
        self.service.before_start()
        self.child = subprocess.Popen(
            self.service.argv, env=self.service.env, start_new_session=True, preexec_fn=_die_with_parent
        )
        if self.service.self_test is not None:
            problem = self.service.self_test(self.child, lambda: self.stop_requested)
            if problem is not None and not self.stop_requested:
                say(self.service.name, problem)
                return self._stop_child()
        if not self.stop_requested and self.child.poll() is None:
            self.service.on_ready()
        next_check = time.monotonic() + RESTART_CHECK_SECONDS
        while self.child.poll() is None and not self.stop_requested:
            time.sleep(0.2)
            if self.service.restart_when is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + RESTART_CHECK_SECONDS
                if reason := self.service.restart_when():
                    say(self.service.name, f"{reason}; restarting it")
                    self.restarting = True
                    break
        return self._stop_child()

    def _stop_child(self) -> int:
        child = self.child
        if child.poll() is None:
            self.service.before_stop()
            child.terminate()
            try:
                return child.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        return child.wait()

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop_requested and time.monotonic() < deadline:
            time.sleep(0.1)
