"""The engine check's wire formats (nodewarm.api.enginecheck): the runner's result always fits the kubelet's
termination message and keeps the engine's last lines."""

from __future__ import annotations

from nodewarm.api.enginecheck import Reason, Result


def test_a_result_always_fits_a_termination_message_and_keeps_its_last_lines():
    lines = tuple(f"line {i} " + "x" * 300 for i in range(50))
    r = Result(False, Reason.ENGINE_BOOT_FAILED, "m" * 5000, log_tail=lines)
    text = r.to_json()
    assert len(text.encode()) <= 4096
    back = Result.from_json(text)
    assert back.log_tail and back.log_tail[-1].startswith("line 49 ")      # the newest line is kept, cut
    assert back.reason == Reason.ENGINE_BOOT_FAILED
