"""A real two-node Slurm cluster on one Debian machine, as root: for trying cluster/capstone.sbatch locally.

    python cluster/local_slurm.py up      # install slurm-wlm + munge if missing, start, print the env to use
    python cluster/local_slurm.py check   # up, one 2-node job, down: a smoke test that leaves nothing behind

    with LocalSlurm() as cluster:                      # from Python (tests/cluster does this)
        job = cluster.sbatch(["cluster/capstone.sbatch"], env={"STEPS": "20"})
        state = cluster.wait(job, timeout=300)         # {"JobState": "COMPLETED", "ExitCode": "0:0", ...}

Two nodes, ``n1`` and ``n2``, are two ``slurmd -N`` daemons on localhost (Debian builds slurmd with
multiple-slurmd support), each on its own port and each declared with all the CPUs this process may use
(both nodes share them); ``task/affinity`` confines every task to the CPUs its step was given, as a real
cluster's task plugin does, so a task that gets fewer CPUs than its job shows it in ``sched_getaffinity``.
One ``slurmctld``, one ``munged`` with
its own key and socket, and every path (config, state, spool, logs) under one temporary folder. The
daemons run in the foreground as children of this process; ``stop()`` cancels the jobs, ends the
daemons and then every process that carries this cluster's marker in its environment (job steps, tasks),
so nothing is left running. Needs root, and Debian's apt-get unless Slurm is installed; checked on
Debian 12 (slurm-wlm 22.05) as root, without systemd.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")
MARKER = "LOCAL_SLURM_ROOT"  # in the environment of every daemon, job step and task this cluster starts


class ClusterError(RuntimeError):
    """The cluster did not come up, or a command against it failed; the message carries the log tails."""


def unavailable_reason() -> str | None:
    """Why a local cluster cannot run here (None if it can): it needs root, Linux with Debian's apt, or Slurm."""
    if sys.platform != "linux":
        return f"needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "needs root (slurmd runs jobs as any user; munged and apt need root here)"
    if missing_binaries() and not (Path("/etc/debian_version").exists() and shutil.which("apt-get")):
        return f"Slurm is not installed ({', '.join(missing_binaries())} missing) and this is not Debian with apt-get"
    return None


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def install(timeout: float = 600) -> float:
    """Install slurm-wlm and munge with apt when a binary is missing; returns the seconds it took (0 if none).

    ``--no-install-recommends`` keeps it to the daemons and client commands. Runs ``apt-get update`` only if
    the first install fails (package lists missing or stale)."""
    if not missing_binaries():
        return 0.0
    start = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    command = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if first.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, text=True, timeout=timeout)
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if second.returncode != 0:
            raise ClusterError(f"{' '.join(command)} failed ({second.returncode}):\n{second.stdout[-2000:]}{second.stderr[-2000:]}")
    if missing_binaries():
        raise ClusterError(f"installed {' '.join(PACKAGES)} but {', '.join(missing_binaries())} still missing")
    return time.monotonic() - start


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"({error})"


class LocalSlurm:
    """A Slurm cluster of `nodes` nodes (n1, n2, ...) on localhost; a context manager that starts and stops it."""

    def __init__(self, nodes: int = 2, root: str | os.PathLike[str] | None = None, slurmd_timeout: int = 10,
                 cpus: int | None = None) -> None:
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        # CPUs per node: by default the CPUs this process may use (slurmd -C on a 2-core machine says CPUs=2),
        # so that task/affinity binds tasks to real CPU ids. Every node claims the same CPUs.
        self.cpus = cpus or len(os.sched_getaffinity(0))
        self.root = Path(root or tempfile.mkdtemp(prefix="local-slurm-"))
        self.slurmd_timeout = slurmd_timeout
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket.2"
        self.daemons: dict[str, subprocess.Popen] = {}
        self.up_seconds: float | None = None  # from the start of the daemons to every node idle
        self.install_seconds = 0.0  # apt, when Slurm was missing

    # ----------------------------------------------------------------------------------- environment

    @property
    def env(self) -> dict[str, str]:
        """This process's environment plus what the Slurm commands need to reach this cluster."""
        return dict(os.environ, SLURM_CONF=str(self.conf), **{MARKER: str(self.root)})

    def command(self, *args: str, timeout: float = 30, check: bool = True) -> str:
        """Run a Slurm client command (sbatch, squeue, scontrol, ...) against this cluster; returns its stdout."""
        result = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(f"{' '.join(args)} exited {result.returncode}: {result.stderr.strip()}\n{self.diagnostics()}")
        return result.stdout

    # ------------------------------------------------------------------------------------ configuration

    def write_config(self) -> None:
        for sub in ("state", "log", "run", "munge", *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        r = self.root
        lines = [
            "ClusterName=local",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",  # no cgroups, no systemd here
            # task/affinity binds each task to its step's CPUs (sched_setaffinity) and needs no cgroups; with
            # task/none a task could use every CPU whatever it was given, and tests could not see it.
            "TaskPlugin=task/affinity",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            # A node that stops answering is DOWN after SlurmdTimeout (300 s by default) and its jobs end
            # NODE_FAIL; ReturnToService=2 puts it back when its slurmd registers again.
            f"SlurmdTimeout={self.slurmd_timeout}",
            "ReturnToService=2",
            "KillWait=5",
            "InactiveLimit=0",
            "MinJobAge=600",  # scontrol show job keeps a finished job this long (no accounting daemon)
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            *(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs={self.cpus} State=UNKNOWN"
              for n, p in zip(self.nodes, node_ports)),
            f"PartitionName=local Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------------------------ start and stop

    def _spawn(self, name: str, args: Sequence[str], node: str | None = None) -> None:
        env = self.env
        if node is not None:
            env["LOCAL_SLURM_NODE"] = node  # slurmd passes it to its slurmstepds: kill_node() finds them by it
        log = open(self.root / "log" / f"{name}.out", "ab")
        self.daemons[name] = subprocess.Popen(list(args), env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def start(self, timeout: float = 60) -> "LocalSlurm":
        """Install if needed, write the config, start munged, slurmctld and one slurmd per node; wait until idle."""
        reason = unavailable_reason()
        if reason:
            raise ClusterError(f"cannot start a local Slurm cluster: {reason}")
        self.install_seconds = install()
        start = time.monotonic()
        self.write_config()
        key = self.root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True, timeout=60)
        os.chmod(key, 0o600)
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self.root}/run/munged.pid",
                               f"--log-file={self.root}/log/munged.log", f"--seed-file={self.root}/munge/seed"])
        self._wait_for(lambda: self.munge_socket.exists(), "munged's socket", timeout)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait_for(lambda: "UP" in self.command("scontrol", "ping", check=False), "slurmctld (scontrol ping)", timeout)
        for node in self.nodes:
            self.start_node(node)
        self.wait_idle(timeout)
        self.up_seconds = time.monotonic() - start
        return self

    def start_node(self, node: str) -> None:
        """Start (or restart) the slurmd of `node`."""
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)], node=node)

    def wait_idle(self, timeout: float = 60, nodes: Sequence[str] | None = None) -> None:
        """Wait until every node in `nodes` (all by default) is idle."""
        nodes = list(nodes or self.nodes)
        seen: dict[str, str] = {}

        def idle() -> bool:
            seen.update({n: self.node_state(n) for n in nodes})
            return all(state == "idle" for state in seen.values())

        try:
            self._wait_for(idle, f"nodes {nodes} idle", timeout)
        except ClusterError as error:  # say what sinfo's short state said last (idle*, mix, comp, down ...)
            raise ClusterError(f"{error}\n--- last short states: {seen}") from None

    def node_state(self, node: str) -> str:
        out = self.command("sinfo", "-h", "-N", "-n", node, "-o", "%t", check=False).split()
        return out[0] if out else "?"

    def _wait_for(self, condition: Any, what: str, timeout: float, interval: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.daemons.items():
                if process.poll() is not None and not name.startswith("slurmd-"):
                    raise ClusterError(f"{name} exited with {process.returncode} while waiting for {what}\n{self.diagnostics()}")
            if condition():
                return
            time.sleep(interval)
        raise ClusterError(f"timed out after {timeout} s waiting for {what}\n{self.diagnostics()}")

    def stop(self, timeout: float = 30) -> None:
        """Cancel every job, end the daemons, then any process left with this cluster's marker. Idempotent."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=30)
        for name in ["slurmd-" + n for n in self.nodes] + ["slurmctld", "munged"]:
            process = self.daemons.get(name)
            if process is not None and process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in self.daemons.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.kill_marked(signal.SIGKILL)
        if not os.environ.get("LOCAL_SLURM_KEEP"):  # set it to read the logs afterwards
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalSlurm":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------------------ processes by marker

    def marked_processes(self, node: str | None = None) -> dict[int, str]:
        """Live processes this cluster started (daemons, job steps, tasks), found by the marker in their
        environment: ``{pid: command line}``; with `node`, only that node's."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = dict(item.partition(b"=")[::2] for item in (entry / "environ").read_bytes().split(b"\0") if item)
                status = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:  # gone, or not ours to read
                continue
            if status == "Z":
                continue  # already dead, waiting for its parent
            ours = environ.get(MARKER.encode()) == str(self.root).encode() or environ.get(b"SLURM_CONF") == str(self.conf).encode()
            on_node = node is None or node.encode() in (environ.get(b"LOCAL_SLURM_NODE"), environ.get(b"SLURMD_NODENAME"))
            if ours and on_node:
                found[int(entry.name)] = cmdline
        return found

    def kill_marked(self, sig: int = signal.SIGKILL, node: str | None = None) -> list[str]:
        """Send `sig` to every marked process (of `node`); returns "pid command" of each one signalled."""
        hit = []
        for pid, cmdline in self.marked_processes(node).items():
            try:
                os.kill(pid, sig)
                hit.append(f"{pid} {cmdline[:100]}")
            except ProcessLookupError:
                pass
        return hit

    def kill_node(self, node: str) -> list[str]:
        """A node failure: SIGKILL the slurmd of `node`, its job steps and their tasks, all at once."""
        hit = self.kill_marked(signal.SIGKILL, node)
        process = self.daemons.get(f"slurmd-{node}")
        if process is not None:
            process.kill()
            process.wait(timeout=10)
        return hit

    # -------------------------------------------------------------------------------------------- jobs

    def sbatch(self, args: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None) -> str:
        """Submit a batch job (``sbatch --parsable ARGS``) with this environment plus `env`; returns its id."""
        result = subprocess.run(["sbatch", "--parsable", *args], env={**self.env, **(env or {})}, cwd=cwd,
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise ClusterError(f"sbatch {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}\n{self.diagnostics()}")
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, NodeList, StdOut, ...); {} once forgotten."""
        out = self.command("scontrol", "show", "job", "-o", job_id, check=False)
        fields: dict[str, str] = {}
        for item in out.split():
            key, sep, value = item.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def wait(self, job_id: str, timeout: float = 300, until: Sequence[str] = ()) -> dict[str, str]:
        """Poll until the job has left the queue (or reached a state in `until`); returns its ``job()`` fields.

        Polls ``squeue`` every 0.2 s, as ``sbatch --wait`` (which backs off to 32 s) would not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.command("squeue", "-h", "-j", job_id, "-o", "%T", check=False).strip()
            if not state or state in until:
                return self.job(job_id)
            time.sleep(0.2)
        raise ClusterError(f"job {job_id} still {self.job(job_id).get('JobState')} after {timeout} s\n{self.diagnostics()}")

    def diagnostics(self, lines: int = 25) -> str:
        """The nodes, the queue and the tails of the daemons' logs: what to read when something went wrong."""
        parts = []
        if self.daemons.get("slurmctld") is not None and self.daemons["slurmctld"].poll() is None:
            for args in (("sinfo", "-N", "-l"), ("squeue", "-l")):
                result = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=30)
                parts.append(f"--- {' '.join(args)}\n{result.stdout}{result.stderr}")
        for log in sorted((self.root / "log").glob("*")):
            twin = log.with_suffix(".log")  # a daemon's .out repeats its .log, but also holds what it printed first
            if log.suffix == ".out" and twin.exists() and twin.stat().st_size > 0:
                continue
            parts.append(f"--- {log.name} (last {lines} lines)\n{_tail(log, lines)}")
        return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "check"], help="up: start and keep running; check: a 2-node job, then down")
    opts = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"local_slurm: skipped: {reason}")
        return 0
    seconds = install()
    if seconds:
        print(f"local_slurm: installed {' '.join(PACKAGES)} in {seconds:.0f} s")
    cluster = LocalSlurm()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops the cluster as Ctrl-C does
    try:
        cluster.start()
        print(f"local_slurm: {len(cluster.nodes)} nodes idle {cluster.up_seconds:.1f} s after start")
        if opts.action == "up":
            print(f"export SLURM_CONF={cluster.conf}\n(Ctrl-C stops the cluster)", flush=True)
            while True:
                time.sleep(3600)
        job = cluster.sbatch(["--nodes=2", "--ntasks-per-node=1", f"--output={cluster.root}/log/job-%j.out", "--wrap", "srun hostname; srun printenv SLURMD_NODENAME"])
        fields = cluster.wait(job, timeout=120)
        print(f"local_slurm: job {job} {fields.get('JobState')} exit {fields.get('ExitCode')}")
        return 0 if fields.get("JobState") == "COMPLETED" else 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
