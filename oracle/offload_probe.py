"""What vLLM 0.33.0's ``OffloadingConnector`` did in each step, read from its scheduler side
(the oracle's view of the CPU tier; imports nothing from vLLM itself).

- loads: the connector metadata's ``load_jobs`` (request id, chunks), built by
  ``update_state_after_alloc`` when the scheduler admits a request with a CPU hit;
- stores and evictions: what ``CPUOffloadingManager.prepare_store`` answered
  (``keys_to_store``, ``evicted_keys``), counted by wrapping that one method.
"""

from __future__ import annotations

from typing import Any

from kvtune.tuner.errors import InvalidInput


class OffloadProbe:
    """Counts the CPU tier's stores and evictions of one vLLM scheduler."""

    def __init__(self, scheduler: Any, expected_chunks: int) -> None:
        connector = scheduler.connector
        if connector is None or type(connector).__name__ != "OffloadingConnector":
            raise InvalidInput("cpu_offload_blocks", expected_chunks,
                               "vLLM did not build its OffloadingConnector from "
                               "--kv-offloading-size; check the vLLM version")
        self.manager = connector.connector_scheduler.manager
        num_chunks = int(self.manager._num_chunks)
        if num_chunks != expected_chunks:
            raise InvalidInput("cpu_offload_blocks", expected_chunks,
                               f"vLLM sized its CPU tier to {num_chunks} chunks; the oracle's "
                               "block bytes disagree with vLLM's")
        self.stored_chunks = 0
        self.evicted_chunks = 0
        prepare_store = self.manager.prepare_store

        def counting(keys: Any, req_context: Any) -> Any:
            out = prepare_store(keys, req_context)
            if out is not None:
                self.stored_chunks += len(out.keys_to_store)
                self.evicted_chunks += len(out.evicted_keys)
            return out

        self.manager.prepare_store = counting

    def take(self) -> tuple[int, int]:
        """(chunks stored, chunks evicted) since the last call."""
        got = self.stored_chunks, self.evicted_chunks
        self.stored_chunks = self.evicted_chunks = 0
        return got


def step_jobs(scheduler_output: Any) -> tuple[list[tuple[int, str, int]],
                                              list[tuple[int, int]], set[int]]:
    """A step's connector metadata as the worker model takes it: loads (job, request id,
    chunks), stores (job, chunks), jobs to flush."""
    meta = scheduler_output.kv_connector_metadata
    if meta is None:
        return [], [], set()
    loads = [(job_id, job.req_id, len(job.dst_spec.block_ids))
             for job_id, job in meta.load_jobs.items()]
    stores = [(job_id, len(job.dst_spec.block_ids)) for job_id, job in meta.store_jobs.items()]
    return loads, stores, set(meta.jobs_to_flush or ())
