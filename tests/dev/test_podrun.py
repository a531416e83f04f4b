"""nodewarm_dev.testenv.podrun, the kubelet stand-in the engine tests start rendered containers with: the image (the
serving environment) stays visible inside a pod whose private /tmp covers the machine's, wherever the checkout lies."""

from __future__ import annotations

import os
import sys

from nodewarm_dev.testenv import podrun


def test_an_image_under_the_machines_tmp_is_still_there_inside_the_pods_private_tmp(tmp_path, monkeypatch):
    # pytest's tmp_path is under /tmp, as a checkout cloned there would be: the image's python3 lies beside it.
    assert tmp_path.is_relative_to("/tmp")
    image = tmp_path / "image"
    (image / "bin").mkdir(parents=True)
    (image / "bin" / "python3").symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setenv("NODEWARM_SERVING_VENV", str(image))
    spec = {"containers": [{"name": "c", "command": ["python3", "-c", "import sys; print(sys.executable)"],
                            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch-podrun-test"}]}],
            "volumes": [{"name": "scratch", "emptyDir": {}}]}
    pod = podrun.start(spec, "c", node_root=tmp_path / "node", work=tmp_path / "work")
    try:
        assert pod.proc.wait(60) == 0, pod.text()
    finally:
        pod.stop()
    # Without the image bound back, PATH falls through to the machine's own python3.
    assert pod.text().split() == [str(image / "bin" / "python3")], pod.text()
    assert not os.path.exists("/scratch-podrun-test")     # the mount point made for the pod is gone again
