"""Start N local ranks as real processes and watch them (``--nproc N``).

Every rank runs ``python -m popplay.cli.rank "popplay rank R/N" ARGV...`` with
the environment torchrun would give it, so the code under it cannot tell the two
launchers apart. The role string is an argv element, so ``ps`` shows each rank's role.

The launcher is the one place that sees every rank's fate: when one dies (kill -9,
out of memory, an exception) it stops the others within a bounded time and prints
*one* line naming the lost rank; the ranks' own secondary complaints ("a peer
vanished") are held back so that the user sees the cause, not its echoes. Ctrl-C
(SIGINT) and SIGTERM are forwarded once to every rank (which stop together at the
next phase and save once); a second Ctrl-C kills them.

This module imports no torch: the launcher only starts and watches processes.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable

from popplay.core.limits import usable_cores

#: Exit code of a job that lost a rank (and of ``launch_local`` in that case).
LOST_EXIT = 3
#: Exit code of a rank that stopped because a peer vanished or stopped answering.
PEER_LOST_EXIT = 75

_GRACE_SECONDS = 2.0  # how long survivors may take to exit on their own after a loss


def launched_here() -> bool:
    """True inside a rank started by :func:`launch_local` (not by torchrun)."""
    return os.environ.get("POPPLAY_LAUNCHED") == "1"


def in_rank() -> bool:
    """True inside any rank of a multi-process job (ours or torchrun's)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started it (not our launcher), else None."""
    if in_rank() and not launched_here():
        return int(os.environ.get("RANK", "0") or 0)
    return None


def speaks_for_job() -> bool:
    """Whether this process says what every process of its job would say (warnings
    about the command line): a process of its own, our launcher (not its ranks, whose
    command line it checked), or torchrun's rank 0 (each torchrun worker runs the
    whole command line)."""
    return not in_rank() or torchrun_rank() == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (bound and released; rank 0 binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def role(rank: int, world_size: int) -> str:
    """The role string shown in ``ps`` for a rank: ``popplay rank R/N``."""
    return f"popplay rank {rank}/{world_size}"


def loopback_listener(clients: int) -> socket.socket:
    """A listening socket on 127.0.0.1 for a job's ``TCPStore`` (``master_listen_fd``):
    c10d's own would listen on every interface, with no authentication, and a port
    picked then released could be taken by another job in between."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(max(128, clients))
    return listener


def rank_environment(rank: int, world_size: int, port: int, threads: int,
                     base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one local rank (torchrun's variables plus ours)."""
    env = dict(os.environ if base is None else base)
    env.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0", "POPPLAY_LAUNCHED": "1", "POPPLAY_ROLE": role(rank, world_size),
        "POPPLAY_LAUNCHER_PID": str(os.getpid()),
        # Local jobs talk over loopback only (c10d has no authentication).
        "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", "lo"),
    })
    # The machine's cores are split between the ranks unless the user chose.
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        env.setdefault(name, str(threads))
    return env


def spawn_rank(rank: int, world_size: int, port: int, threads: int, module: str, role_text: str, args: list[str],
               *, stdout: Any = subprocess.DEVNULL, stderr: Any = subprocess.PIPE, pass_fds: tuple[int, ...] = (),
               extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start one local rank: ``python -m MODULE ROLE ARGS...`` with torchrun's
    environment (:func:`rank_environment`), its role first on its command line (``ps``
    shows it; the rank asks to die with this process), in its own session so that the
    terminal's Ctrl-C reaches it once, through the launcher. Every launcher starts its
    ranks here."""
    env = rank_environment(rank, world_size, port, threads)
    env["POPPLAY_ROLE"] = role_text
    env.update(extra_env or {})
    return subprocess.Popen([sys.executable, "-m", module, role_text, *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stderr, start_new_session=True, pass_fds=pass_fds)


@dataclass
class LocalRank:
    """One rank a launcher started: its process and what the launcher notes of it."""

    rank: int
    process: subprocess.Popen
    role: Any = None  # the launcher's own description of the rank (Gorila's Role)
    held: list[str] = field(default_factory=list)  # its "Error: ..." lines, shown only if it is the cause
    reader: threading.Thread | None = None
    exit_code: int | None = None  # once :meth:`LocalRanks.newly_ended` saw it end
    why: str | None = None  # how it was lost where its exit code does not say (the launcher killed it)


class LocalRanks:
    """A job's ranks as local processes, for every launcher (``--nproc``'s and Gorila's):
    started with :func:`spawn_rank`, polled, watched for ranks a signal stopped, and
    ended together (killed and reaped) however the launcher leaves. What a lost rank
    means is the launcher's policy: ``--nproc`` ends the job, Gorila goes on without a
    lost actor or learner."""

    def __init__(self) -> None:
        self.ranks: list[LocalRank] = []
        self.stopped = StoppedRanks()

    def __iter__(self) -> Any:
        return iter(self.ranks)

    def __len__(self) -> int:
        return len(self.ranks)

    def __getitem__(self, rank: int) -> LocalRank:
        return self.ranks[rank]

    def start(self, rank: int, world_size: int, port: int, threads: int, module: str, role_text: str,
              args: list[str], *, role: Any = None, forward_to: IO[str] | None = None, pipe_stderr: bool = True,
              stdout: Any = subprocess.DEVNULL, pass_fds: tuple[int, ...] = (),
              extra_env: dict[str, str] | None = None) -> LocalRank:
        """Start rank ``rank`` (:func:`spawn_rank`). With ``pipe_stderr`` its stderr is
        copied to ``forward_to`` (None: dropped) line by line, its ``Error:`` lines held
        back for the launcher's verdict; without, the rank writes to this stderr."""
        process = spawn_rank(rank, world_size, port, threads, module, role_text, args, stdout=stdout,
                             stderr=subprocess.PIPE if pipe_stderr else None, pass_fds=pass_fds, extra_env=extra_env)
        entry = LocalRank(rank, process, role)
        if pipe_stderr:
            entry.reader = threading.Thread(target=_forward, args=(process.stderr, forward_to, entry.held),
                                            daemon=True)
            entry.reader.start()
        self.ranks.append(entry)
        return entry

    def newly_ended(self) -> list[LocalRank]:
        """The ranks seen ended for the first time now (their ``exit_code`` set)."""
        ended = []
        for entry in self.ranks:
            if entry.exit_code is None:
                code = entry.process.poll()
                if code is not None:
                    entry.exit_code = code
                    ended.append(entry)
        return ended

    def running(self) -> list[LocalRank]:
        return [entry for entry in self.ranks if entry.process.poll() is None]

    def frozen(self, seconds: float) -> list[LocalRank]:
        """The running ranks a signal has stopped for more than ``seconds``."""
        self.stopped.update({entry.rank: entry.process.pid for entry in self.running()})
        return [self.ranks[rank] for rank in self.stopped.longer_than(seconds)]

    def kill(self, entries: list[LocalRank] | None = None) -> set[int]:
        """Kill ``entries`` (default: every rank) that still run; the ranks killed."""
        killed: set[int] = set()
        for entry in self.ranks if entries is None else entries:
            if entry.process.poll() is None:
                try:
                    entry.process.kill()
                    killed.add(entry.rank)
                except OSError:
                    pass
        return killed

    def close(self, timeout: float = 10.0) -> None:
        """Kill whatever still runs, reap every rank (its exit code noted) and let the
        stderr readers finish."""
        self.kill()
        for entry in self.ranks:
            try:
                entry.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            if entry.exit_code is None:
                entry.exit_code = entry.process.returncode
        for entry in self.ranks:
            if entry.reader is not None:
                entry.reader.join(timeout=5)


def _forward(stream: IO[bytes], target: IO[str] | None, held: list[str]) -> None:
    """Copy a rank's stderr line by line; hold back its error lines for the verdict."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        if line.startswith("Error:"):
            held.append(line.rstrip("\n"))
        elif target is not None:
            target.write(line)
            target.flush()
    stream.close()


def describe_status(code: int) -> str:
    """How a rank ended, in words (a signal by name)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def launch_local(argv: list[str], nproc: int, *, timeout: float = 60.0, threads_per_rank: int | None = None,
                 describe_lost: Callable[[], str] | None = None, module: str = "popplay.cli.rank",
                 stderr: IO[str] | None = None) -> int:
    """Run ``popplay ARGV`` as ``nproc`` local ranks and return the job's exit code.

    Args:
        argv: the command line after ``popplay`` (the ranks get it unchanged).
        nproc: number of ranks (>= 1).
        timeout: seconds a rank may go silent; also the bound on stopping the others
            after a loss (the ranks' process groups use the same timeout).
        threads_per_rank: numba/OpenMP threads per rank (default: usable cores // nproc, >= 1).
        describe_lost: called after a loss; its text ends the error line (e.g. where
            the last good checkpoint is).
        module: the module each rank runs with ``python -m`` (it receives the role
            string first, then ``argv``).
        stderr: where to write (default ``sys.stderr``).

    Returns:
        0 when every rank succeeded; rank 0's code when all stopped on their own
        (e.g. 130 after Ctrl-C, 2 for a usage error); :data:`LOST_EXIT` when a rank was
        lost (one line ``Error: rank R of N was lost (...)`` is printed).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1 (got {nproc})")
    out = stderr if stderr is not None else sys.stderr
    threads = threads_per_rank or max(1, usable_cores() // nproc)
    # The store's socket is bound here and handed to rank 0.
    listener = loopback_listener(nproc)
    port = int(listener.getsockname()[1])
    ranks = LocalRanks()
    interrupts = {"count": 0}

    def on_signal(signum: int, frame: object) -> None:
        interrupts["count"] += 1
        for r in ranks.running():
            try:
                r.process.send_signal(signal.SIGINT if interrupts["count"] == 1 else signal.SIGKILL)
            except OSError:
                pass

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread
            pass
    try:
        for rank in range(nproc):
            extra: dict[str, str] = {}
            passed: tuple[int, ...] = ()
            if rank == 0:
                extra["POPPLAY_STORE_FD"] = str(listener.fileno())
                passed = (listener.fileno(),)
            ranks.start(rank, nproc, port, threads, module, role(rank, nproc), argv,
                        forward_to=out if rank == 0 else None, stdout=None if rank == 0 else subprocess.DEVNULL,
                        pass_fds=passed, extra_env=extra)
            if rank == 0:
                listener.close()  # rank 0 holds it now
        return _watch(ranks, nproc, timeout, describe_lost, out, lambda: interrupts["count"] > 0)
    finally:
        listener.close()
        ranks.close()
        for sig, old in previous.items():
            signal.signal(sig, old)


def _watch(ranks: LocalRanks, nproc: int, timeout: float, describe_lost: Callable[[], str] | None,
           out: IO[str], interrupted: Callable[[], bool]) -> int:
    cause: LocalRank | None = None
    hung = False
    stop_deadline: float | None = None
    killed: set[int] = set()  # ranks this launcher stopped: their signal deaths are ours, not losses
    stopped_since = ranks.stopped
    while True:
        codes = [r.process.poll() for r in ranks]
        if all(code is not None for code in codes):
            break
        frozen = ranks.frozen(timeout)
        if frozen:
            killed = _stop_survivors(ranks, 0.0)
            cause, hung = frozen[0], True
            break
        failed = [r for r, code in zip(ranks, codes) if code is not None and code != 0]
        if interrupted() and not any(code is not None and code < 0 for code in codes):
            # Stopping on request: the ranks agree on the last phase, rank 0 saves; wait
            # for that (bounded), and only then count stragglers as lost.
            if stop_deadline is None:
                stop_deadline = time.monotonic() + timeout
            if time.monotonic() < stop_deadline:
                time.sleep(0.05)
                continue
            _stop_survivors(ranks, 0.0)
            continue
        if failed:
            first = _root_cause(failed)
            stopped = killed = _stop_survivors(ranks, min(timeout, _GRACE_SECONDS))
            # The survivors' own exits in the grace time may reveal a better cause (a
            # signal death); the ranks this launcher killed are never the cause.
            cause = _root_cause([r for r in ranks if r.process.returncode not in (0, None)
                                 and r.rank not in stopped]) or first
            if cause.process.returncode == PEER_LOST_EXIT and stopped:
                # Its peers saw it go silent and gave up; it never exited: a hung rank
                # (a rank seen stopped by a signal first: that is why it was silent).
                silent = [r for r in ranks if r.rank in stopped]
                cause = min(silent, key=lambda r: (r.rank not in stopped_since, r.rank))
                hung = True
            break
        time.sleep(0.05)
    for r in ranks:
        if r.reader is not None:
            r.reader.join(timeout=5)
    codes = [r.process.returncode for r in ranks]
    if cause is None:
        cause = _root_cause([r for r in ranks if r.process.returncode != 0]) if any(codes) else None
    if cause is None:
        return 0
    code = cause.process.returncode
    if hung:
        suffix = f"; {describe_lost()}" if describe_lost is not None else ""
        why = "stopped by a signal (SIGSTOP?)" if cause.rank in stopped_since else "stopped answering"
        out.write(f"Error: rank {cause.rank} of {nproc} was lost ({why}; no reply within "
                  f"{timeout:g}s); stopped the job{suffix}\n")
        out.flush()
        return LOST_EXIT
    lost = code < 0 or code == PEER_LOST_EXIT or any(c < 0 for r, c in zip(ranks, codes) if r.rank not in killed)
    if not lost and all(c == code or c == 0 for c in codes):
        # Every rank ended the same way on its own (a usage error, a stop): rank 0 speaks.
        speaker = ranks[0] if ranks[0].held or ranks[0].process.returncode == code else cause
        for line in speaker.held[:1]:
            out.write(line + "\n")
        out.flush()
        return code
    if not lost:
        # One rank failed for its own reason: show its error, say which rank it was.
        detail = cause.held[0][len("Error:"):].strip() if cause.held else describe_status(code)
        suffix = f"; {describe_lost()}" if describe_lost is not None else ""
        out.write(f"Error: rank {cause.rank} of {nproc} failed: {detail}{suffix}\n")
        out.flush()
        return code if code not in (0, None) else LOST_EXIT
    suffix = f"; {describe_lost()}" if describe_lost is not None else ""
    out.write(f"Error: rank {cause.rank} of {nproc} was lost ({describe_status(code)}); "
              f"stopped the job{suffix}\n")
    out.flush()
    return LOST_EXIT


def _is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (state ``T`` in ``/proc``; False
    where there is no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"T"
    except (OSError, IndexError):
        return False


class StoppedRanks:
    """The ranks a signal has stopped (SIGSTOP), and since when. Such a rank answers
    nothing, and its peers may wait where c10d's timeouts do not reach (a store
    connection during start-up): every launcher bounds that itself, by ``--timeout``,
    and names the stopped rank."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}

    def update(self, running: dict[int, int]) -> None:
        """Look again at the ranks still running (rank -> pid)."""
        now = time.monotonic()
        for rank in list(self._since):
            if rank not in running:
                del self._since[rank]
        for rank, pid in running.items():
            if _is_stopped(pid):
                self._since.setdefault(rank, now)
            else:
                self._since.pop(rank, None)

    def longer_than(self, seconds: float) -> list[int]:
        """The ranks stopped for more than ``seconds``."""
        now = time.monotonic()
        return [rank for rank, since in self._since.items() if now - since > seconds]

    def __contains__(self, rank: object) -> bool:
        return rank in self._since


def _root_cause(failed: list[LocalRank]) -> LocalRank | None:
    """The rank that failed first-hand: a signal death beats an error, an error beats
    a rank that only saw a peer vanish."""
    if not failed:
        return None

    def badness(r: LocalRank) -> int:
        code = r.process.returncode
        if code is not None and code < 0:
            return 0
        if code == PEER_LOST_EXIT:
            return 2
        return 1

    return min(failed, key=lambda r: (badness(r), r.rank))


def _stop_survivors(ranks: LocalRanks, grace: float) -> set[int]:
    """Give the others ``grace`` seconds to notice and exit, then kill them; return the
    ranks killed. Only rank 0 writes, atomically, so killing it cannot damage the last
    good checkpoint."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and ranks.running():
        time.sleep(0.05)
    killed = ranks.kill()
    for r in ranks:
        try:
            r.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    return killed
