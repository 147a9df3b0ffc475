"""TrainConfig is the one source of training options: the parser, `moment train` and the defaults
all come from it (no torch needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from moment.cli import main
from moment.errors import MomentError
from moment.runtime.config import TrainConfig, build_parser, flag_of, option_names, parse_args


def test_parsed_defaults_are_the_models_defaults(tmp_path: Path) -> None:
    assert parse_args(["--layout", str(tmp_path)]) == TrainConfig(layout=tmp_path)


def test_every_field_has_a_flag_and_every_flag_sets_its_field(tmp_path: Path) -> None:
    argv_and_fields = {
        ("--dataset", "d"): {"dataset": Path("d")}, ("--model", "gat"): {"model": "gat"},
        ("--model", "tests.user_models:factory"): {"model": "tests.user_models:factory"},
        ("--loss", "pkg.losses:focal"): {"loss": "pkg.losses:focal"}, ("--optimizer", "sgd"): {"optimizer": "sgd"},
        ("--weight-decay", "0.01"): {"weight_decay": 0.01},
        ("--task", "link"): {"task": "link"}, ("--negatives", "3"): {"negatives": 3},
        ("--epochs", "3"): {"epochs": 3}, ("--metrics-json", "m.json"): {"metrics_json": Path("m.json")},
        ("--fanouts", "5,4"): {"fanouts": [5, 4]}, ("--layers", "2"): {"layers": 2},
        ("--batch-size", "9"): {"batch_size": 9}, ("--hidden", "16"): {"hidden": 16}, ("--lr", "0.5"): {"lr": 0.5},
        ("--seed", "7"): {"seed": 7}, ("--memory-budget", "3GiB"): {"memory_budget": "3GiB"},
        ("--device-memory-budget", "80%"): {"device_memory_budget": "80%"},
        ("--cpu-cache-limit", "1GiB"): {"cpu_cache_limit": "1GiB"}, ("--cache-policy", "lru"): {"cache_policy": "lru"},
        ("--io-shape", "rows"): {"io_shape": "rows"}, ("--superbatch", "2"): {"superbatch": 2},
        ("--features-in-memory",): {"features": "memory"}, ("--features-memmap",): {"features": "memmap"},
        ("--features-memmap", "--drop-page-cache"): {"features": "memmap", "drop_page_cache": "epoch"},
        ("--features-memmap", "--drop-page-cache", "batch"): {"features": "memmap", "drop_page_cache": "batch"},
        ("--features-memmap", "--memmap-random"): {"features": "memmap", "memmap_random": True},
        ("--features-memmap", "--loader-workers", "3"): {"features": "memmap", "loader_workers": 3}, ("--io-backend", "python"): {"io_backend": "python"},
        ("--queue-depth", "8"): {"queue_depth": 8}, ("--io-merge-gap", "4096"): {"io_merge_gap": 4096},
        ("--io-max-request", "65536"): {"io_max_request": 65536}, ("--buffered",): {"direct": False},
        ("--peer-tier", "off"): {"peer_tier": "off"},
        ("--verify",): {"verify": True}, ("--no-pipeline",): {"pipeline": False}, ("--depth", "3"): {"depth": 3},
        ("--threads", "1"): {"threads": 1}, ("--device", "cpu"): {"device": "cpu"}, ("--quiet",): {"quiet": True},
        ("--data-only",): {"data_only": True}, ("--io-trace", "traces"): {"io_trace": Path("traces")},
        ("--predict", "p.csv", "--predict-nodes", "test"): {"predict": Path("p.csv"), "predict_nodes": "test"},
        ("--embed", "e.npy"): {"embed": Path("e.npy")},
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


def test_the_peer_tier_is_on_by_default_only_where_nccl_moves_its_rows(tmp_path: Path) -> None:
    """auto: on CUDA the exchange is device to device; on CPU gloo's socket copies cost more than the rank's own tiers."""
    on = {choice: [TrainConfig(layout=tmp_path, peer_tier=choice).peer_tier_on(d) for d in ("cpu", "cuda")]
          for choice in ("auto", "on", "off")}
    assert on == {"auto": [False, True], "on": [True, True], "off": [False, False]}
    assert TrainConfig(layout=tmp_path).peer_tier == "auto"


def test_bad_values_are_refused(tmp_path: Path) -> None:
    for argv, said in ((["--model", "gcn"], "--model gcn: choose sage or gat, or give your model's factory as "
                                             "MODULE:FACTORY"),
                       (["--model", "my-models.py:make"], "--model my-models.py:make: choose sage or gat"),
                       (["--loss", "focal"], "--loss focal: give your loss function as MODULE:FUNCTION"),
                       (["--optimizer", "lamb"], "--optimizer: invalid choice: 'lamb'"),
                       (["--features-memmap", "--features-in-memory"], "--features-in-memory: not allowed with"),
                       (["--lr"], "--lr: expected one argument"), (["--nonsense", "3"], "unrecognized arguments")):
        with pytest.raises(MomentError) as e:  # one line, not argparse's usage text and SystemExit
            parse_args(["--layout", str(tmp_path), *argv])
        assert str(e.value).startswith(said), (argv, str(e.value))
    with pytest.raises(ValidationError, match="model"):
        TrainConfig(model="gcn")
    with pytest.raises(ValidationError, match="epoch"):
        TrainConfig(epoch=2)  # a misspelt option is not silently ignored


#: every numeric option, values it must refuse, and the range the refusal names
RANGES = {
    "--epochs": (["0", "-1", "abc", "2.5"], "an integer >= 1"),
    "--batch-size": (["0", "-5"], "an integer >= 1"),
    "--hidden": (["0", "-3"], "an integer >= 1"),
    "--lr": (["0", "-1e-3", "nan", "inf", "-inf"], "a finite number > 0"),
    "--weight-decay": (["-1", "-1e-4", "nan", "inf"], "a finite number >= 0"),
    "--seed": (["-1", str(2**63)], f"an integer from 0 to {2**63 - 1}"),
    "--checkpoint-every": (["-2"], "an integer >= 0"),
    "--superbatch": (["0"], "an integer >= 1"),
    "--queue-depth": (["0", "5000"], "an integer from 1 to 4096"),
    "--io-merge-gap": (["-1"], "an integer >= 0"),
    "--io-max-request": (["0", "-4096"], "an integer >= 1"),
    "--depth": (["0"], "an integer >= 1"),
    "--loader-workers": (["-1"], "an integer >= 0"),
    "--threads": (["0", "-2"], "an integer >= 1"),
    "--negatives": (["0", "101"], "an integer from 1 to 100"),
}


def test_every_numeric_option_names_its_range_in_one_line(tmp_path: Path, capsys) -> None:
    numeric = {flag_of(n) for n, f in TrainConfig.model_fields.items()
               if (f.annotation in (int, float, int | None, float | None))}
    assert numeric == set(RANGES), "a numeric option without a tested range"
    for flag, (values, allowed) in RANGES.items():
        for v in values:
            with pytest.raises(MomentError) as e:
                parse_args(["--layout", str(tmp_path), flag, v])
            assert str(e.value).splitlines()[0] == f"{flag} {v}: must be {allowed}", str(e.value)
    # `moment train` refuses the same way, before torchrun starts, and so do its own flags
    for argv, said in ((["--lr", "-1e-3"], "--lr -1e-3: must be a finite number > 0"),
                       (["--lr", "nan"], "--lr nan: must be a finite number > 0"),
                       (["--hidden", "0"], "--hidden 0: must be an integer >= 1"),
                       (["--nproc", "0"], "--nproc 0: must be an integer >= 1"),
                       (["--nproc", "-1"], "--nproc -1: must be an integer >= 1"),
                       (["--max-restarts", "-1"], "--max-restarts -1: must be an integer >= 0")):
        assert main(["train", "--layout", str(tmp_path), *argv]) == 2, argv
        err = " ".join(capsys.readouterr().err.split())
        assert said in err and "usage" not in err.lower() and "Traceback" not in err, err
    # `moment data pack` samples the training run's batches: the same ranges
    for argv, said in ((["--seed", "-1"], "--seed -1: must be an integer from 0 to"),
                       (["--batch-size", "0"], "--batch-size 0: must be an integer >= 1")):
        assert main(["data", "pack", "--layout", str(tmp_path), *argv]) == 2, argv
        assert said in " ".join(capsys.readouterr().err.split()), argv


def test_sizes_are_refused_beyond_what_exists(tmp_path: Path) -> None:
    from moment.runtime.budget import machine_limit

    limit, what = machine_limit()
    for value, said in (("", "--memory-budget '': give bytes"), ("  ", "--memory-budget '  ': give bytes"),
                        ("-1GiB", "--memory-budget -1GiB: give bytes"), ("0", "--memory-budget 0: must be positive"),
                        ("1000000GiB", f"more than this machine has ({what}:"),
                        ("150%", f"more than this machine has ({what}:")):
        with pytest.raises(MomentError) as e:
            parse_args(["--layout", str(tmp_path), "--memory-budget", value])
        assert said in str(e.value), str(e.value)
    assert parse_args(["--layout", str(tmp_path), "--memory-budget", "100%"]).memory_budget == "100%"
    for value, said in (("150%", "--cpu-cache-limit 150%: a share of the features must be at most 100%"),
                        ("abc", "--cpu-cache-limit abc: must be bytes"), ("", "--cpu-cache-limit '': must be bytes")):
        with pytest.raises(MomentError) as e:
            parse_args(["--layout", str(tmp_path), "--cpu-cache-limit", value])
        assert str(e.value).startswith(said), str(e.value)
    assert parse_args(["--layout", str(tmp_path), "--cpu-cache-limit", "100%"]).cpu_cache_limit == "100%"
    for value, said in (("150%", "--device-memory-budget 150%: a share of the device's memory must be at most 100%"),
                        ("lots", "--device-memory-budget lots: give bytes"), ("0", "--device-memory-budget 0: must "
                                                                                     "be positive")):
        with pytest.raises(MomentError) as e:  # its form at parse time; its size against the device in each rank
            parse_args(["--layout", str(tmp_path), "--device-memory-budget", value])
        assert str(e.value).startswith(said), str(e.value)
    assert parse_args(["--layout", str(tmp_path), "--device-memory-budget", "auto"]).device_memory_budget == "auto"


def _hint_options(hint: str) -> list[list[str]]:
    """The training options a hint suggests, each as argv (flag, and its value when it takes one)."""
    actions = build_parser()._option_string_actions
    out = []
    for flag, value in re.findall(r"(--[a-z][a-z-]*)(?:[ =]([^\s;()`]+))?", hint):
        if flag in actions and flag != "--help" and value not in ("out", "or", "and", "to"):  # "leave --io-backend out"
            out.append([flag] if actions[flag].nargs == 0 else [flag, value.rstrip(",.")])
    return out


def test_every_hint_suggests_options_the_parser_takes(tmp_path: Path, monkeypatch) -> None:
    from moment.io import engines
    from moment.io.device import DeviceMemory
    from moment.runtime.budget import RunShape, resolve_budget, split_budget
    from moment.runtime.device_budget import DeviceShape, device_budget, resolve_device_budget

    hints = []

    def hint_of(fn, *args) -> None:
        with pytest.raises(MomentError) as e:
            fn(*args)
        assert e.value.hint, str(e.value)
        hints.append(e.value.hint)

    monkeypatch.setattr(engines, "available_backends",
                        lambda: {"io_uring": "io_uring unavailable: not here", "pthreads": "", "python": ""})
    hint_of(engines.make_engine, "io_uring", 8, None)
    hint_of(resolve_budget, "1000000GiB")
    shape = RunShape(num_nodes=1000, row_bytes=128, graph_bytes=1 << 20, labels_bytes=1000, rows_max=500,
                     training_bytes=76_800, held_batches=4, lookahead=2, sampler_map_bytes=8000,
                     batch_ids_bytes=500 * 8 + 5000 * 16, index_bytes=5000, own_gpu_rows=0, layout_cpu_rows=0,
                     cpu_limit_rows=None, policy="static", shape="block", staging_bytes=1 << 20,
                     process_bytes=300 << 20, agent_bytes=0)
    hint_of(split_budget, 50 << 20, "given", 1, shape)
    hint_of(resolve_device_budget, "100GiB", DeviceMemory(8 << 30, 16 << 30))
    hint_of(device_budget, 256 << 20, "given", DeviceShape(row_bytes=128, own_gpu_rows=0, rows_max=500,
                                                          batch_ids_bytes=84_000, held_batches=4, training_bytes=76_800))
    hint_of(TrainConfig(layout=tmp_path, layers=3, fanouts=[5, 5]).resolved_fanouts)
    hint_of(parse_args, ["--layout", str(tmp_path), "--lr", "nan"])
    suggested = [argv for h in hints for argv in _hint_options(h)]
    for argv in suggested:
        parse_args(["--layout", str(tmp_path), *argv])  # raises if the parser refuses what the hint suggests
    assert ["--io-backend", "pthreads"] in suggested and ["--fanouts", "15,10,5"] in suggested
    assert any(a[0] == "--memory-budget" for a in suggested)
    assert ["--device-memory-budget", "8192MiB"] in suggested and ["--device-memory-budget", "769MiB"] in suggested
    assert any(a[0] == "--device-memory-budget" and a[1] != "8192MiB" for a in suggested)


@pytest.mark.slow
def test_moment_train_help_lists_every_forwarded_option(capsys) -> None:
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag in option_names():
        assert flag in text, flag
