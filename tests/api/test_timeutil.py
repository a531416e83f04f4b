"""Times as the cluster's objects carry them and as people read them (nodewarm.api.timeutil): anything that is not an
RFC 3339 time reads as unknown, a time nodewarm wrote reads back to the millisecond (metav1 times to the second), and
durations read as kubectl writes them."""

from __future__ import annotations

import pytest

from nodewarm.api.timeutil import fmt_duration, fmt_time, fmt_time_s, parse_time

T0 = 1_800_000_000.0            # 2027-01-15T08:00:00Z


@pytest.mark.parametrize("value", [None, "", "soon", "2027-13-01T00:00:00Z", 1_800_000_000, {"at": "2027"}])
def test_anything_that_is_not_a_time_reads_as_unknown(value):
    assert parse_time(value) is None


def test_a_written_time_reads_back_to_the_millisecond_and_a_metav1_time_to_the_second():
    assert fmt_time(T0 + 0.25) == "2027-01-15T08:00:00.250Z"
    assert parse_time(fmt_time(T0 + 29.75)) == T0 + 29.75
    assert fmt_time_s(T0 + 29.75) == "2027-01-15T08:00:29Z"
    assert parse_time(fmt_time_s(T0 + 29.75)) == T0 + 29
    assert parse_time("2027-01-15T08:00:00+00:00") == parse_time("2027-01-15T08:00:00Z") == T0
    assert fmt_time(None) is None


@pytest.mark.parametrize("seconds, text", [
    (None, "-"), (-5, "0s"), (0, "0s"), (45, "45s"), (59.9, "59s"), (60, "1m"), (252, "4m12s"), (3600, "1h"),
    (7500, "2h5m"), (3 * 86400 + 4 * 3600 + 59, "3d4h"),
])
def test_durations_read_as_kubectl_writes_them(seconds, text):
    assert fmt_duration(seconds) == text
