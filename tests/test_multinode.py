"""A real two-node Ray cluster on this machine: a head and a second node, each its own `ray
start` (one CPU each, token auth, a custom resource naming the node: `node_a`, `node_b`), the
service's runner pointed at the head through RAY_ADDRESS, a sweep whose eight one-CPU trials
therefore run two at a time, one per node. Where they ran comes from Ray's state API (the
trainable actors' nodes, and how many `train` calls each node ran); every row comes from
Postgres."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter

import pytest
from cluster_support import BIN, RayNode, ray_env
from expected_rows import expected_keys, row_keys
from support import isosweep_command

from service.spec import parse_spec
from service.store import Store

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.postgres]

# Eight trials of a few seconds each (two epochs of a depth-8 network on digits), each alone
# (pack 1) on one CPU: with one CPU per node, the second trial at once needs the second node.
SPEC = {
    "name": "two-nodes",
    "parameters": {"depth": 8, "width": 48, "batch_size": 50, "epochs": 2, "norm": "batch"},
    "seeds": 8,
    "resources": {"cpu": 1, "gpu": 0},
    "pack": 1,
}


@pytest.fixture(scope="module")
def cluster():
    env = ray_env(nodes=2)
    head = RayNode(env, cpus=1, label="node_a")
    nodes = [head]
    try:
        nodes.append(RayNode(env, cpus=1, label="node_b", head=head))
        yield head
    finally:
        for node in reversed(nodes):
            node.stop()


LIST_OPTIONS = ("--detail", "--format", "json", "--limit", "10000")


def ray_list(head: RayNode, what: str) -> list[dict]:
    """`ray list <what> --detail` of the cluster, through its dashboard (the state API)."""
    out = subprocess.run(
        [str(BIN / "ray"), "list", what, "--address", head.dashboard, *LIST_OPTIONS],
        env=head.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def wait_for_nodes(head: RayNode, n: int, timeout_s: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [x for x in ray_list(head, "nodes") if x["state"] == "ALIVE"]
        if len(alive) >= n or time.monotonic() > deadline:
            return alive
        time.sleep(1)


def test_a_sweep_runs_on_both_nodes_into_postgres(cluster, postgres_url):
    nodes = wait_for_nodes(cluster, 2)
    label = {
        x["node_id"]: next(k for k in ("node_a", "node_b") if k in x["resources_total"])
        for x in nodes
    }
    assert sorted(label.values()) == ["node_a", "node_b"], nodes
    with Store(postgres_url) as store:
        sweep = store.create_sweep(parse_spec(SPEC))
    result = subprocess.run(
        [*isosweep_command(), "runner", "--once", "--database-url", postgres_url],
        env={**cluster.env, "RAY_ADDRESS": cluster.address},
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "Connecting to existing Ray cluster" in log, log[-2000:]

    # where the trials ran: the trainable actors (Tune's trial workers) and their `train` calls
    tasks = [
        t
        for t in ray_list(cluster, "tasks")
        if t["type"] == "ACTOR_TASK" and t["name"].endswith(".train")
    ]
    per_node = Counter(label[t["node_id"]] for t in tasks if t["node_id"] in label)
    actors = {
        a["actor_id"]: label.get(a["node_id"])
        for a in ray_list(cluster, "actors")
        if any(t["actor_id"] == a["actor_id"] for t in tasks)
    }
    print(f"train calls per node: {dict(per_node)}; trial actors: {Counter(actors.values())}")
    assert set(per_node) == {"node_a", "node_b"}, (per_node, tasks[:3])
    assert set(actors.values()) == {"node_a", "node_b"}

    with Store(postgres_url, migrate=False) as store:
        info = store.get_sweep(sweep.id)
        assert info.status == "completed", info
        trials, total = store.list_trials(sweep.id, limit=1000)
        assert total == 8 and {t.status for t in trials} == {"completed"}
        assert {t.config["seed"] for t in trials} == set(range(8))
        keys = row_keys(store.read_metrics(sweep.id))
        assert len(keys) == len(set(keys)) and set(keys) == expected_keys(trials)
        assert info.estimate is not None and info.estimate.trials == 8
