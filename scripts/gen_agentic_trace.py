"""Write the synthetic agentic trace ``examples/traces/agentic_trace.jsonl`` (issue 27).

No public trace at hand is agentic (the Azure conversation trace has no prefix or
session information; Mooncake's synthetic trace has prefix ids but no tool-call sessions), so
this one is generated, seeded and reproducible, in the Mooncake JSONL format (``timestamp``
ms, ``input_length``, ``output_length``, ``hash_ids`` of 512-token blocks) that
``tuner/traces.py`` reads.

The shape (each parameter's source beside it in ``SHAPE``):

- sessions start as a Poisson process;
- every call of a session re-sends the whole history: a shared system prompt and tool
  schemas, the session's task, then every earlier call's output and tool result; so a call's
  prompt extends the previous call's prompt (its full 512-token blocks keep their ids; the
  last, partial block gets a fresh id, as a content hash would);
- between two calls the model's output is decoded and a tool runs: the next call arrives
  after the decode time plus a tool latency drawn from a lognormal distribution.

    .venv/bin/python scripts/gen_agentic_trace.py [--check]   # --check: compare, write nothing
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "examples" / "traces" / "agentic_trace.jsonl"
BLOCK_TOKENS = 512  # the Mooncake format's hash block


@dataclass(frozen=True, slots=True)
class Shape:
    seed: int = 27
    sessions: int = 80
    sessions_per_second: float = 0.4
    # The system prompt and tool schemas every call starts with: 6 blocks (3,072 tokens), as
    # examples/agentic.yaml's "system prompt + tool schemas" (kvtune's agent preset: 3,000).
    shared_prefix_blocks: int = 6
    task_tokens: tuple[int, int] = (256, 1536)  # uniform: the user's task
    # Calls per session, uniform: the article's "after 20 tool calls" (its pattern 2).
    calls: tuple[int, int] = (6, 24)
    # Tokens a cycle adds (output + tool result): the article's "the prefix grows by an
    # average of 500 tokens per cycle"; split into a lognormal output (median 150) and a
    # lognormal tool result (median 350).
    output_median_tokens: float = 150.0
    result_median_tokens: float = 350.0
    tokens_sigma: float = 0.6
    # Tool latency between calls: lognormal, median 6 s, sigma 1.0 (p90 about 22 s). An
    # assumption (code runs, searches, test suites): no public per-call latency figure is
    # pinned here; change it and regenerate to study other gaps.
    tool_median_seconds: float = 6.0
    tool_sigma: float = 1.0
    decode_seconds_per_token: float = 0.03  # the output's own decode time before the tool


SHAPE = Shape()


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(median), sigma)


def _session(rng: random.Random, shape: Shape, start_s: float, next_id: int
             ) -> tuple[list[dict[str, object]], int]:
    """One session's calls (records) and the next unused block id."""
    history = shape.shared_prefix_blocks * BLOCK_TOKENS + rng.randint(*shape.task_tokens)
    full_ids: list[int] = list(range(shape.shared_prefix_blocks))  # shared: ids 0..5
    t = start_s
    records: list[dict[str, object]] = []
    for _ in range(rng.randint(*shape.calls)):
        full = history // BLOCK_TOKENS
        while len(full_ids) < full:  # the session's own full blocks keep their ids
            full_ids.append(next_id)
            next_id += 1
        ids = list(full_ids[:full])
        if history % BLOCK_TOKENS:
            ids.append(next_id)  # a partial block: its content differs from the later full one
            next_id += 1
        out = max(16, round(_lognormal(rng, shape.output_median_tokens, shape.tokens_sigma)))
        records.append({"timestamp": round(t * 1000), "input_length": history,
                        "output_length": out, "hash_ids": ids})
        result = max(16, round(_lognormal(rng, shape.result_median_tokens, shape.tokens_sigma)))
        t += out * shape.decode_seconds_per_token + _lognormal(
            rng, shape.tool_median_seconds, shape.tool_sigma)
        history += out + result
    return records, next_id


def generate(shape: Shape = SHAPE) -> list[dict[str, object]]:
    """Every call of every session, in arrival order."""
    rng = random.Random(shape.seed)
    next_id = shape.shared_prefix_blocks
    start = 0.0
    records: list[dict[str, object]] = []
    for _ in range(shape.sessions):
        calls, next_id = _session(rng, shape, start, next_id)
        records += calls
        start += rng.expovariate(shape.sessions_per_second)
    records.sort(key=lambda r: (r["timestamp"], r["hash_ids"][-1]))  # type: ignore[index]
    return records


def render(records: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in records)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the shipped file differs")
    args = ap.parse_args()
    text = render(generate())
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT.name}: {'current' if same else 'STALE: run scripts/gen_agentic_trace.py'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({len(text.splitlines())} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
