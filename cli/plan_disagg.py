"""`kvtune plan --disaggregate --gpus-per-replica N`: prefill/decode disaggregation over
vLLM 0.33's NixlConnector (``kvtune.tuner.simulator.disagg_search``).

Every P:D split of the N GPUs and co-located serving on them are planned and replayed; the
split with the highest capacity at SLO is chosen, and the output says where co-located serving
wins. Each role's plan is printed with its ``vllm serve`` flags (its ``--kv-transfer-config``
included). ``--prefill-tp/--decode-tp`` pin a role's TP; ``--prefill-block-size``,
``--prefill-kv-cache-dtype``, ``--prefill-attention-backend`` (and the ``--decode-`` ones) pin a
role's KV knobs; a pair NixlConnector would refuse is refused in one line. The KV link is the
GPU class's NVLink within a node, its RDMA NIC beyond (``tuner/facts/kv_links.py``), or
``--kv-link-gbps``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvtune.tuner.facts.kv_links import kv_link
from kvtune.tuner.planner.policy import Pins
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.simulator import disagg_search
from kvtune.tuner.simulator.disagg_search import (
    DisaggChoice,
    RolePlan,
    SplitOption,
    SplitPins,
    choose_split,
)

F = TypeVar("F", bound=Callable[..., Any])
_ROLE_KNOBS = ("block_size", "kv_cache_dtype", "attention_backend")
# Options --plan --disaggregate does not combine with (the layout search, --tp auto, compare).
_EXCLUSIVE = ("dp", "ep", "dcp", "pp", "compare_gpu")


def disagg_options(command: F) -> F:
    """``--disaggregate`` and its per-role pins."""
    options = [
        click.option("--disaggregate", is_flag=True,
                     help="Prefill/decode disaggregation (vLLM NixlConnector) of "
                     "--gpus-per-replica GPUs: every P:D split and co-located serving are "
                     "replayed, the split with the highest capacity at SLO is chosen."),
        click.option("--kv-link-gbps", type=click.FloatRange(min=0, min_open=True),
                     help="With --disaggregate: the link between prefill and decode GPUs, "
                     "Gb/s per GPU one way (default: the GPU class's NVLink within a node, "
                     "its RDMA NIC across nodes)."),
    ]
    for role in ("prefill", "decode"):
        options += [
            click.option(f"--{role}-tp", type=click.IntRange(min=1),
                         help=f"With --disaggregate: pin the {role} engines' TP."),
            click.option(f"--{role}-block-size", type=click.IntRange(min=1),
                         help=f"With --disaggregate: pin the {role} role's --block-size."),
            click.option(f"--{role}-kv-cache-dtype",
                         help=f"With --disaggregate: pin the {role} role's --kv-cache-dtype."),
            click.option(f"--{role}-attention-backend",
                         help=f"With --disaggregate: pin the {role} role's "
                         "--attention-backend."),
        ]
    for option in reversed(options):
        command = option(command)
    return command


def wants_disagg(opts: dict[str, Any]) -> bool:
    return bool(opts.get("disaggregate"))


def _role_pins(opts: dict[str, Any], role: str) -> Pins | None:
    values = {k: opts[f"{role}_{k}"] for k in _ROLE_KNOBS if opts[f"{role}_{k}"] is not None}
    return Pins(**values) if values else None


def check_disagg_options(opts: dict[str, Any], tp_given: bool) -> None:
    """Usage errors: what --disaggregate needs and what it does not combine with."""
    role_opts = [k for k in opts if k.startswith(("prefill_", "decode_"))
                 and opts[k] is not None] + (["kv_link_gbps"] if opts["kv_link_gbps"] else [])
    if not wants_disagg(opts):
        if role_opts:
            raise click.UsageError(f"--{role_opts[0].replace('_', '-')} needs --disaggregate")
        return
    if opts["gpus_per_replica"] is None:
        raise click.UsageError("--disaggregate needs --gpus-per-replica N: the GPUs the "
                               "prefill and decode roles share (e.g. 8)")
    clash = ([k for k in _EXCLUSIVE if opts.get(k)] + (["tp"] if tp_given else [])
             + (["nodes_per_replica"] if opts.get("nodes", 1) > 1 else []))
    if clash:
        raise click.UsageError(f"--disaggregate chooses each role's TP: drop "
                               f"--{clash[0].replace('_', '-')} (pin --prefill-tp/--decode-tp)")
    if opts["output"] not in ("table", "json", "yaml"):
        raise click.UsageError("--disaggregate prints -o table, json or yaml")


def plan_disaggregated(request: PlanRequest, opts: dict[str, Any]) -> DisaggChoice:
    gpus = opts["gpus_per_replica"]
    link = kv_link(request.gpu.name, gpus, opts["kv_link_gbps"])
    pins = SplitPins(prefill_tp=opts["prefill_tp"], decode_tp=opts["decode_tp"],
                     prefill=_role_pins(opts, "prefill"), decode=_role_pins(opts, "decode"))
    # The stream's length read at the call (tests shorten it).
    return choose_split(request, gpus, link, pins, num_requests=disagg_search.STREAM_REQUESTS)


# --- rendering ---------------------------------------------------------------------------------


def _role_doc(role: RolePlan | None) -> dict[str, Any] | None:
    if role is None:
        return None
    return {"role": role.role, "tensor_parallel": role.tensor_parallel,
            "engines": role.engines, "plan": role.pool.plan.model_dump(mode="json"),
            "vllm_args": role.vllm_args()}


def _option_doc(o: SplitOption) -> dict[str, Any]:
    return {
        "label": o.label, "disaggregated": o.disaggregated, "prefill_gpus": o.prefill_gpus,
        "decode_gpus": o.decode_gpus, "chosen": o.chosen, "refused": o.refused,
        "capacity_requests_per_second": o.capacity_requests_per_second,
        "capacity_per_gpu": round(o.capacity_requests_per_second
                                  / max(1, o.prefill_gpus + o.decode_gpus), 4),
        "ttft_p95_seconds": None if o.refused else o.ttft_p95_seconds,
        "tpot_p95_seconds": None if o.refused else o.tpot_p95_seconds,
        "prefill": _role_doc(o.prefill), "decode": _role_doc(o.decode),
        "colocated": (None if o.colocated is None else
                      {"tensor_parallel": o.colocated.tensor_parallel,
                       "engines": o.colocated.engines,
                       "vllm_args": o.colocated.pool.vllm_args()}),
    }


def disagg_document(choice: DisaggChoice, request: PlanRequest) -> dict[str, Any]:
    return {
        "model": request.model.hf_id, "gpu_class": choice.gpu_class, "gpus": choice.gpus,
        "kv_link": {"fabric": choice.link.fabric,
                    "bytes_per_second": choice.link.bytes_per_second,
                    "source": choice.link.source},
        "chosen": choice.chosen.label, "colocated_wins": choice.colocated_wins,
        "verdict": choice.message, "options": [_option_doc(o) for o in choice.options],
        "profile": request.profile.model_dump(mode="json"),
    }


def render_disagg(choice: DisaggChoice, request: PlanRequest, fmt: str) -> str:
    doc = disagg_document(choice, request)
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(doc, sort_keys=False))
    return _table(choice, request)


def _table(choice: DisaggChoice, request: PlanRequest) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=140, file=open("/dev/null", "w"))  # noqa: SIM115
    link = choice.link
    console.print(f"[bold]{request.model.hf_id}[/] on {choice.gpus} x [bold]"
                  f"{choice.gpu_class}[/]: prefill/decode disaggregation (NixlConnector) vs "
                  f"co-located; KV link {link.fabric} {link.bytes_per_second / 1e9:g} GB/s "
                  f"per GPU ({link.source})")
    table = Table(title=f"Capacity at SLO of {choice.gpus} GPUs (95% of requests within TTFT "
                  "and TPOT targets)")
    for col in ("option", "capacity req/s", "req/s per GPU", "TTFT p95 s", "TPOT p95 ms",
                "note"):
        table.add_column(col, justify="left" if col in ("option", "note") else "right")
    for o in choice.options:
        name = o.label + (" *" if o.chosen else "")
        if o.refused:
            table.add_row(name, "-", "-", "-", "-", o.refused[:70])
            continue
        table.add_row(name, f"{o.capacity_requests_per_second:.2f}",
                      f"{o.capacity_requests_per_second / choice.gpus:.3f}",
                      f"{o.ttft_p95_seconds:.3f}", f"{o.tpot_p95_seconds * 1000:.1f}", "")
    console.print(table)
    console.print(f"[bold]verdict:[/] {choice.message}")
    c = choice.chosen
    for role in (c.prefill, c.decode, c.colocated):
        if role is None:
            continue
        what = "co-located" if c.colocated is not None else role.role
        args = role.pool.vllm_args() if c.colocated is not None else role.vllm_args()
        console.print(f"[bold]{what}[/]: {role.engines} engine(s) of TP{role.tensor_parallel}"
                      f"; vllm serve {request.model.hf_id} " + " ".join(args))
    return console.export_text()
