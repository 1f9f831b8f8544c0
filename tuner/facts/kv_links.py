"""The links a prefill engine's KV cache crosses to reach a decode engine, per GPU class:
NVLink within a node (NIXL moves it GPU to GPU over UCX's CUDA IPC), the RDMA NIC beside each
GPU between nodes (GPUDirect RDMA). Line rates, one direction, per GPU: each TP rank of a
decode engine pulls its own share of a request's KV over its own link at once
(``nixl/base_worker.py``: one transfer per local rank and remote rank), so a transfer takes
``per-rank KV bytes / link rate``. Line rate is the ceiling; NIXL reaches less (headers,
descriptor setup, the notification round trip), so transfer times here are lower bounds.

Classes without a row have no fact: ``kvtune plan --disaggregate`` asks for ``--kv-link-gbps``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtune.tuner.errors import InvalidInput

_GB = 1_000_000_000


@dataclass(frozen=True, slots=True)
class FabricFacts:
    """One GPU class's scale-up (NVLink) and scale-out (RDMA NIC) links, per GPU and direction."""

    gpus_per_node: int
    nvlink_bytes_per_second: int
    nvlink_source: str
    rdma_bytes_per_second: int
    rdma_source: str


@dataclass(frozen=True, slots=True)
class KVLink:
    """The link a KV transfer takes, and why."""

    fabric: str  # "NVLink", "RDMA" or "declared"
    bytes_per_second: float
    source: str

    def __post_init__(self) -> None:
        if not self.bytes_per_second > 0:
            raise InvalidInput("kv_link_bytes_per_second", self.bytes_per_second,
                               "must be > 0; pass --kv-link-gbps with the link's Gb/s per GPU")


_HOPPER_NVLINK = ("NVLink 4: 900 GB/s per GPU, both directions together (NVIDIA H100/H200 "
                  "datasheets, https://www.nvidia.com/en-us/data-center/h200/): 450 GB/s each "
                  "way")
_CX7 = ("one ConnectX-7 400 Gb/s NIC per GPU (DGX H100/H200 user guide, "
        "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html: 8 x "
        "single-port ConnectX-7, up to 400 Gb/s InfiniBand/Ethernet): 50 GB/s each way")

FABRICS: dict[str, FabricFacts] = {
    "H100": FabricFacts(8, 450 * _GB, _HOPPER_NVLINK, 50 * _GB, _CX7),
    "H200": FabricFacts(8, 450 * _GB, _HOPPER_NVLINK, 50 * _GB, _CX7),
    "B200": FabricFacts(
        8, 900 * _GB,
        "NVLink 5: 1.8 TB/s per GPU, both directions (DGX B200, "
        "https://www.nvidia.com/en-us/data-center/dgx-b200/): 900 GB/s each way",
        50 * _GB,
        "8 x single-port ConnectX-7 400 Gb/s, one per GPU (DGX B200 user guide, "
        "https://docs.nvidia.com/dgx/dgxb200-user-guide/introduction-to-dgxb200.html): "
        "50 GB/s each way"),
    "A100-80GB": FabricFacts(
        8, 300 * _GB,
        "NVLink 3: 600 GB/s per GPU, both directions (A100 datasheet, "
        "https://www.nvidia.com/en-us/data-center/a100/): 300 GB/s each way",
        25 * _GB,
        "8 x single-port ConnectX-6 200 Gb/s, one per GPU (DGX A100 user guide, "
        "https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html): "
        "25 GB/s each way"),
}


def kv_link(gpu_class: str, gpus: int, declared_gbps: float | None = None,
            nodes: int = 1) -> KVLink:
    """The link between the roles of a ``gpus``-GPU group laid over ``nodes`` nodes: NVLink
    when it sits on one node of the class, else the RDMA NIC; ``declared_gbps`` (Gb/s per GPU,
    one way) overrides both."""
    if declared_gbps is not None:
        return KVLink("declared", declared_gbps * _GB / 8,
                      f"declared: {declared_gbps:g} Gb/s per GPU")
    facts = FABRICS.get(gpu_class)
    if facts is None:
        raise InvalidInput("gpu", gpu_class,
                           "kvtune has no NVLink/NIC fact for this class; pass --kv-link-gbps "
                           "with the Gb/s per GPU between the prefill and decode engines")
    if nodes == 1 and gpus <= facts.gpus_per_node:
        return KVLink("NVLink", float(facts.nvlink_bytes_per_second), facts.nvlink_source)
    return KVLink("RDMA", float(facts.rdma_bytes_per_second), facts.rdma_source)
