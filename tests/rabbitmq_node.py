"""A private RabbitMQ node for the tests (Debian's ``rabbitmq-server``, no system service).

Everything the node owns lives in one temporary directory: its Mnesia and log
directories, a config file, an empty enabled-plugins file (no management plugin),
and a HOME holding its Erlang cookie. It listens on free loopback ports (AMQP and
Erlang distribution) and registers with its own ``epmd`` on a free port, so it
never meets a system node or another test run's. The same node (same name, same
data directory) can be stopped and started again, for "broker down and back" tests.

Works as root and as a normal user: it runs ``/usr/lib/rabbitmq/bin/rabbitmq-server``
directly (``/usr/sbin/rabbitmq-server`` switches to the ``rabbitmq`` user when root).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from celery_debounce.testing.reaper import Reaper, reap_with_parent
from celery_debounce.testing.servers import free_port

#: Where Debian's package puts the real scripts (the /usr/sbin ones are wrappers).
RABBITMQ_BIN = Path(os.environ.get("RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))

#: Set (to anything) to let the rabbitmq tests skip when rabbitmq-server is absent.
#: Without it, a missing rabbitmq-server fails them (CI installs it).
SKIP_ENV = "DEBOUNCE_SKIP_RABBITMQ"


def rabbitmq_server_path() -> Path | None:
    path = RABBITMQ_BIN / "rabbitmq-server"
    return path if path.exists() else None


def own_queue() -> str:
    """A queue name of a test's own: a message left over by one test never reaches
    another test's worker."""
    return f"q-{uuid.uuid4().hex[:10]}"


class RabbitNode:
    """One RabbitMQ node in a temporary directory; ``start()``, ``stop()``, ``start()`` again."""

    def __init__(self, name: str | None = None) -> None:
        server = rabbitmq_server_path()
        if server is None:
            raise FileNotFoundError(
                f"{RABBITMQ_BIN}/rabbitmq-server not found: run scripts/ensure-rabbitmq.sh "
                f"(apt-get install rabbitmq-server), or set {SKIP_ENV}=1 to skip these tests"
            )
        self.server = server
        self.dir = Path(tempfile.mkdtemp(prefix="celery-debounce-rabbit-"))
        os.chmod(self.dir, 0o700)
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.name = name or f"debounce{os.getpid()}_{self.port}@localhost"
        self.log = self.dir / "node.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._reaper: Reaper | None = None
        home = self.dir / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(f"DEBOUNCETEST{self.port}{os.getpid()}")
        cookie.chmod(0o400)
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "loopback_users = none\n"
            # tests fill no disk and no memory; never block publishers on alarms
            "disk_free_limit.absolute = 1\n"
            "vm_memory_high_watermark.relative = 0.9\n"
            "log.file.level = info\n"
            "log.console = false\n"
        )
        (self.dir / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def app_conf(self) -> dict[str, Any]:
        """Settings that put an app's messages on this node (``make_app(url, **these)``;
        windows and results stay in Redis), in a default queue of the test's own."""
        return {
            "broker_url": self.url,
            "task_default_queue": own_queue(),
            # An in-process worker on py-amqp sleeps in its event loop until the next
            # timer: with no timer it noticed the end of a test only after 10 s. AMQP
            # heartbeats every 2 s give its loop a timer (1 s checks), so it stops within
            # about a second.
            "broker_heartbeat": 2,
        }

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(self.dir / "home"),
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.dir / "log"),
            RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(self.dir / "plugins-expand"),
            RABBITMQ_CONF_ENV_FILE=str(self.dir / "rabbitmq-env.conf"),
            RABBITMQ_PID_FILE=str(self.dir / "node.pid"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.dir / "advanced.config"),
            # rabbitmqctl/diagnostics pick their own distribution port near this
            RABBITMQ_CTL_DIST_PORT_MIN=str(self.dist_port + 1),
            RABBITMQ_CTL_DIST_PORT_MAX=str(self.dist_port + 11),
        )
        return env

    def start(self, timeout: float = 60.0) -> RabbitNode:
        """Start the node and wait until it accepts AMQP connections."""
        if self.process is not None and self.process.poll() is None:
            return self
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(self.server)],
                env=self.env(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # a test process that ends without its cleanup (pytest-timeout's os._exit, a
        # kill) leaves no node behind: its watcher stops the node's whole process group
        # (the script and the VM) and removes the directory
        self._reaper = reap_with_parent(-self.process.pid, self.dir)
        deadline = time.monotonic() + timeout
        while not self.accepts_amqp():
            if self.process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"rabbitmq-server did not start in {timeout}s:\n{self.tail()}")
            time.sleep(0.2)
        return self

    def accepts_amqp(self) -> bool:
        """True when the node answers an AMQP handshake (a kombu connection opens)."""
        from kombu import Connection

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                pass
        except OSError:
            return False
        conn = Connection(self.url, connect_timeout=2)
        try:
            conn.connect()
            return True
        except Exception:  # refused while booting, or the handshake failed
            return False
        finally:
            conn.release()

    def stop(self, timeout: float = 30.0, kill: bool = False) -> None:
        """Stop the node (SIGTERM: a clean shutdown; ``kill``: SIGKILL, as a crash).

        Its data directory stays, so :meth:`start` brings back the same node, with its
        durable queues and persistent messages."""
        proc = self.process
        if proc is None:
            return
        if self._reaper is not None:  # stopped by its owner: the watcher goes
            self._reaper.dismiss()
            self._reaper = None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        # a killed shell can leave the VM (same session) behind: make sure it is gone
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process = None
        deadline = time.monotonic() + 10
        while self._port_open() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _port_open(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl`` against this node."""
        return subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.name, *args],
            env=self.env(),
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def tail(self, lines: int = 40) -> str:
        text = ""
        for path in [self.log, *sorted((self.dir / "log").glob("*.log"))]:
            if path.exists():
                text += (
                    f"--- {path.name}\n"
                    + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                    + "\n"
                )
        return text

    def cleanup(self) -> None:
        """Stop the node and its private epmd; remove the directory."""
        self.stop(kill=True)
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        subprocess.run(
            [epmd, "-port", str(self.epmd_port), "-kill"],
            capture_output=True,
            timeout=10,
            env=dict(os.environ, ERL_EPMD_PORT=str(self.epmd_port)),
            check=False,
        )
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RabbitNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
