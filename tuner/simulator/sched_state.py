"""The scheduler's data: the engine configuration it honours and a request inside the engine.

(``scheduler.py`` says how the scheduler runs; this module holds only what every run mode
reads.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.workload import SimRequest

Allocation = Literal["paged", "contiguous"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The vLLM knobs the simulator honours, plus the KV-cache size they lead to."""

    num_gpu_blocks: int  # including vLLM's null block 0
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool = True
    allocation: Allocation = "paged"
    # vLLM 0.33's default engine loop: batch N+1 is scheduled before batch N's output is
    # processed (see the module doc); False is the synchronous loop.
    async_scheduling: bool = False
    # ``--kv-offloading-size`` (``offload.py``): the CPU tier's chunks (one GPU block each;
    # 0: off) and the seconds one chunk takes to load over the host link.
    cpu_offload_blocks: int = 0
    offload_load_seconds_per_block: float = 0.0
    # Pipeline parallel (``--pipeline-parallel-size``; ``sched_pipeline.py``): the stages,
    # and the seconds one token's activations take from one stage to the next.
    pipeline_parallel: int = 1
    pipeline_send_seconds_per_token: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_gpu_blocks", "block_size", "max_num_seqs",
                     "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value <= 0:
                raise InvalidInput(name, value, "must be > 0")
        if self.cpu_offload_blocks < 0 or self.offload_load_seconds_per_block < 0:
            raise InvalidInput("cpu_offload_blocks", self.cpu_offload_blocks,
                               "the CPU tier and its load time must be >= 0")
        if self.pipeline_parallel < 1 or self.pipeline_send_seconds_per_token < 0:
            raise InvalidInput("pipeline_parallel", self.pipeline_parallel,
                               "needs at least one stage and a send time >= 0")
        if self.pipeline_parallel > 1 and self.cpu_offload_blocks:
            raise InvalidInput("cpu_offload_blocks", self.cpu_offload_blocks,
                               "the pipeline-parallel replay has no CPU tier; set it to 0")
        if self.num_gpu_blocks < 2:
            raise InvalidInput("num_gpu_blocks", self.num_gpu_blocks,
                               "needs the null block plus one usable block; give the KV "
                               "cache more memory")
        if self.allocation == "contiguous" and self.kv_cache_tokens < self.max_model_len:
            raise InvalidInput(
                "max_model_len", self.max_model_len,
                f"one contiguous reservation needs {self.max_model_len} token slots but the "
                f"KV cache has {self.kv_cache_tokens}; lower max-model-len or give the KV "
                "cache more memory",
            )

    @property
    def kv_cache_tokens(self) -> int:
        return (self.num_gpu_blocks - 1) * self.block_size


# An empty block table / key list (shared: arrays are replaced, never changed in place).
NO_BLOCKS = np.zeros(0, dtype=np.int64)
NO_BLOCKS.flags.writeable = False
# What an admission found in the CPU tier (``OffloadScheduler._load_from_cpu``).
LOAD_NONE, LOAD_STARTED, LOAD_BLOCKED, LOAD_DEFER = "none", "started", "blocked", "defer"


class RequestState:
    """A request inside the engine (vLLM's ``Request``: num_tokens, num_computed_tokens)."""

    __slots__ = (
        "admitted",
        "block_buffer",
        "blocks",
        "cached_tokens",
        "cohort_generated",
        "cohort_tick",
        "cohort_tokens",
        "finish_seconds",
        "first_token_seconds",
        "generated",
        "hashes",
        "last_sample_step",
        "load_ready_seconds",
        "max_blocks",
        "num_cached_blocks",
        "num_computed",
        "num_tokens",
        "output_tokens",
        "preemptions",
        "prefilling",
        "req",
        "sched_step",
        "scheduled_seconds",
        "tail_unprocessed",
    )

    def __init__(self, req: SimRequest, output_tokens: int, hashes: np.ndarray,
                 max_blocks: int = 0) -> None:
        self.req = req
        self.output_tokens = output_tokens
        # The most blocks its table can hold (prompt and outputs): ``add_blocks`` sizes the
        # table's buffer to it once.
        self.max_blocks = max_blocks
        self.num_tokens = req.prompt_tokens  # prompt + generated so far
        self.num_computed = 0
        self.generated = 0
        self.blocks = NO_BLOCKS  # block ids: the request's block table
        # What ``blocks`` is a prefix view of, with room to grow (``add_blocks``).
        self.block_buffer = NO_BLOCKS
        self.num_cached_blocks = 0
        # Keys (prefix.KeySpace) of the full blocks other requests may share.
        self.hashes = hashes
        self.first_token_seconds = float("nan")
        self.finish_seconds = float("nan")
        self.preemptions = 0
        self.admitted = False
        # Async scheduling: the last step that sampled a token for it, and whether the last
        # token it computed was sampled in the step just before (vLLM had not processed
        # that sample when it scheduled the step, so it could not hash that token's block).
        self.last_sample_step = -2
        self.tail_unprocessed = False
        # At first admission: when (step start) and how many prompt tokens were prefix hits.
        self.scheduled_seconds = float("nan")
        self.cached_tokens = 0
        # Membership of the decoding cohort (cohort.py): the tick it joined at (-1: not a
        # member), and its tokens and generated tokens then.
        self.cohort_tick = -1
        self.cohort_tokens = 0
        self.cohort_generated = 0
        # Offload: when the KV it is loading from the CPU tier has arrived (NaN: none).
        self.load_ready_seconds = float("nan")
        # Whether its last scheduled chunk left part of its prompt (or, resumed, of its
        # tokens) to compute: vLLM reserves blocks for such requests (``offload.py``).
        self.prefilling = False
        # The last step that scheduled it (with the CPU tier, async: see ``_step``).
        self.sched_step = -1


    def add_blocks(self, new: np.ndarray) -> None:
        """Append ``new`` to the block table. The table is a prefix view of a buffer with
        room to spare, so a prompt prefilled in many chunks is not copied once per chunk.
        Writing past the view's end is safe: no view of the table reaches there, and a
        table replaced (freed, or set to prefix hits) is never a view of the buffer again."""
        cur = self.blocks
        n, k = len(cur), len(new)
        buf = self.block_buffer
        if cur.base is not buf or n + k > len(buf):
            # Room for the whole sequence with its outputs (doubling, should it outgrow that).
            cap = self.max_blocks if n + k <= self.max_blocks else max(2 * (n + k), 16)
            grown = np.empty(cap, dtype=np.int64)
            grown[:n] = cur
            self.block_buffer = buf = grown
        buf[n:n + k] = new
        self.blocks = buf[:n + k]
