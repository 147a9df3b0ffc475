"""The huge-page policy: a balloon that reports free pages to its host is found from sysfs (a fake tree here),
and a run turns NumPy's advice off there and gives it back after."""

from __future__ import annotations

from pathlib import Path

import pytest

from moment.runtime.huge_pages import HugePages, _numpy_advice, reporting_balloon

REPORTING = "0110010100000000000000000000000010000000"  # this project's VMs: bit 5 (free page reporting) set
NOT_REPORTING = "0110000100000000000000000000000010000000"


def _sysfs(tmp_path: Path, devices: dict[str, tuple[str, str | None]]) -> Path:
    """A /sys with `name -> (driver, features)` virtio devices (features None: the file is missing)."""
    root = tmp_path / "sys"
    for name, (driver, features) in devices.items():
        drv = root / "bus" / "virtio" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        dev = root / "devices" / "virtio-mmio" / name
        dev.mkdir(parents=True)
        (dev / "driver").symlink_to(drv)
        if features is not None:
            (dev / "features").write_text(features + "\n")
        link = root / "bus" / "virtio" / "devices" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dev)
    return root


def test_a_reporting_balloon_is_found(tmp_path):
    root = _sysfs(tmp_path, {"virtio0": ("virtio_blk", REPORTING), "virtio1": ("virtio_balloon", REPORTING)})
    assert reporting_balloon(root) == "virtio1"  # a block device with the same bit set is not a balloon


@pytest.mark.parametrize("devices", [
    {"virtio0": ("virtio_balloon", NOT_REPORTING)},  # a balloon that does not report
    {"virtio0": ("virtio_balloon", None)},  # features unreadable
    {"virtio0": ("virtio_balloon", "0110")},  # too short to hold the bit
    {"virtio0": ("virtio_net", REPORTING)},
    {},  # no virtio devices at all
])
def test_no_reporting_balloon(tmp_path, devices):
    assert reporting_balloon(_sysfs(tmp_path, devices)) is None


def test_no_sysfs_means_no_balloon(tmp_path):
    assert reporting_balloon(tmp_path / "absent") is None


def test_a_run_turns_numpy_advice_off_only_behind_a_reporting_balloon(tmp_path):
    before = _numpy_advice(True)
    if before is None:
        pytest.skip("this NumPy has no switch for its huge-page advice")
    try:
        policy = HugePages(_sysfs(tmp_path, {"virtio0": ("virtio_balloon", REPORTING)}))
        assert policy.summary()["mode"] == "reads only" and "virtio0" in policy.summary()["why"]
        assert _numpy_advice(False) is False  # it was off while the run held it
        policy.restore()
        assert _numpy_advice(True) is True  # given back as it was before the run
        policy.restore()  # twice is harmless
        assert _numpy_advice(True) is True

        plain = HugePages(_sysfs(tmp_path / "b", {"virtio0": ("virtio_balloon", NOT_REPORTING)}))
        assert plain.summary() == {"mode": "numpy", "why": None}
        assert _numpy_advice(True) is True  # untouched
        plain.restore()
        assert _numpy_advice(True) is True
    finally:
        _numpy_advice(before)
