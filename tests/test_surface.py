"""Pins the public CLI and SDK surface: changing it must be a deliberate act."""

from __future__ import annotations

import argparse

import cloudtrain
from cloudtrain.cli.main import build_parser
from cloudtrain.providers.base import Provider


def test_cli_commands() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(sub.choices) == ["cancel", "init", "list", "logs", "plan", "preempt", "schema", "status", "submit",
                                   "wait"]
    submit_flags = {opt for a in sub.choices["submit"]._actions for opt in a.option_strings}
    assert {"--provider", "--nodes", "--procs-per-node", "--strategy", "--checkpoint-uri", "--dry-run", "--detach",
            "--follow", "--output", "--file", "--gpus", "--spot", "--max-restarts", "--env"} <= submit_flags


def test_sdk_names() -> None:
    assert sorted(cloudtrain.__all__) == ["CloudtrainError", "Job", "JobSpec", "Run", "__version__", "list_runs"]
    for name in cloudtrain.__all__:
        assert getattr(cloudtrain, name) is not None
    run_methods = {"status", "logs", "wait", "cancel", "attach"}
    assert run_methods <= set(dir(cloudtrain.Run))
    assert {"plan", "submit", "from_yaml"} <= set(dir(cloudtrain.Job))


def test_provider_interface() -> None:
    public = {"plan", "submit", "describe", "logs", "cancel", "list", "wait"}
    assert public <= set(dir(Provider))
    assert {"_plan", "_submit", "_describe", "_logs", "_cancel", "_list"} <= Provider.__abstractmethods__
