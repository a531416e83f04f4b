"""AL2023 user data: a MIME shell part that installs a systemd unit ordered after nodeadm-run."""

from __future__ import annotations

import email
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nodewarm.userdata.al2023 import UNIT_NAME, render_part, render_script
from nodewarm.userdata.errors import UserDataInvalid
from nodewarm.userdata.mime import NODEWARM_MARKER
from nodewarm.userdata.package import launcher

from support.userdata_parts import SHA, check_shell, heredoc, launch


def test_part_is_a_single_ascii_shell_part_that_email_parses():
    msg = email.message_from_string(render_part(launch()))
    assert msg.is_multipart()
    [part] = msg.get_payload()
    assert part["Content-Type"] == 'text/x-shellscript; charset="us-ascii"'
    body = part.get_payload()
    assert body == render_script(launch())
    assert body.startswith("#!/bin/bash\n") and body.split("\n")[1] == NODEWARM_MARKER
    assert body.isascii()


def test_script_installs_the_unit_and_starts_it_without_blocking():
    script = render_script(launch())
    starts = [line for line in script.splitlines() if line.startswith("systemctl start")]
    # Blocking would deadlock: nodeadm-run waits for cloud-final, which would wait for the unit.
    assert starts == [f"systemctl start --no-block {UNIT_NAME}"]
    assert script.index("systemctl daemon-reload") < script.index(starts[0])
    # Nothing downloads or warms inside cloud-init: only the unit's launcher calls aws.
    outside_heredocs = re.sub(r"<<'NODEWARM_EOF'\n.*?\nNODEWARM_EOF\n", "", script, flags=re.S)
    commands = "\n".join(line for line in outside_heredocs.splitlines() if not line.lstrip().startswith("#"))
    assert "aws " not in commands and "bootstrap run" not in commands


def test_unit_is_ordered_after_nodeadm_run_and_the_raid_mount():
    unit = heredoc(render_script(launch()), f"/etc/systemd/system/{UNIT_NAME}")
    keys = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert "nodeadm-run.service" in keys["After"].split()
    assert keys["RequiresMountsFor"] == "/mnt/k8s-disks/0"
    assert keys["Restart"] == "on-failure" and int(keys["StartLimitBurst"]) >= 1
    assert "3" in keys["RestartPreventExitStatus"].split()
    assert keys["ExecStart"].split() == ["/opt/nodewarm/bin/nodewarm-launch", *launch().bootstrap_argv()]
    assert keys["EnvironmentFile"] == "/etc/nodewarm/bootstrap.env"


def test_environment_file_pins_the_artifact_and_holds_no_credentials():
    script = render_script(launch())
    env = dict(line.split("=", 1) for line in heredoc(script, "/etc/nodewarm/bootstrap.env").splitlines())
    # No region: the launcher asks instance metadata, so the same user data (and hash) fits every region.
    assert env == {"NODEWARM_ARTIFACT_URI": launch().artifact_uri, "NODEWARM_ARTIFACT_SHA256": SHA}
    for secret in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "aws_secret"):
        assert secret not in script


def test_shell_syntax_and_shellcheck(tmp_path):
    script = render_script(launch())
    files = {
        "part.sh": ("bash", script),
        "nodewarm-launch": ("bash", heredoc(script, "/opt/nodewarm/bin/nodewarm-launch")),
        "artifact-launcher": ("sh", launcher("3.11", "x86_64", "2.34")),
    }
    check_shell(files, tmp_path)


def _verify_unit(tmp_path: Path, unit: str) -> subprocess.CompletedProcess:
    """systemd-analyze verify in a scratch root: the standard targets, the launcher and the env file."""
    root = tmp_path / "root"
    (root / "usr/lib/systemd/system").mkdir(parents=True)
    for target in Path("/lib/systemd/system").glob("*.target"):
        shutil.copy(target, root / "usr/lib/systemd/system")
    launch_path = root / "opt/nodewarm/bin/nodewarm-launch"
    launch_path.parent.mkdir(parents=True)
    launch_path.write_text("#!/bin/sh\n")
    launch_path.chmod(0o755)
    (root / "etc/nodewarm").mkdir(parents=True)
    (root / "etc/nodewarm/bootstrap.env").write_text("")
    unit_path = root / "etc/systemd/system" / UNIT_NAME
    unit_path.parent.mkdir(parents=True)
    unit_path.write_text(unit)
    return subprocess.run(["systemd-analyze", "verify", f"--root={root}", str(unit_path)],
                          capture_output=True, text=True)


@pytest.mark.skipif(not shutil.which("systemd-analyze") or not Path("/lib/systemd/system/sysinit.target").exists(),
                    reason="systemd-analyze and the systemd unit files are not installed (apt-get install systemd)")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    unit = heredoc(render_script(launch()), f"/etc/systemd/system/{UNIT_NAME}")
    good = _verify_unit(tmp_path / "good", unit)
    assert good.returncode == 0 and good.stderr == "" and good.stdout == "", good
    # The check has teeth: an ExecStart that is not an absolute path is a fatal unit error.
    bad = _verify_unit(tmp_path / "bad", unit.replace("ExecStart=/opt", "ExecStart=opt"))
    assert bad.returncode != 0 and "absolute path" in bad.stderr


def test_boot_time_line_is_json_with_boot_before_userdata():
    script = render_script(launch())
    awk = re.search(r"^(awk .*?) \\\n  /proc/uptime > /var/lib/nodewarm/boot-time$", script, re.M)
    assert awk, "boot-time line not found"
    out = subprocess.run(["bash", "-c", awk.group(1) + " /proc/uptime"], capture_output=True, text=True, check=True)
    times = json.loads(out.stdout)
    assert set(times) == {"boot", "userdata"} and 0 < times["boot"] <= times["userdata"]


def test_bootstrap_argv_names_only_the_profile_and_the_mount():
    # Everything else is read from the WarmProfile object at boot: the unit's command line is in the
    # EC2NodeClass's userData, which Karpenter hashes.
    assert launch().bootstrap_argv() == ["bootstrap", "run", "--profile", "llama-8b", "--mount", "/mnt/k8s-disks/0",
                                         "--skip-load-check"]


@pytest.mark.parametrize("field,value", [
    ("artifact_sha256", "abc"),
    ("artifact_sha256", SHA.upper()),
    ("artifact_uri", "https://cache-bucket/nodewarm.tar.gz"),
    ("artifact_uri", "s3://cache-bucket/"),
    ("cache_mount", "mnt/k8s-disks/0"),
    ("cache_mount", "/mnt/k8s-disks/0/../../etc"),
    ("cache_mount", "/mnt/%b"),                  # systemd would expand %b
    ("profile", "llama $(reboot)"),
    ("profile", "Llama"),
    ("artifact_uri", "s3://cache/${HOME}.tar.gz"),
])
def test_invalid_launch_settings_are_refused(field, value):
    with pytest.raises(UserDataInvalid, match=f"BootstrapLaunch.{field}"):
        launch(**{field: value})


def test_artifact_uri_and_sha_come_together_and_al2023_needs_them():
    with pytest.raises(UserDataInvalid, match="both artifact_uri and artifact_sha256"):
        launch(artifact_sha256=None)
    with pytest.raises(UserDataInvalid, match="nodewarm package"):
        render_part(launch(artifact_uri=None, artifact_sha256=None))
