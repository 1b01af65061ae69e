"""The cluster run's checks and placement as plain functions (no Ray needed: `make test` runs these), and the
evaluate stage's refusal of cells trained on different device kinds."""

from __future__ import annotations

import pytest

from ampbench.cluster.grid import (
    Cell,
    ClusterError,
    Node,
    Placement,
    check_nodes,
    check_store,
    eligible,
    pinned_torch,
    progress_line,
)
from ampbench.config.records import ArmSummary
from ampbench.stages.evaluate import check_fingerprints

CPU_NODE = {"CPU": 2.0, "memory": 1e9, "node:10.0.0.1": 1.0, "object_store_memory": 1e9}
GPU_NODE = {"CPU": 16.0, "GPU": 8.0, "accelerator_type:H100": 1.0, "h100": 8.0, "node:10.0.0.2": 1.0}


def test_a_placement_asks_ray_for_what_a_cell_needs():
    assert Placement().ray_options() == {"num_cpus": 1.0, "num_gpus": 0.0}
    gpu = Placement(cpus=4, gpus=1, accelerator_type="H100", resource="h100")
    assert gpu.ray_options() == {"num_cpus": 4, "num_gpus": 1, "accelerator_type": "H100",
                                 "resources": {"h100": 0.001}}
    assert gpu.fits(GPU_NODE) and not gpu.fits(CPU_NODE)
    assert Placement(cpus=2).fits(CPU_NODE) and not Placement(cpus=3).fits(CPU_NODE)
    assert not Placement(gpus=1, accelerator_type="A100").fits(GPU_NODE)
    assert gpu.describe() == "4 CPU, 1 GPU, accelerator_type H100, resource 'h100'"


def test_no_node_that_fits_is_one_line_naming_what_each_offers():
    nodes = [Node("a" * 40, "cpu-box", CPU_NODE), Node("b" * 40, "gpu-box", GPU_NODE)]
    assert [n.host for n in eligible(nodes, Placement(gpus=1), "head:6379")] == ["gpu-box"]
    with pytest.raises(ClusterError) as err:
        eligible(nodes, Placement(gpus=1, accelerator_type="H200"), "head:6379")
    msg = str(err.value)
    assert "\n" not in msg and "head:6379" in msg and "accelerator_type H200" in msg
    assert "aaaaaaaaaaaa (cpu-box): CPU 2" in msg and "accelerator_type:H100 1" in msg and "memory" not in msg


def test_sqlite_is_refused_for_more_than_one_node():
    one, two = [Node("a", "h", CPU_NODE)], [Node("a", "h", CPU_NODE), Node("b", "h", CPU_NODE)]
    check_store("sqlite:////p/mlflow.db", one)
    check_store("http://127.0.0.1:5001", two)
    with pytest.raises(ClusterError, match="SQLite file.*2 nodes.*make team-server"):
        check_store("sqlite:////p/mlflow.db", two)


def test_nodes_need_the_pinned_torch_and_the_heads_device_kind():
    assert pinned_torch("numpy==2.1.0\ntorch==2.14.1+cpu\ntorchvision==0.29.1\n") == "2.14.1"
    assert pinned_torch("numpy==2.1.0\n") is None
    hosts = {"n1": "a", "n2": "b"}
    good = {"n1": {"torch": "2.14.1", "device": "CPU: X"}, "n2": {"torch": "2.14.1+cu128", "device": "CPU: X"}}
    check_nodes(good, hosts, "2.14.1", "CPU: X")
    with pytest.raises(ClusterError, match=r"pinned torch 2\.14\.1: n2 \(b\): torch 2\.11\.0"):
        check_nodes({**good, "n2": {"torch": "2.11.0", "device": "CPU: X"}}, hosts, "2.14.1", "CPU: X")
    with pytest.raises(ClusterError, match=r"another device kind.*'NVIDIA H200'.*n1 \(a\): 'CPU: X'"):
        check_nodes(good, hosts, "2.14.1", "NVIDIA H200")


def test_a_landed_cell_says_where_and_how_far():
    line = progress_line(3, 4, Cell("bf16", 1), {"node": "f" * 40, "host": "w1", "seconds": 12.4,
                                                 "setup_seconds": 2.6})
    assert line == ("[bf16 seed 1] finished on node ffffffffffff (w1) in 12 s (3 s of it copying the project and "
                    "pulling the data) — 3 of 4 cells")


def _summary(arm: str, devices: dict[str, str | None]) -> ArmSummary:
    return ArmSummary.model_validate({
        "arm": arm, "skipped": None, "hardware": {"device_name": "CPU: X", "device_type": "cpu"},
        "seeds": {seed: {"run_id": f"{arm}{seed}", "device": device} for seed, device in devices.items()}})


def test_evaluate_refuses_cells_of_different_device_kinds():
    same = {"fp32": _summary("fp32", {"0": "NVIDIA H100", "1": "NVIDIA H100"}),
            "bf16": _summary("bf16", {"0": "NVIDIA H100", "1": None})}  # None: a summary from before the field
    check_fingerprints(same)
    mixed = {**same, "bf16": _summary("bf16", {"0": "NVIDIA H100", "1": "NVIDIA A100"})}
    with pytest.raises(Exception, match=r"different device kinds \(fp32 seed 0, fp32 seed 1, bf16 seed 0 on "
                                        r"'NVIDIA H100'; bf16 seed 1 on 'NVIDIA A100'\)"):
        check_fingerprints(mixed)
