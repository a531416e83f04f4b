"""What the node agent's service decides without the cluster (bootstrap/followplan.py): which older weights a new
generation's warm may remove and which older pods it waits for."""

from __future__ import annotations

from nodewarm.api.names import GENERATION_LABEL
from nodewarm.bootstrap.followplan import older_pods, stale_model_dirs


def test_stale_dirs_are_only_the_agents_own_folders(tmp_path):
    models = tmp_path / "models" / "p"
    for name in ("0123456789ab", "ba9876543210", "not-a-key", "0123456789abcd"):
        (models / name).mkdir(parents=True)
    (models / "fedcba987654").symlink_to(tmp_path)            # a planted link is never followed or removed
    assert [d.name for d in stale_model_dirs(models, keep="0123456789ab")] == ["ba9876543210"]


def test_older_pods_are_the_running_ones_of_another_generation():
    pods = [{"metadata": {"name": "old", "labels": {GENERATION_LABEL: "g1"}}, "status": {"phase": "Running"}},
            {"metadata": {"name": "done", "labels": {GENERATION_LABEL: "g1"}}, "status": {"phase": "Succeeded"}},
            {"metadata": {"name": "new", "labels": {GENERATION_LABEL: "g2"}}, "status": {"phase": "Pending"}}]
    assert older_pods(pods, "g2") == ["old"]
