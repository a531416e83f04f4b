"""nodewarm/bootstrap/weights/capacity.py: the free-space check, on a real small filesystem."""

from __future__ import annotations

import pytest

from support.bootstrap_fixtures import loop_volume
from nodewarm.bootstrap.weights import capacity

MiB = 1024 * 1024


def test_headroom_is_the_larger_of_fraction_and_minimum():
    h = capacity.Headroom(fraction=0.1, minimum_bytes=5 * MiB)
    assert h.for_bytes(10 * MiB) == 5 * MiB
    assert h.for_bytes(100 * MiB) == 10 * MiB


def test_fits_and_does_not_fit():
    space = capacity.Space("/mnt/k8s-disks/0", free_bytes=100 * MiB, total_bytes=200 * MiB)
    capacity.check_fits(space, 90 * MiB, capacity.Headroom(0, 10 * MiB))
    with pytest.raises(capacity.InsufficientNVMe) as e:
        capacity.check_fits(space, 91 * MiB, capacity.Headroom(0, 10 * MiB))
    assert e.value.reason == "InsufficientNVMe"
    assert "/mnt/k8s-disks/0" in str(e.value) and "headroom" in str(e.value)


def test_free_space_of_a_real_volume_drives_the_check(tmp_path):
    with loop_volume(tmp_path, 16) as vol:
        space = capacity.free_space(str(vol))
        assert 10 * MiB < space.free_bytes <= space.total_bytes <= 16 * MiB
        capacity.check_fits(space, space.free_bytes // 2, capacity.Headroom(0, 0))
        (vol / "filler").write_bytes(b"\0" * (space.free_bytes - 2 * MiB))
        fuller = capacity.free_space(str(vol))
        with pytest.raises(capacity.InsufficientNVMe):
            capacity.check_fits(fuller, space.free_bytes // 2, capacity.Headroom(0, 0))
