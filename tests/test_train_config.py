"""TrainConfig is the one source of training options: the parser, `moment train` and the defaults
all come from it (no torch needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from moment.cli import main
from moment.runtime.config import TrainConfig, option_names, parse_args


def test_parsed_defaults_are_the_models_defaults(tmp_path: Path) -> None:
    assert parse_args(["--layout", str(tmp_path)]) == TrainConfig(layout=tmp_path)


def test_every_field_has_a_flag_and_every_flag_sets_its_field(tmp_path: Path) -> None:
    argv_and_fields = {
        ("--dataset", "d"): {"dataset": Path("d")}, ("--model", "gat"): {"model": "gat"},
        ("--epochs", "3"): {"epochs": 3}, ("--metrics-json", "m.json"): {"metrics_json": Path("m.json")},
        ("--fanouts", "5,4"): {"fanouts": [5, 4]}, ("--layers", "2"): {"layers": 2},
        ("--batch-size", "9"): {"batch_size": 9}, ("--hidden", "16"): {"hidden": 16}, ("--lr", "0.5"): {"lr": 0.5},
        ("--seed", "7"): {"seed": 7}, ("--memory-budget", "3GiB"): {"memory_budget": "3GiB"},
        ("--cpu-cache-limit", "1GiB"): {"cpu_cache_limit": "1GiB"}, ("--cache-policy", "lru"): {"cache_policy": "lru"},
        ("--io-shape", "rows"): {"io_shape": "rows"}, ("--superbatch", "2"): {"superbatch": 2},
        ("--features-in-memory",): {"features": "memory"}, ("--features-memmap",): {"features": "memmap"},
        ("--drop-page-cache",): {"drop_page_cache": "epoch"}, ("--drop-page-cache", "batch"): {"drop_page_cache": "batch"},
        ("--memmap-random",): {"memmap_random": True}, ("--io-backend", "python"): {"io_backend": "python"},
        ("--queue-depth", "8"): {"queue_depth": 8}, ("--io-merge-gap", "4096"): {"io_merge_gap": 4096},
        ("--io-max-request", "65536"): {"io_max_request": 65536}, ("--buffered",): {"direct": False},
        ("--no-peer-tier",): {"peer_tier": False},
        ("--verify",): {"verify": True}, ("--no-pipeline",): {"pipeline": False}, ("--depth", "3"): {"depth": 3},
        ("--threads", "1"): {"threads": 1}, ("--device", "cpu"): {"device": "cpu"}, ("--quiet",): {"quiet": True},
        ("--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "5", "--resume"):
            {"checkpoint_dir": tmp_path / "ck", "checkpoint_every": 5, "resume": True},
    }
    covered = {"layout"}
    for argv, fields in argv_and_fields.items():
        cfg = parse_args(["--layout", str(tmp_path), *argv])
        assert cfg == TrainConfig(layout=tmp_path, **fields), argv
        covered |= set(fields)
    assert covered == set(TrainConfig.model_fields), "a field without a flag test"
    assert len(option_names()) == len(set(option_names())) == len(TrainConfig.model_fields) + 1  # features: 2


def test_bad_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--layout", str(tmp_path), "--model", "gcn"])
    with pytest.raises(SystemExit):
        parse_args(["--layout", str(tmp_path), "--features-memmap", "--features-in-memory"])
    with pytest.raises(ValidationError, match="model"):
        TrainConfig(model="gcn")
    with pytest.raises(ValidationError, match="epoch"):
        TrainConfig(epoch=2)  # a misspelt option is not silently ignored


def test_moment_train_help_lists_every_forwarded_option(capsys) -> None:
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in option_names():
        assert flag in text, flag
