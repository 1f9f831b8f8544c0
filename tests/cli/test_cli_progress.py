"""Progress on stderr for the commands that work for seconds (issue 14 item 12): shown on a
terminal or with --progress, never on stdout, whose JSON stays clean for scripts."""

from __future__ import annotations

import io
import json
import re

import pytest
from click.testing import CliRunner

from kvtune.cli.main import cli
from kvtune.cli.progress import Progress
from kvtune.e2e.traces import TRACES_DIR

# The search caches its result per process: each test asks at its own rate, so that it runs.
# A budget past what the search needs: these tests are about progress, and a search the default
# budget stops (which it can on a slow machine) says so on stderr.
SEARCH = ("plan", "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100", "--workload", "chat",
          "--ttft-p95", "2", "--tpot-p95", "0.05", "-o", "json", "--search-cpu-seconds", "600")
SIMULATE = ("simulate", "--trace", str(TRACES_DIR / "AzureLLMInferenceTrace_conv.csv"),
            "-m", "meta-llama/Llama-3.1-8B-Instruct", "-g", "H100", "--limit", "400",
            "--compare", "defaults,custom", "--config", "max_num_seqs=64", "-o", "json")


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.slow
def test_plan_search_shows_each_round_with_rising_counts_and_clean_json() -> None:
    code, out, err = _invoke(*SEARCH, "--request-rate", "4.25", "--progress")
    assert code == 0, err
    doc = json.loads(out)  # stdout is the JSON document and nothing else
    assert doc["search"]["candidates"] > 1
    lines = [ln for ln in err.splitlines() if ln.startswith("[kvtune plan] searching")]
    rounds: dict[int, list[int]] = {}
    for line in lines:
        m = re.search(r"searching (\d+) candidates: (\d+)/(\d+) \(successive halving round "
                      r"(\d+)/(\d+), (\d+) requests each\)", line)
        assert m is not None, line
        assert int(m.group(1)) <= doc["search"]["candidates"]
        rounds.setdefault(int(m.group(4)), []).append(int(m.group(2)))
        assert m.group(5) == "3"
    assert sorted(rounds) == [1, 2, 3]
    for done in rounds.values():  # 1, 2, ... up to the round's size
        assert done == list(range(1, len(done) + 1))
    assert len(rounds[1]) >= len(rounds[2]) >= len(rounds[3])
    # Block sizes are tried when the chosen dtype's backend accepts more than one (the last
    # line of that stage is then complete); the capacity ladder's probes are shown.
    blocks = re.findall(r"trying block sizes on the best candidate: (\d+)/(\d+) \(800 requests",
                        err)
    assert not blocks or blocks[-1][0] == blocks[-1][1]
    assert re.search(r"measuring capacity at SLO: \d+ scores, now at \S+x the observed rate "
                     r"\(\d+ requests each\)", err)


@pytest.mark.slow
def test_plan_shows_no_progress_off_a_terminal_unless_asked() -> None:
    code, out, err = _invoke(*SEARCH, "--request-rate", "3.75")
    assert code == 0, err
    assert json.loads(out)["search"]["candidates"] > 1
    assert "[kvtune plan]" not in err and "[kvtune plan]" not in out


def test_simulate_shows_requests_finished_per_configuration() -> None:
    code, out, err = _invoke(*SIMULATE, "--progress")
    assert code == 0, err
    doc = json.loads(out)
    assert [c["name"] for c in doc["configurations"]] == ["defaults", "custom"]
    for i, name in enumerate(("defaults", "custom"), start=1):
        counts = [int(m.group(1)) for m in re.finditer(
            rf"replaying {name} \({i}/2\), requests finished: (\d+)/400", err)]
        assert len(counts) >= 10, err  # every 5%, then the end
        assert counts == sorted(counts) and counts[-1] == 400 and counts[0] < 400
    code, out, err = _invoke(*SIMULATE, "--no-progress")
    assert code == 0 and "[kvtune simulate]" not in err
    json.loads(out)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_one_line_is_rewritten_in_place_and_ended_once() -> None:
    term = _Terminal()
    with Progress("simulate", stream=term) as shown:  # default: on, since it is a terminal
        hook = shown.counter("replaying defaults")
        for done in (20, 40, 60):
            hook(done, 60)
    text = term.getvalue()
    assert text.count("\r") == 3 and text.count("\n") == 1 and text.endswith("60/60\x1b[K\n")
    assert shown.updates == 3
    piped = io.StringIO()
    Progress("plan", stream=piped)("hidden")
    assert piped.getvalue() == ""  # not a terminal, not forced
    Progress("plan", enabled=True, stream=piped)("shown")
    assert piped.getvalue() == "[kvtune plan] shown\n"
