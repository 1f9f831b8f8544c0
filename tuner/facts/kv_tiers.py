"""The KV tiers beyond the GPU that vLLM 0.33.0 runs (issue 27 item 1), and the link each one
loads over. Each figure carries its source.

Two ways into a tier, read from the pinned sources:

* **native CPU** (``--kv-offloading-size`` with ``--kv-offloading-backend native``, the
  default): ``vllm/config/vllm.py: _post_init_kv_transfer_config`` sets the
  ``OffloadingConnector`` with ``cpu_bytes_to_use = size GiB``; the region is one mmap file
  ``/dev/shm/vllm_offload_{engine_id}.mmap`` shared by the TP workers
  (``vllm/v1/kv_offload/cpu/shared_offload_region.py``), so ``/dev/shm`` holds it.
* **LMCache** (``--kv-transfer-config {"kv_connector":"LMCacheConnectorV1",...}``): vLLM's
  ``lmcache_connector.py`` imports ``lmcache.integration.vllm.vllm_v1_adapter`` from the
  ``lmcache`` package, which reads its configuration from the YAML file named by
  ``LMCACHE_CONFIG_FILE`` (else from ``LMCACHE_*`` variables;
  ``lmcache/integration/vllm/utils.py: lmcache_get_or_create_config``). Each TP worker builds
  its own engine, so ``max_local_cpu_size`` and ``max_local_disk_size`` are GB **per rank**
  (``lmcache/v1/cache_engine.py``: ``MixedMemoryAllocator(int(max_local_cpu_size *
  1024**3))``, pinned host memory, not ``/dev/shm``; the disk path is sharded ``by_gpu``).
  The disk and remote backends need the local CPU backend as their buffer
  (``lmcache/v1/storage_backend/__init__.py``: "Remote backend requires local CPU backend
  as a buffer").

  ``--kv-offloading-backend lmcache`` is *not* this: in vLLM 0.33.0 it selects
  ``LMCacheMPConnector``, which talks to a separate LMCache server process at
  ``tcp://localhost:5555`` and drops ``--kv-offloading-size`` ("the actual KV storage
  capacity is managed by the standalone LMCache server process"). kvtune renders the
  in-process connector, whose sizes it can set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvtune.tuner.errors import InvalidInput

TierKind = Literal["native-cpu", "lmcache-cpu", "lmcache-disk", "lmcache-remote"]
TIER_KINDS: tuple[TierKind, ...] = ("native-cpu", "lmcache-cpu", "lmcache-disk",
                                    "lmcache-remote")
LMCACHE_KINDS: tuple[TierKind, ...] = ("lmcache-cpu", "lmcache-disk", "lmcache-remote")

# The lmcache release kvtune renders for: the newest on PyPI beside vLLM 0.33.0. vLLM 0.33.0
# pins no lmcache (its METADATA has no lmcache requirement); lmcache 0.5.6's wheel ships
# ``lmcache/integration/vllm/vllm_v1_adapter.py: LMCacheConnectorV1Impl``, the class vLLM
# 0.33.0's ``LMCacheConnectorV1`` imports, and every ``lmcache.v1`` name vLLM's in-tree
# adapter (``lmcache_integration/vllm_v1_adapter.py``) imports.
LMCACHE_VERSION = "0.5.6"
LMCACHE_SOURCE = ("lmcache 0.5.6 (PyPI wheel lmcache-0.5.6-cp311-cp311-manylinux_2_28_x86_64): "
                  "lmcache/v1/config.py _CONFIG_DEFINITIONS")
# lmcache/v1/config.py: "chunk_size": {"type": int, "default": 256}: tokens per stored chunk.
LMCACHE_CHUNK_TOKENS = 256
# lmcache/v1/config.py: "remote_serde": default "naive" (raw tensors; vLLM's adapter asserts
# the serde is "naive" or None for its GPU connector).
LMCACHE_REMOTE_SERDE = "naive"
LMCACHE_CONNECTOR = "LMCacheConnectorV1"
# Where the rendered pod mounts the config file and the disk tier.
LMCACHE_CONFIG_PATH = "/etc/lmcache/lmcache.yaml"
LMCACHE_DISK_PATH = "/var/cache/lmcache/"
# The CPU buffer the disk and remote tiers keep in front of them, GiB per rank: LMCache's
# own default (lmcache/v1/config.py "max_local_cpu_size": default 5.0).
LMCACHE_BUFFER_GIB_PER_RANK = 5.0
# A remote store's GiB one replica may fill when the caller names the store and no size
# (kvtune's choice, not lmcache's: the store's size is the platform's).
LMCACHE_REMOTE_DEFAULT_GIB = 1024.0
# The remote stores kvtune weighs, as lmcache 0.5.6 names them: ``remote_url`` is parsed by
# ``lmcache/v1/storage_backend/connector/__init__.py: parse_remote_url``, which asserts a host
# and a port, and dispatched on its scheme to ``lm_adapter`` (``lm://``, LMCache's own
# server), ``redis_adapter`` and ``mooncakestore_adapter``. The other schemes it accepts (s3,
# fs, infinistore, ...) have links the simulator does not model; credentials in the URL would
# sit in a spec anyone reading it sees, so none are accepted.
LMCACHE_REMOTE_SCHEMES = ("lm", "redis", "mooncakestore")
LMCACHE_REMOTE_URL_PATTERN = (r"^(lm|redis|mooncakestore)://"
                              r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}$")
LMCACHE_REMOTE_URL_FIX = ("name the store as lmcache 0.5.6 does, host and port: lm://host:port "
                          "(or redis://host:port, mooncakestore://host:port)")

_GB = 1_000_000_000
# A data-centre U.2 NVMe drive on PCIe Gen4 x4: Samsung PM9A3 3.84 TB, 6,900 MB/s sequential
# read (Samsung PM9A3 datasheet, https://semiconductor.samsung.com/ssd/datacenter-ssd/pm9a3/).
# An emptyDir lives on one node filesystem; kvtune takes one drive's rate (a RAID-0 of the
# DGX's eight data drives reads faster: pass a larger rate when the node has one).
NVME_READ_BYTES_PER_SECOND = 6_900_000_000
NVME_SOURCE = ("one PCIe Gen4 U.2 NVMe drive: Samsung PM9A3 3.84 TB datasheet, 6,900 MB/s "
               "sequential read (https://semiconductor.samsung.com/ssd/datacenter-ssd/pm9a3/)")
# The remote store (lm://, redis://) is reached over the node's in-band Ethernet, not the
# GPUs' compute NICs: DGX H100/H200 user guide, "2x dual-port QSFP112 ConnectX-7 ... up to
# 400 Gb/s" for storage and in-band traffic; one port, 50 GB/s, shared by the node's 8 GPUs.
REMOTE_NODE_BYTES_PER_SECOND = 50 * _GB
REMOTE_GPUS_PER_NODE = 8
REMOTE_SOURCE = ("node in-band NIC: one 400 Gb/s ConnectX-7 port (DGX H100 user guide, "
                 "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html"
                 "), 50 GB/s shared by 8 GPUs")


@dataclass(frozen=True, slots=True)
class TierLink:
    """How fast one tier's chunks reach the GPUs of a replica: the medium's rate, shared by
    the replica's TP ranks, then each rank's host link (PCIe)."""

    medium: str  # "PCIe", "NVMe", "network"
    medium_bytes_per_second: float  # what the whole replica gets of the medium
    host_link_bytes_per_second: float  # per rank
    source: str

    def seconds_per_block(self, page_bytes_per_rank: int, tensor_parallel: int) -> float:
        """Seconds to load one block (``page_bytes_per_rank`` on each of the ranks): the
        ranks read their shares off the shared medium, then each crosses its own PCIe link
        (the two hops in series, LMCache's disk and remote backends staging in host memory)."""
        host = page_bytes_per_rank / self.host_link_bytes_per_second
        if self.medium == "PCIe":
            return host
        return page_bytes_per_rank * tensor_parallel / self.medium_bytes_per_second + host


def tier_link(kind: TierKind, host_link_bytes_per_second: int | None, host_link_source: str,
              tensor_parallel: int) -> TierLink | None:
    """The link a tier of ``kind`` loads over for a replica of ``tensor_parallel`` GPUs; None
    when the GPU class has no host-link fact (the tier is then not simulated)."""
    if not host_link_bytes_per_second:
        return None
    host = float(host_link_bytes_per_second)
    if kind in ("native-cpu", "lmcache-cpu"):
        return TierLink("PCIe", host, host, host_link_source)
    if kind == "lmcache-disk":
        return TierLink("NVMe", float(NVME_READ_BYTES_PER_SECOND), host,
                        f"{NVME_SOURCE}; then {host_link_source}")
    if kind == "lmcache-remote":
        share = REMOTE_NODE_BYTES_PER_SECOND * min(tensor_parallel, REMOTE_GPUS_PER_NODE)
        return TierLink("network", share / REMOTE_GPUS_PER_NODE, host,
                        f"{REMOTE_SOURCE}; then {host_link_source}")
    raise InvalidInput("kv_tier", kind, f"must be one of {', '.join(TIER_KINDS)}")


def check_kind(kind: str) -> TierKind:
    """``kind`` as a ``TierKind``, or the one-line error naming the kinds."""
    for known in TIER_KINDS:
        if kind == known:
            return known
    raise InvalidInput("kv_tier", kind, f"must be one of {', '.join(TIER_KINDS)}")
