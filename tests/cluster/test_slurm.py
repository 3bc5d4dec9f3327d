"""The capstone on a real two-node Slurm cluster on this machine: cluster/capstone.sbatch under srun + torchrun.

Run by name only (`make test-cluster`; tests/conftest.py leaves this folder out of `make test`): it needs
root on Debian, installs slurm-wlm and munge with apt when missing, and starts munged, slurmctld and two
slurmds (cluster/local_slurm.py), which the module's fixture stops again, checking nothing is left running.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "cluster"))

import local_slurm  # noqa: E402

from course_lib import capstone, checkpoint  # noqa: E402

REASON = local_slurm.unavailable_reason()
pytestmark = [pytest.mark.cluster, pytest.mark.skipif(REASON is not None, reason=f"local Slurm cluster: {REASON}")]

SCRIPT = str(REPO / "cluster" / "capstone.sbatch")
SMALL = {"BATCH_SIZE": "256", "NUM_TRAIN": "20000"}  # a few seconds of training; most of a job is `import torch`
JOB_TIMEOUT = 600  # two cores, shared with whatever else runs: generous


@pytest.fixture(scope="module")
def cluster():
    slurm = local_slurm.LocalSlurm(nodes=2)
    try:
        slurm.start(timeout=120)
        print(f"\nlocal Slurm: installed in {slurm.install_seconds:.1f} s; 2 nodes idle {slurm.up_seconds:.2f} s after start")
        yield slurm
    finally:
        slurm.stop()
        left = slurm.marked_processes()
        assert not left, f"processes left running after the cluster stopped: {left}"


def submit(cluster: local_slurm.LocalSlurm, folder: Path, sbatch_args: tuple[str, ...] = (), **options: object) -> str:
    """Submit cluster/capstone.sbatch with `options` (its environment variables); batch output and
    per-rank logs go under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**SMALL, **{k: str(v) for k, v in options.items()}, "LOG_DIR": str(folder / "ranks"),
           "GLOO_SOCKET_IFNAME": "lo"}  # one machine: keep gloo on loopback
    return cluster.sbatch([f"--output={folder}/%x-%j.out", *sbatch_args, SCRIPT], env=env, cwd=str(REPO))


def rank_logs(folder: Path) -> dict[str, str]:
    """Every rank's stdout and stderr as torchrun wrote them (ranks/<node>/<run>/attempt_0/<local rank>/)."""
    return {str(p.relative_to(folder)): p.read_text(errors="replace") for p in sorted((folder / "ranks").rglob("*.log"))}


def results(folder: Path) -> list[dict]:
    """What each rank returned, by rank."""
    found = [value for text in rank_logs(folder).values() for value in capstone.returned(text)]
    return sorted(found, key=lambda value: value["rank"])


def explain(cluster: local_slurm.LocalSlurm, job: str, folder: Path) -> str:
    """What to read when a check fails: the job's fields, its batch output, the rank logs, the daemons' logs."""
    parts = [f"job {job}: {cluster.job(job)}"]
    for out in sorted(folder.glob("*.out")):
        parts.append(f"--- {out.name}\n{out.read_text(errors='replace')[-4000:]}")
    for name, text in rank_logs(folder).items():
        parts.append(f"--- {name}\n{text[-2000:]}")
    parts.append(cluster.diagnostics())
    return "\n".join(parts)


def test_capstone_runs_on_two_nodes(cluster, tmp_path):
    job = submit(cluster, tmp_path, STEPS=30)
    fields = cluster.wait(job, timeout=JOB_TIMEOUT)
    assert (fields.get("JobState"), fields.get("ExitCode")) == ("COMPLETED", "0:0"), explain(cluster, job, tmp_path)
    assert fields.get("NodeList") == "n[1-2]"
    values = results(tmp_path)
    assert [(v["rank"], v["world_size"], v["steps"]) for v in values] == [(0, 2, 30), (1, 2, 30)], explain(cluster, job, tmp_path)
    assert sorted(v["node"] for v in values) == [0, 1]  # one rank on each node
    assert {name.split("/")[1] for name in rank_logs(tmp_path)} == {"n1", "n2"}  # each node logs into its own folder
    assert values[0]["auc"] == values[1]["auc"] > 0.5  # the AUC of all ranks' scores, on every rank
    assert all(v["last_loss"] < v["first_loss"] for v in values), values


def test_a_failing_job_ends_failed_with_its_exit_code(cluster, tmp_path):
    # 100 training rows make no step of 256 rows x 2 ranks: train() raises on every rank.
    job = submit(cluster, tmp_path, STEPS=10, NUM_TRAIN=100)
    fields = cluster.wait(job, timeout=JOB_TIMEOUT)
    assert fields.get("JobState") == "FAILED" and fields.get("ExitCode") != "0:0", explain(cluster, job, tmp_path)
    batch_output = "".join(p.read_text() for p in tmp_path.glob("*.out"))
    assert "capstone: srun exited with 1" in batch_output, explain(cluster, job, tmp_path)
    assert "make no step" in "".join(rank_logs(tmp_path).values()), explain(cluster, job, tmp_path)


def job_processes(cluster: local_slurm.LocalSlurm, timeout: float = 30) -> list[str]:
    """The job processes (steps, torchrun, ranks) still running after up to `timeout` s (killed ones linger
    a moment before their parents reap them)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [c for c in cluster.marked_processes().values() if "python" in c or "slurmstepd" in c or "srun" in c]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def wait_for_checkpoint(cluster: local_slurm.LocalSlurm, job: str, folder: Path, store: Path) -> None:
    """Wait until the running `job` has saved a complete checkpoint into `store`."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while checkpoint.latest(store) is None:
        assert time.monotonic() < deadline, f"no checkpoint after {JOB_TIMEOUT} s\n{explain(cluster, job, folder)}"
        assert cluster.job(job).get("JobState") in ("PENDING", "RUNNING"), explain(cluster, job, folder)
        time.sleep(0.2)
    assert cluster.job(job).get("JobState") == "RUNNING", explain(cluster, job, folder)


def test_scancel_ends_every_rank(cluster, tmp_path):
    store = tmp_path / "checkpoints"
    job = submit(cluster, tmp_path, STEPS=100_000, CHECKPOINT_DIR=store, CHECKPOINT_EVERY=5)
    wait_for_checkpoint(cluster, job, tmp_path, store)  # the ranks are training
    cluster.command("scancel", job)
    fields = cluster.wait(job, timeout=120)
    assert fields.get("JobState") == "CANCELLED", explain(cluster, job, tmp_path)
    assert job_processes(cluster) == [], explain(cluster, job, tmp_path)


def cpu_list(text: str) -> set[int]:
    """A Slurm/Linux CPU list ("0-1,4") as a set of CPU ids."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def allocated_cpus(cluster: local_slurm.LocalSlurm, job: str) -> dict[str, set[int]]:
    """The CPUs the running `job` holds on each node (``scontrol -d show job``: "Nodes=n[1-2] CPU_IDs=0-1").
    Slurm's CPU ids are machine CPU ids here: one socket's cores, numbered as Linux numbers them."""
    out = cluster.command("scontrol", "-d", "show", "job", job)
    found = {}
    for nodes, ids in re.findall(r"Nodes=(\S+) CPU_IDs=(\S+)", out):
        for node in cluster.command("scontrol", "show", "hostnames", nodes).split():
            found[node] = cpu_list(ids)
    return found


def rank_cpus(cluster: local_slurm.LocalSlurm, node: str) -> dict[int, set[int]]:
    """The CPUs each rank (not its torchrun) on `node` may run on: ``os.sched_getaffinity`` of its pid."""
    found = {}
    for pid, cmdline in cluster.marked_processes(node).items():
        if "course_lib.run" in cmdline and "torch.distributed.run" not in cmdline:
            try:
                found[pid] = os.sched_getaffinity(pid)
            except ProcessLookupError:
                pass
    return found


@pytest.mark.parametrize("sbatch_args", [("--exclusive",), ()], ids=["exclusive", "plain"])
def test_each_rank_may_use_every_cpu_its_job_has_on_the_node(cluster, tmp_path, sbatch_args):
    # Neither submission passes --cpus-per-task, so SLURM_CPUS_PER_TASK is unset; with --exclusive the job
    # holds every CPU of both nodes, and the one task per node must get all of them for its ranks.
    if sbatch_args and cluster.cpus < 2:
        pytest.skip("nodes of one CPU: a task given one CPU looks like a task given all of them")
    job = submit(cluster, tmp_path, sbatch_args, STEPS=100_000)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        while not all(rank_cpus(cluster, node) for node in cluster.nodes):  # torchrun has started the ranks
            assert time.monotonic() < deadline, explain(cluster, job, tmp_path)
            assert cluster.job(job).get("JobState") in ("PENDING", "RUNNING"), explain(cluster, job, tmp_path)
            time.sleep(0.2)
        allocated = allocated_cpus(cluster, job)
        ranks = {node: rank_cpus(cluster, node) for node in cluster.nodes}
    finally:
        cluster.command("scancel", job, check=False)  # the ranks need not train: their CPUs are set
    print(f"\n{' '.join(sbatch_args) or 'plain'}: job {job} allocated {allocated}; ranks may use {ranks}")
    assert sorted(allocated) == cluster.nodes, explain(cluster, job, tmp_path)
    if sbatch_args == ("--exclusive",):
        assert all(len(cpus) == cluster.cpus for cpus in allocated.values()), allocated  # whole nodes
    for node in cluster.nodes:
        for pid, cpus in ranks[node].items():
            assert cpus == allocated[node], \
                f"rank {pid} on {node} may use CPUs {sorted(cpus)}, the job has {sorted(allocated[node])} there"
    assert cluster.wait(job, timeout=120).get("JobState") == "CANCELLED", explain(cluster, job, tmp_path)
    assert job_processes(cluster) == [], explain(cluster, job, tmp_path)


def test_a_node_failure_fails_the_job_and_the_resubmitted_job_resumes(cluster, tmp_path):
    store = tmp_path / "checkpoints"
    options = {"STEPS": 60, "CHECKPOINT_DIR": store, "CHECKPOINT_EVERY": 10}
    first = tmp_path / "first"
    # --no-requeue: Slurm would otherwise put a batch job that lost a node back in the queue by itself.
    job = submit(cluster, first, ("--no-requeue",), **options)
    wait_for_checkpoint(cluster, job, first, store)

    killed = cluster.kill_node("n2")  # n2's slurmd, its job step, torchrun and rank: a node that lost power
    assert any("torch.distributed.run" in k for k in killed) and any("course_lib.run" in k for k in killed), killed
    start = time.monotonic()
    fields = cluster.wait(job, timeout=180)
    took = time.monotonic() - start
    print(f"\nnode n2 killed: job {job} {fields.get('JobState')} exit {fields.get('ExitCode')} after {took:.1f} s")
    assert fields.get("JobState") in ("NODE_FAIL", "FAILED"), explain(cluster, job, first)
    assert fields.get("ExitCode") != "0:0", explain(cluster, job, first)
    assert took < 120  # SlurmdTimeout=10: Slurm declares n2 down within about 3 of its pings

    assert job_processes(cluster) == [], explain(cluster, job, first)

    saved = checkpoint.latest(store)
    saved_step = int(saved.name.removeprefix("step_"))
    assert 0 < saved_step < 60
    cluster.start_node("n2")  # the node is back (ReturnToService=2 makes it usable as soon as it registers)
    # n2 must be back; n1 may still show `mix` for a while after the failed job (seen under load: its cleanup
    # of the NODE_FAIL job lags), which does not stop the resubmission: a node has 2 CPUs, the job needs 1.
    try:
        cluster.wait_idle(timeout=20, nodes=["n2"])
    except local_slurm.ClusterError:  # seen under load: the restarted slurmd's registration is lost, and slurmctld pings a
        cluster.command("scontrol", "reconfigure")  # DOWN node only rarely; reconfigure makes every slurmd register
        cluster.wait_idle(timeout=120, nodes=["n2"])
    assert cluster.node_state("n1") in ("idle", "mix"), cluster.diagnostics()

    second = tmp_path / "second"
    job = submit(cluster, second, **options)  # the same submission again
    fields = cluster.wait(job, timeout=JOB_TIMEOUT)
    assert (fields.get("JobState"), fields.get("ExitCode")) == ("COMPLETED", "0:0"), explain(cluster, job, second)
    values = results(second)
    assert [(v["rank"], v["resumed_from"], v["steps"]) for v in values] == [(0, saved_step, 60), (1, saved_step, 60)], \
        explain(cluster, job, second)
    assert values[0]["auc"] == values[1]["auc"]
    assert values[0]["checkpoint"] == str(store / checkpoint.step_folder(60))
