"""`kvtune operator` and `kvtune crds` entry points (the operator itself runs in the cluster
tests, as a subprocess)."""

from __future__ import annotations

import importlib.util

import yaml
from click.testing import CliRunner

from kvtune.cli.crds import crds
from kvtune.cli.operator_cmd import OPTIONAL_HANDLER_MODULES, load_handlers, operator


def test_standalone_and_peering_exclude_each_other() -> None:
    result = CliRunner().invoke(operator, ["--standalone", "--peering", "kvtune"])
    assert result.exit_code == 2 and "exclude each other" in result.output


def test_a_bad_gpu_price_is_refused_before_anything_starts() -> None:
    result = CliRunner().invoke(operator, ["--gpu-price", "H100=free"])
    assert result.exit_code == 2
    assert "--gpu-price=" in result.output and "CLASS=USD" in result.output


def test_handler_modules_of_other_parts_are_registered_when_installed() -> None:
    loaded = load_handlers()
    assert loaded[0] == "kvtune.operator.handlers"
    for name in OPTIONAL_HANDLER_MODULES:
        assert (name in loaded) == (importlib.util.find_spec(name) is not None)


def test_crds_prints_the_manifest() -> None:
    result = CliRunner().invoke(crds, [])
    assert result.exit_code == 0
    doc = yaml.safe_load(result.output)
    assert doc["metadata"]["name"] == "inferencedeployments.kvtune.io"
