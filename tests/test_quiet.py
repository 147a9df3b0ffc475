"""`moment.io.quiet`: a disturbed measurement is told from a quiet one (bench/fidelity.py refuses it)."""

from __future__ import annotations

import os

import pytest

from moment.io import quiet
from moment.io.quiet import Snapshot, judge, others_cores, spread


def test_a_quiet_probe_passes():
    v = judge({"iops": [10_000, 10_300, 9_900], "seq_GBps": [2.0, 2.05, 1.98]}, 0.05,
              quiet={"iops": 10_200, "seq_GBps": 2.1})
    assert not v.disturbed and v.reasons == [] and v.line() == "no"


def test_other_processes_cpu_disturbs():
    v = judge({"iops": [10_000, 10_100]}, 1.4)
    assert v.disturbed and "other processes used 1.40 cores" in v.line()
    assert not judge({"iops": [10_000]}, None).disturbed  # cannot tell: judged on the rest


def test_rounds_that_spread_disturb():
    v = judge({"iops": [10_000, 6_000, 10_100]}, 0.0)
    assert v.disturbed and "iops rounds spread 41%" in v.reasons[0]
    assert spread([1.0, 1.1, 1.05]) == pytest.approx(0.1 / 1.05)
    assert spread([5.0]) == 0.0


def test_a_probe_far_from_the_earlier_quiet_one_disturbs():
    v = judge({"iops": [7_000, 7_050, 7_020], "seq_GBps": [2.0, 2.0, 2.0]}, 0.0,
              quiet={"iops": 10_000, "other": 1.0})
    assert v.disturbed and len(v.reasons) == 1 and "-30% off the earlier quiet probe's 1e+04" in v.reasons[0]
    # faster than the quiet probe, with tight rounds and an idle machine: the disk changed, nothing disturbed it
    assert not judge({"iops": [13_000, 13_050, 13_020]}, 0.0, quiet={"iops": 10_000}).disturbed


def test_others_cores_is_the_machines_cpu_less_ours():
    a = Snapshot(wall=100.0, machine_cpu_s=1_000.0, own_cpu_s=50.0, loadavg=1.0)
    b = Snapshot(wall=110.0, machine_cpu_s=1_016.0, own_cpu_s=60.0, loadavg=2.0)
    assert others_cores(a, b) == pytest.approx(0.6)  # 16 s busy in 10 s, 10 of them ours
    assert others_cores(a, Snapshot(110.0, None, 60.0, None)) is None


def test_machine_cpu_counts_busy_fields_only(tmp_path):
    stat = tmp_path / "stat"
    hz = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal: idle and iowait are not busy
    stat.write_text(f"cpu  {hz} {hz} {hz} {100 * hz} {50 * hz} {hz} {hz} {hz} 0 0\ncpu0 1 2 3\n")
    assert quiet._machine_cpu_s(str(stat)) == pytest.approx(6.0)
    assert quiet._machine_cpu_s(str(tmp_path / "absent")) is None


def test_a_snapshot_of_this_process_counts_its_cpu():
    a = quiet.snapshot()
    x = 0
    for i in range(2_000_000):
        x += i
    b = quiet.snapshot()
    assert b.own_cpu_s > a.own_cpu_s and b.wall > a.wall
