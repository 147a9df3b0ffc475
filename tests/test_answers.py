"""Kept answers (moment.cli.answers): `moment plan` asked again prints what it printed before, without loading the
planner, and only while everything the answer depends on is as it was."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

import moment.cli as cli
from moment.cli import answers
from moment.topology.profiles import PROFILE_DIR

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--profile", "paper-machine-b", "--gpus", "2", "--ssds", "4", "--json"]

#: runs `moment ARGS` in a fresh process; prints, on stderr's last line, whether the planner was imported
_RUN = """
import sys
from moment.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print("planner-loaded" if "moment.planner.plan" in sys.modules else "planner-not-loaded", file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """Kept answers on, in a cache of the test's own; the command runs in `tmp_path/work`."""
    monkeypatch.setenv("MOMENT_ANSWERS", "on")
    monkeypatch.setenv("MOMENT_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path / "cache" / "answers"


def run(args: list[str], **env: str) -> tuple[int, str, str, bool]:
    """(exit code, stdout, stderr without the last line, whether the planner was loaded): `moment ARGS` in a fresh
    process, for what only a process shows (the planner's modules not imported, two processes at once)."""
    r = subprocess.run([sys.executable, "-c", _RUN, *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    *err, last = r.stderr.rstrip("\n").split("\n")
    return r.returncode, r.stdout, "\n".join(err), last == "planner-loaded"


@pytest.fixture
def ask(kept, monkeypatch, capsys):
    """`run` in this process (each start-up and planner import cost a subprocess ~0.4 CPU-s): (exit code, stdout,
    stderr, whether the command ran, i.e. solved, rather than printing a kept answer)."""
    ran = []
    real = cli._run

    def spy(argv):
        ran.append(argv)
        return real(argv)

    monkeypatch.setattr(cli, "_run", spy)

    def ask(args: list[str], **env: str) -> tuple[int, str, str, bool]:
        capsys.readouterr()
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value)
            del ran[:]
            code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err.rstrip("\n"), bool(ran)
    return ask


def solved(out: str) -> dict:
    """A plan's JSON without its search's timings (two solves of one question differ only there)."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if not k.startswith("seconds")}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return strip(json.loads(out))


@pytest.mark.parametrize("name", sorted(answers.KEPT))
def test_kept_and_unkept_options_are_exactly_the_commands_options(name):
    """A new option of a command is classified before its answers are kept (KEPT: may be given, and whether it
    takes a value; NOT_KEPT: never kept); ARGUMENTS: the commands that take words besides their options."""
    cli._register([name])
    command = typer.main.get_command(cli.app).commands[name]
    options = [p for p in command.params if p.param_type_name == "option"]
    real = {opt: not p.is_flag for p in options for opt in p.opts} | {"--help": False, "-h": False}
    assert set(answers.KEPT[name]) | set(answers.NOT_KEPT[name]) == set(real)
    assert not set(answers.KEPT[name]) & set(answers.NOT_KEPT[name])
    assert {k: real[k] for k in answers.KEPT[name]} == answers.KEPT[name]
    assert (name in answers.ARGUMENTS) == any(p.param_type_name == "argument" for p in command.params)


@pytest.mark.parametrize("argv", [
    ["plan", "--diagram", "x.svg"], ["plan", "--timeout", "5"], ["plan", "--cluster", "c.yaml"],
    ["plan", "--help"], ["plan", "--gpus"], ["plan", "extra"], ["plan", "--json=1"], ["plan", "--bogus", "1"],
    ["compare", "--profile", "paper-machine-b"], ["compare", "a", "--", "b"], [], ["plan", "paper-machine-b"]])
def test_command_lines_that_are_never_kept(kept, argv):
    assert answers.question(argv) is None


def test_the_second_ask_prints_the_first_answer_without_loading_the_planner(kept):
    code, first, err, loaded = run(PLAN)
    assert (code, err, loaded) == (0, "", True)
    assert len(list(kept.glob("*.json"))) == 1
    code, again, err, loaded = run(PLAN)
    assert (code, err, loaded) == (0, "", False)
    assert again == first and json.loads(again)["placement"]
    # the option order is part of the question: another order is solved (and kept) anew
    reordered = ["plan", "--gpus", "2", "--profile", "paper-machine-b", "--ssds", "4", "--json"]
    assert run(reordered)[3] is True
    # --fresh solves again, keeps the new answer in the old one's place
    code, fresh, _, loaded = run([*PLAN, "--fresh"])
    assert (code, loaded) == (0, True) and solved(fresh) == solved(first)
    assert len(list(kept.glob("*.json"))) == 2


def test_a_comparison_is_kept_too_and_its_profiles_files_checked(kept, ask, tmp_path):
    profile = tmp_path / "work" / "m.yaml"
    profile.write_text((PROFILE_DIR / "paper-machine-b.yaml").read_text())
    args = ["compare", "paper-machine-a", "m.yaml", "--gpus", "2", "--ssds", "4", "--json"]
    code, first, err, loaded = ask(args)
    assert (code, err, loaded) == (0, "", True) and len(json.loads(first)) == 2
    assert ask(args)[1:] == (first, "", False)
    profile.write_text(profile.read_text().replace("name: paper-machine-b", "name: machine-m"))
    code, out, _, loaded = ask(args)
    assert (code, loaded) == (0, True) and len(json.loads(out)) == 2  # solved again, not the kept answer


def test_advice_is_kept_and_given_again_when_its_price_file_changes(kept, ask, tmp_path):
    prices = tmp_path / "work" / "prices.yaml"
    prices.write_text("devices:\n  P5510: {price_usd: 1000, date: 2025-01, source: me}\n")
    args = ["advise", "--profile", "paper-machine-b", "--budget", "60000", "--models", "A100-PCIe-40GB,P5510",
            "--prices", "prices.yaml", "--json", "--jobs", "1", "--max-gpus", "2", "--max-ssds", "4"]  # (small: 1.4 -> 0.4 CPU-s)
    code, first, err, loaded = ask(args)
    assert (code, err, loaded) == (0, "", True)
    assert ask(args)[1:] == (first, "", False)
    prices.write_text("devices:\n  P5510: {price_usd: 9000, date: 2025-01, source: me}\n")
    code, out, _, loaded = ask(args)
    assert (code, loaded) == (0, True) and out != first  # dearer SSDs: other advice, not the kept one


def test_a_changed_input_file_is_solved_again(kept, ask, tmp_path):
    profile = tmp_path / "work" / "m.yaml"
    profile.write_text((PROFILE_DIR / "paper-machine-b.yaml").read_text())
    args = ["plan", "--profile", "m.yaml", "--gpus", "2", "--ssds", "4", "--json"]
    first = ask(args)
    assert first[0] == 0 and first[3]
    assert ask(args)[1:] == (first[1], "", False)
    # the same file renamed inside: the kept answer would name the old machine
    profile.write_text(profile.read_text().replace("name: paper-machine-b", "name: machine-m"))
    code, out, _, loaded = ask(args)
    assert (code, loaded) == (0, True)
    assert json.loads(out)["machine"] == "machine-m" != json.loads(first[1])["machine"]
    # removed: the error, not a kept answer
    profile.unlink()
    code, out, err, _ = ask(args)
    assert code == 2 and out == "" and "m.yaml" in err


def test_a_changed_calibration_is_solved_again(kept, ask, tmp_path):
    cal = tmp_path / "work" / "cal.yaml"
    cal.write_text("fitted_on: x\nfitted: []\nparams: {socket_link: 0.9}\n")
    args = [*PLAN, "--calibration", "cal.yaml"]
    code, first, _, loaded = ask(args)
    assert (code, loaded) == (0, True) and json.loads(first)["calibration"]["params"]["socket_link"] == 0.9
    assert ask(args)[1:] == (first, "", False)
    cal.write_text("fitted_on: x\nfitted: []\nparams: {socket_link: 0.5}\n")
    code, out, _, loaded = ask(args)
    assert (code, loaded) == (0, True) and json.loads(out)["calibration"]["params"]["socket_link"] == 0.5


def test_a_file_that_now_shadows_a_builtin_name_is_solved_again(kept, ask, tmp_path):
    args = ["plan", "--profile", "paper-machine-b", "--gpus", "2", "--ssds", "4", "--json"]
    assert ask(args)[0] == 0
    (tmp_path / "work" / "paper-machine-b").write_text(
        (PROFILE_DIR / "paper-machine-b.yaml").read_text().replace("name: paper-machine-b", "name: the-local-one"))
    code, out, _, loaded = ask(args)
    assert (code, loaded) == (0, True) and json.loads(out)["machine"] == "the-local-one"


def test_a_changed_environment_or_working_directory_is_another_question(kept, ask, tmp_path):
    assert ask(PLAN)[3] is True
    assert ask(PLAN, MOMENT_PROFILE_DIR=str(PROFILE_DIR))[3] is True
    assert ask(PLAN, COLUMNS="100")[3] is True
    other = tmp_path / "elsewhere"
    other.mkdir()
    os.chdir(other)
    assert ask(PLAN)[3] is True
    assert ask(PLAN)[3] is False


@pytest.mark.parametrize("damage", ["truncated", "edited answer", "not json", "empty", "directory"])
def test_a_corrupt_entry_is_a_miss_and_is_replaced(kept, ask, damage):
    first = ask(PLAN)
    (entry,) = kept.glob("*.json")
    text = entry.read_text()
    if damage == "truncated":
        entry.write_text(text[:len(text) // 2])
    elif damage == "edited answer":
        doc = json.loads(text)
        doc["stdout"] = doc["stdout"].replace('"recommended"', '"recommended_"')
        entry.write_text(json.dumps(doc))
    elif damage == "not json":
        entry.write_bytes(b"\xff\x00garbage")
    elif damage == "empty":
        entry.write_text("")
    else:
        entry.unlink()
        entry.mkdir()
    code, out, err, loaded = ask(PLAN)
    assert (code, err, loaded) == (0, "", True) and solved(out) == solved(first[1])
    if damage != "directory":
        assert json.loads(entry.read_text())["stdout"] == out  # replaced by the fresh answer


def test_an_entry_another_user_wrote_is_not_trusted(kept, monkeypatch):
    asked = answers.question(PLAN)
    with asked.recording():
        print("the answer")
    asked.keep(0)
    assert answers.question(PLAN).replay(io.StringIO())
    monkeypatch.setattr(os, "getuid", lambda: os.stat(asked.path).st_uid + 1)  # as if another user owned it
    assert not answers.question(PLAN).replay(io.StringIO())


def test_a_cache_that_cannot_be_written_keeps_nothing_and_says_nothing(kept, ask):
    kept.parent.mkdir(parents=True)
    kept.write_text("a file where the answers' folder goes")  # as a read-only folder does, for root too
    for _ in range(2):
        code, out, err, loaded = ask(PLAN)
        assert (code, err, loaded) == (0, "", True) and json.loads(out)["placement"]
    kept.unlink()
    kept.mkdir()
    kept.chmod(0o500)
    try:
        if not os.access(kept, os.W_OK):  # (root writes to it anyway)
            code, out, err, loaded = ask(PLAN)
            assert (code, err, loaded) == (0, "", True) and not list(kept.iterdir())
    finally:
        kept.chmod(0o700)


def test_failed_or_warning_runs_and_the_switch_off_keep_nothing(kept, ask):
    assert ask(["plan", "--profile", "no-such-machine", "--gpus", "2"])[0] == 2
    assert ask(["plan", "--gpus", "2", "--ssds", "4", "--gpu-cache-share", "2"])[0] == 2
    assert not kept.exists() or not list(kept.glob("*.json"))
    assert ask(PLAN, MOMENT_ANSWERS="off")[0] == 0
    assert not kept.exists() or not list(kept.glob("*.json"))


def test_an_answer_with_a_warning_is_not_kept(kept, capsys):
    asked = answers.question(PLAN)
    with asked.recording():
        print("the answer")
        print("warning: something", file=sys.stderr)
    asked.keep(0)
    assert not kept.exists() or not list(kept.glob("*.json"))
    with asked.recording():
        print("the answer")
    asked.keep(0)
    assert capsys.readouterr().out == "the answer\nthe answer\n"
    assert asked.replay(sys.stdout) and capsys.readouterr().out == "the answer\n"


def test_a_progress_bar_is_drawn_past_the_recording_and_the_answer_is_kept(kept, monkeypatch, capsys):
    from rich.console import Console

    from moment.cli import common

    monkeypatch.setattr(common, "err_console", Console(stderr=True, force_terminal=True))  # the bar is drawn
    drawn, untracked = [], answers.untracked

    def spy(stream):
        drawn.append(stream)
        return untracked(stream)

    monkeypatch.setattr(answers, "untracked", spy)
    asked = answers.question(PLAN)
    with asked.recording():
        with common.solver_bar(True) as cb:
            assert cb is not None
            cb(1, 2)
        print("the answer")
    asked.keep(0)
    assert len(drawn) == 1 and isinstance(drawn[0], answers._Tee)  # the bar's stream: under the copy
    assert asked.replay(sys.stdout) and capsys.readouterr().out == "the answer\nthe answer\n"


def test_a_person_is_told_the_answer_was_kept_a_script_is_not(kept):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    asked = answers.question(PLAN)
    with asked.recording():
        print("the answer")
    asked.keep(0)
    out, pipe, terminal = io.StringIO(), io.StringIO(), Terminal()
    assert asked.replay(out, pipe) and asked.replay(out, terminal)
    assert out.getvalue() == "the answer\n" * 2 and pipe.getvalue() == ""
    assert terminal.getvalue().startswith("(the answer kept on ") and "--fresh solves again" in terminal.getvalue()


def test_the_oldest_entries_go_beyond_the_limit(kept, monkeypatch):
    monkeypatch.setattr(answers, "MAX_ENTRIES", 2)
    for gpus in ("1", "2", "3"):
        asked = answers.question(["plan", "--gpus", gpus])
        with asked.recording():
            print(gpus)
        asked.keep(0)
        os.utime(asked.path, ns=(int(gpus) * 10**9, int(gpus) * 10**9))
    assert len(list(kept.glob("*.json"))) == 2
    assert not answers.question(["plan", "--gpus", "1"]).replay(sys.stdout)
    assert answers.question(["plan", "--gpus", "3"]).replay(sys.stdout)


def test_two_processes_asking_at_once_both_answer_and_leave_one_whole_entry(kept):
    env = {**os.environ}
    procs = [subprocess.Popen([sys.executable, "-c", _RUN, *PLAN], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and solved(outs[0][0]) == solved(outs[1][0])
    (entry,) = kept.glob("*.json")
    kept_out = json.loads(entry.read_text())["stdout"]
    assert kept_out in (outs[0][0], outs[1][0])  # one of the two, whole
    assert not [p for p in kept.iterdir() if p.suffix != ".json"]  # no temporary file left
    assert run(PLAN)[1:] == (kept_out, "", False)
