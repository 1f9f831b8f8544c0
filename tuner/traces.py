"""Request traces: the two public formats (both ship in ``examples/traces``) as one record type.

- Azure LLM inference trace (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``): arrival time,
  prompt and output lengths; no prefix information.
- Mooncake (JSONL ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``):
  ``hash_ids`` identify 512-token prefix blocks; requests whose leading ids are equal share
  that prefix.

Parsing takes lines (pure); ``load_trace`` is the one function that opens a file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kvtune.tuner.errors import InvalidInput

MOONCAKE_HASH_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival_seconds: float  # since the trace's first request
    prompt_tokens: int
    output_tokens: int
    # Identities of consecutive prefix blocks of ``hash_block_tokens`` tokens each (the last
    # may be partial). Empty when the trace carries no prefix information.
    prefix_block_ids: tuple[int, ...] = ()
    hash_block_tokens: int = MOONCAKE_HASH_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    format: str  # "azure-csv" | "mooncake-jsonl"
    requests: Sequence[TraceRequest]

    @property
    def duration_seconds(self) -> float:
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_seconds - self.requests[0].arrival_seconds

    @property
    def has_prefix_ids(self) -> bool:
        return any(r.prefix_block_ids for r in self.requests)


def _parse_azure_timestamp(text: str) -> datetime:
    # 7 fractional digits ("18:17:03.9799600"): datetime takes at most 6.
    head, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}" if frac else head)


# The most tokens one request of a trace may have: above the longest context of any model
# (Llama 4 Scout's 10,485,760). A count beyond it is a broken row, and the simulator would
# size a block table for it.
MAX_TRACE_TOKENS = 1 << 24


def _tokens(value: object, field: str, where: str) -> int:
    """A token count: a whole number >= 0 (a negative or fractional count is a broken trace,
    refused here in one line rather than deep inside the profile)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidInput(f"trace {where}: {field}", value, "expected a whole number of tokens")
    try:
        count = int(value)
    except ValueError as exc:
        raise InvalidInput(f"trace {where}: {field}", value,
                           "expected a whole number of tokens") from exc
    if count < 0:
        raise InvalidInput(f"trace {where}: {field}", count,
                           "a token count cannot be negative; fix or drop that row")
    if count > MAX_TRACE_TOKENS:
        raise InvalidInput(f"trace {where}: {field}", count,
                           f"more tokens than any model's context (at most {MAX_TRACE_TOKENS:,})"
                           "; fix or drop that row")
    return count


def parse_azure_csv(lines: Iterable[str], name: str = "azure") -> Trace:
    it = iter(lines)
    header = next(it, "").strip()
    if header.replace(" ", "") != "TIMESTAMP,ContextTokens,GeneratedTokens":
        raise InvalidInput(
            "trace", name,
            f"expected the Azure header 'TIMESTAMP,ContextTokens,GeneratedTokens', got {header!r}",
        )
    rows: list[tuple[datetime, int, int]] = []
    for lineno, line in enumerate(it, start=2):
        if not line.strip():
            continue
        try:
            ts, ctx, gen = line.strip().split(",")
            where = f"{name}:{lineno}"
            rows.append((_parse_azure_timestamp(ts), _tokens(ctx.strip(), "ContextTokens", where),
                         _tokens(gen.strip(), "GeneratedTokens", where)))
        except InvalidInput:
            raise
        except ValueError as exc:
            raise InvalidInput(
                "trace", f"{name}:{lineno}", f"cannot parse {line!r}: {exc}"
            ) from exc
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else None
    requests = [
        TraceRequest((ts - t0).total_seconds() if t0 else 0.0, ctx, gen) for ts, ctx, gen in rows
    ]
    return Trace(name=name, format="azure-csv", requests=requests)


def _milliseconds(value: object, where: str) -> float:
    """A Mooncake timestamp (ms) in seconds; JSON's NaN and Infinity are refused."""
    if isinstance(value, bool):
        raise ValueError(f"timestamp {value!r} is not a number")
    ms = float(value)  # type: ignore[arg-type]  # a str, int or float; else TypeError
    if not math.isfinite(ms):
        raise InvalidInput(f"trace {where}: timestamp", value, "expected a finite number of "
                           "milliseconds; fix or drop that row")
    return ms / 1000.0


def parse_mooncake_jsonl(lines: Iterable[str], name: str = "mooncake") -> Trace:
    requests: list[TraceRequest] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            where = f"{name}:{lineno}"
            requests.append(
                TraceRequest(
                    arrival_seconds=_milliseconds(obj["timestamp"], where),
                    prompt_tokens=_tokens(obj["input_length"], "input_length", where),
                    output_tokens=_tokens(obj["output_length"], "output_length", where),
                    prefix_block_ids=tuple(int(h) for h in obj.get("hash_ids", ())),
                )
            )
        except InvalidInput:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(
                "trace", f"{name}:{lineno}",
                f"expected a Mooncake record with timestamp, input_length, output_length, "
                f"hash_ids: {exc}",
            ) from exc
    requests.sort(key=lambda r: r.arrival_seconds)
    if requests and requests[0].arrival_seconds != 0.0:
        t0 = requests[0].arrival_seconds
        requests = [
            TraceRequest(r.arrival_seconds - t0, r.prompt_tokens, r.output_tokens,
                         r.prefix_block_ids, r.hash_block_tokens)
            for r in requests
        ]
    return Trace(name=name, format="mooncake-jsonl", requests=requests)


def load_trace(path: str | Path) -> Trace:
    """Read a trace file, choosing the format by its content (CSV header or JSON lines)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInput("--trace", str(p), "no such file; pass an Azure CSV or Mooncake JSONL")
    try:
        with p.open(encoding="utf-8") as f:
            first = f.readline()
            f.seek(0)
            if first.lstrip().startswith("{"):
                return parse_mooncake_jsonl(f, name=p.name)
            if first.startswith("TIMESTAMP"):
                return parse_azure_csv(f, name=p.name)
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            "--trace", str(p),
            f"not UTF-8 text (a byte 0x{exc.object[exc.start]:02x}): "
            "pass an Azure CSV or Mooncake JSONL trace, not a binary or re-encoded file",
        ) from None
    except OSError as exc:
        raise InvalidInput("--trace", str(p), f"cannot read it ({exc.strerror}); pass a "
                           "readable Azure CSV or Mooncake JSONL trace") from None
    raise InvalidInput(
        "--trace", str(p),
        "unknown format: expected an Azure CSV (header TIMESTAMP,ContextTokens,GeneratedTokens) "
        "or Mooncake JSONL (one JSON object per line)",
    )
