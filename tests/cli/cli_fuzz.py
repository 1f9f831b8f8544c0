"""The harness of the CLI's property test (test_cli_properties.py): every command found in the
click tree, a hypothesis strategy per option from its click type (so a new option is covered
without touching this file), fixture files that break parsers (binary, non-UTF-8, NaN, huge
token counts), and one bounded in-process invocation (a wall-clock alarm and an address-space
limit) whose outcome is checked: exit 0 with valid output, or exit 1/2 with exactly one
``Error:`` line; never a traceback or an internal error."""

from __future__ import annotations

import json
import math
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml
from click.testing import CliRunner, Result
from hypothesis import strategies as st

from kvtune.cli.errors import INTERNAL_ERROR
from kvtune.cli.main import cli
from kvtune.cli.params import Finite, TimedTrace

REPO = Path(__file__).resolve().parents[2]


def commands() -> dict[str, click.Command]:
    """Every leaf command, by its path ("plan", "cluster up"), from the click tree."""
    out: dict[str, click.Command] = {}

    def walk(group: click.Group, prefix: str) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, name
            path = f"{prefix} {name}".strip()
            if isinstance(command, click.Group):
                walk(command, path)
            else:
                out[path] = command

    assert isinstance(cli, click.Group)
    walk(cli, "")
    return out


# --- fixture files -------------------------------------------------------------------------


@dataclass(frozen=True)
class Files:
    """Paths every path option draws from: good ones and ones that break parsers."""

    good_traces: tuple[Path, ...]
    bad_files: tuple[Path, ...]
    good_yaml: Path
    folder: Path
    missing: Path
    out_files: tuple[Path, ...]

    def all(self) -> tuple[Path, ...]:
        return (*self.good_traces, *self.bad_files, self.good_yaml, self.folder, self.missing,
                *self.out_files)


def make_files(root: Path) -> Files:
    azure = (REPO / "examples/traces/AzureLLMInferenceTrace_conv.csv").read_text().splitlines()
    mooncake = (REPO / "examples/traces/synthetic_trace.jsonl").read_text().splitlines()
    # Small traces: a valid invocation replays at most 40 requests (bounded time).
    (root / "azure.csv").write_text("\n".join(azure[:41]) + "\n")
    (root / "mooncake.jsonl").write_text("\n".join(mooncake[:40]) + "\n")
    bad = {
        "binary.csv": bytes(range(256)) * 8,
        "latin1.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
                      b"2023-11-16 18:17:03.97,100,10\n\xff\xfe,5,3\n",
        "nul.jsonl": b'{"timestamp": 0, "input_length": 5\x00, "output_length": 3}\n',
        "nan.jsonl": b'{"timestamp": NaN, "input_length": 5, "output_length": 3}\n'
                     b'{"timestamp": 1, "input_length": 5, "output_length": 3}\n',
        "huge.jsonl": b'{"timestamp": 0, "input_length": 1000000000000000, "output_length": 3}\n'
                      b'{"timestamp": 9, "input_length": 5, "output_length": 3}\n',
        "one.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,100,10\n",
        "empty.txt": b"",
        "broken.yaml": b"spec: [\n",
        "list.json": b"[1, 2, 3]\n",
    }
    for name, data in bad.items():
        (root / name).write_bytes(data)
    folder = root / "folder"
    folder.mkdir()
    # A copy: a drawn --out-file may name any of these paths, and must never write into the
    # repository.
    good_yaml = root / "support-bot.yaml"
    good_yaml.write_text((REPO / "examples/support-bot.yaml").read_text())
    return Files(
        good_traces=(root / "azure.csv", root / "mooncake.jsonl"),
        bad_files=tuple(root / n for n in bad),
        good_yaml=good_yaml,
        folder=folder, missing=root / "missing" / "nothing.csv",
        out_files=(root / "out.json", root / "plot.png", root / "plot.txt"),
    )


# --- strategies per option -----------------------------------------------------------------

# Values for free-text options, by option name; any other text option gets generic text.
TEXT_VALUES: dict[str, list[str]] = {
    "--model": ["meta-llama/Llama-3.1-8B-Instruct", "Qwen3-8B", "deepseek-ai/DeepSeek-V2-Lite",
                "no-such-model"],
    "--gpu": ["H100", "H200", "L4", "no-such-gpu", "X:memory=-1,bandwidth=1,bf16=1,cc=9.0",
              "X:memory=24GiB,bandwidth=300GB/s,bf16=100TFLOPS,cc=8.9"],
    "--config": ["block_size=32", "block_size=-16", "block_size=7", "max_num_seqs=0",
                 "max_num_batched_tokens=1", "gpu_memory_utilization=nan",
                 "kv_offloading_size_gib=1e12", "kv_offloading_size_gib=4", "max_model_len=0",
                 "num_gpu_blocks=-1", "step_seconds=nan", "nonsense", "x=1"],
    "--gpu-price": ["H100=2.5", "H100=-1", "H100=nan", "garbage"],
    "--vllm-version": ["0.33.0", "0.15.0", "9.9"],
    "--compare": ["defaults", "defaults,custom", "planned,contiguous", "nope", ","],
    "--kv-cache-dtype": ["auto", "fp8", "int4_per_token_head", "bogus"],
    "--attention-backend": ["FLASH_ATTN", "FLASHINFER", "bogus"],
    "--dtypes": ["fp8", "fp8,int8_per_token_head", "bogus", ""],
    "--pools": ["H100=1", "H100=-1", "garbage"],
    "--follow-deployment": ["ns/name", "bad"],
}
NASTY_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                     max_size=12)
NUMBER_TEXT = st.sampled_from(["nan", "inf", "-inf", "1e309", "-0", "abc", "", "1e-300"])


def _int_values(kind: click.types.ParamType, valid: bool) -> st.SearchStrategy[str]:
    low, high = 1, 10**6
    edges: list[int] = [-1, 0, 10**12]
    if isinstance(kind, click.IntRange):
        low = int(kind.min) if kind.min is not None else low
        high = int(kind.max) if kind.max is not None else max(high, low)
        edges += [low - 1, high + 1]
    if valid:
        return st.one_of(st.sampled_from([low, high, min(high, low + 15)]),
                         st.integers(low, min(high, low + 10**5))).map(str)
    return st.sampled_from(edges).map(str) | NUMBER_TEXT


def _float_values(kind: click.types.ParamType, valid: bool) -> st.SearchStrategy[str]:
    low, high = 0.0, 1e6
    if isinstance(kind, click.FloatRange):
        low = float(kind.min) if kind.min is not None else -1e6
        high = float(kind.max) if kind.max is not None else 1e6
    if valid:
        return st.floats(low, high, allow_nan=False, exclude_min=True).map(repr)
    return st.sampled_from([low - 1.0, high * 10 + 1, -1.0, 0.0]).map(repr) | NUMBER_TEXT


def value_strategy(option: click.Option, files: Files, valid: bool
                   ) -> st.SearchStrategy[str]:
    """A value of the option's type: ``valid`` ones the parser takes (the command then
    decides), or ones chosen to break it (out of range, NaN, a missing or binary file)."""
    kind = option.type
    long_name = max(option.opts, key=len)
    if isinstance(kind, click.Choice):
        return st.sampled_from(list(map(str, kind.choices))) if valid else st.just("nope")
    if isinstance(kind, click.types.IntParamType):
        return _int_values(kind, valid)
    if isinstance(kind, Finite | click.types.FloatParamType):
        return _float_values(kind, valid)
    if isinstance(kind, TimedTrace):
        paths = st.sampled_from([str(p) for p in files.all()])
        return st.tuples(paths, st.sampled_from(["0", "5", "-1", "nan", "x"])).map(
            lambda t: f"{t[0]}@{t[1]}")
    if isinstance(kind, click.Path):
        good = [str(p) for p in (*files.good_traces, files.good_yaml,
                                 *(() if kind.exists else files.out_files))]
        return st.sampled_from(good if valid else [str(p) for p in files.all()])
    if long_name in TEXT_VALUES:
        return st.sampled_from(TEXT_VALUES[long_name]) if valid else NASTY_TEXT
    return NASTY_TEXT


def option_args(option: click.Option, files: Files, valid: bool
                ) -> st.SearchStrategy[list[str]]:
    """The argv words for one present option (a flag alone; a multiple option 1-3 times)."""
    if option.is_flag or option.count:
        return st.sampled_from([[n] for n in (*option.opts, *option.secondary_opts)])
    flag = max(option.opts, key=len)
    one = value_strategy(option, files, valid).map(lambda v: [flag, v])
    if option.multiple:
        return st.lists(one, min_size=1, max_size=3).map(lambda xs: [w for x in xs for w in x])
    return one


def argv(command: click.Command, files: Files, fixed: dict[str, list[str]],
         core: tuple[str, ...] = ()) -> st.SearchStrategy[list[str]]:
    """A few options (the ``core`` ones nearly always, their required ones too) with values
    the parser takes, and at most one with a value chosen to break it; those in ``fixed``
    (option name -> its argv) always as given."""
    options = [p for p in command.params
               if isinstance(p, click.Option) and not (set(p.opts) & set(fixed))]
    wanted = [i for i, p in enumerate(options) if p.required or set(p.opts) & set(core)]

    tail = [w for ws in fixed.values() for w in ws]
    if not options:
        return st.just(tail)

    @st.composite
    def draw(data: st.DrawFn) -> list[str]:
        chosen = set(data(st.lists(st.integers(0, len(options) - 1), max_size=6)))
        # The core options are left out one time in eight (a missing required option).
        chosen |= {i for i in wanted if data(st.integers(0, 7)) != 3}
        bad = data(st.sampled_from([None, None, *sorted(chosen)])) if chosen else None
        order = data(st.permutations(sorted(chosen)))
        words: list[str] = []
        for i in order:
            words += data(option_args(options[i], files, valid=i != bad))
        return words + tail

    return draw()


def one_bad_value(command: click.Command, files: Files) -> st.SearchStrategy[list[str]]:
    """A value click itself refuses for one typed option, so the command never starts (for
    the commands that serve until interrupted)."""
    bad: list[list[str]] = []
    for p in command.params:
        if not isinstance(p, click.Option) or p.is_flag:
            continue
        flag = max(p.opts, key=len)
        if isinstance(p.type, click.Choice):
            bad.append([flag, "not-a-choice"])
        elif isinstance(p.type, click.types.IntParamType | click.types.FloatParamType):
            bad += [[flag, "nan-ish"], [flag, "1e400x"]]
        elif isinstance(p.type, click.Path) and p.type.exists:
            bad.append([flag, str(files.missing)])
        elif isinstance(p.type, click.Path) and not p.type.file_okay:
            bad.append([flag, str(files.good_yaml)])
    assert bad, f"{command.name}: no typed option to break"
    return st.sampled_from(bad)


# --- one bounded invocation ------------------------------------------------------------------


class Overran(BaseException):
    """The invocation ran past its time (a BaseException: CliRunner does not swallow it)."""


@contextmanager
def bounded(seconds: float, extra_bytes: int) -> Iterator[None]:
    """A wall-clock alarm and an address-space limit of the current size plus
    ``extra_bytes`` (the soft limit only, restored after: the hard limit stays)."""
    def overran(*_: Any) -> None:
        raise Overran(f"ran past {seconds:g} s")

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    limit = size + extra_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    previous = signal.signal(signal.SIGALRM, overran)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def invoke(words: list[str], seconds: float = 60.0, extra_bytes: int = 3 << 30) -> Result:
    with bounded(seconds, extra_bytes):
        return CliRunner().invoke(cli, words, catch_exceptions=True)


def check(words: list[str], result: Result) -> None:
    """The property: exit 0 with valid output, or exit 1/2 with exactly one error line."""
    where = f"kvtune {' '.join(words)}\nstdout: {result.stdout[-800:]}\nstderr: " \
            f"{result.stderr[-800:]}"
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"{where}\nraised {exc!r}"
    assert "Traceback" not in result.output, where
    assert INTERNAL_ERROR not in result.stderr, where
    assert result.exit_code in (0, 1, 2), where
    if result.exit_code == 0:
        _valid_output(words, result.stdout, where)
        return
    # Progress lines ("[kvtune plan] ...") may precede the error; nothing else may.
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith("[kvtune ")]
    assert len(lines) == 1 and lines[0].startswith("Error: "), where
    assert len(lines[0]) > len("Error: ") + 10, where


def _valid_output(words: list[str], stdout: str, where: str) -> None:
    fmt = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-o", "--output")),
               None)
    # These write a file or check one instead of printing.
    if {"--help", "--write", "--check", "--out-file"} & set(words):
        return
    assert stdout.strip(), where
    if fmt == "json":
        doc = json.loads(stdout)
        assert isinstance(doc, dict), where
        _no_nan(doc, where)
    elif fmt in ("yaml", "prometheusrule", "rules"):
        assert list(yaml.safe_load_all(stdout)), where


def _no_nan(value: Any, where: str) -> None:
    if isinstance(value, float):
        assert math.isfinite(value), where
    elif isinstance(value, dict):
        for v in value.values():
            _no_nan(v, where)
    elif isinstance(value, list):
        for v in value:
            _no_nan(v, where)
