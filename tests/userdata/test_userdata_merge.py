"""Merging nodewarm's part into existing AL2023 user data: order, idempotence, Karpenter's labels, 16 KB."""

from __future__ import annotations

import email

import pytest

from nodewarm.userdata.al2023 import render_part
from nodewarm.userdata.errors import UserDataInvalid, UserDataNotMime, UserDataTooLarge
from nodewarm.userdata.launch import BootstrapLaunch
from nodewarm.userdata.merge import KARPENTER_NODECONFIG_RESERVE, USER_DATA_LIMIT, merge
from nodewarm.userdata.mime import NODE_CONFIG, SHELL_SCRIPT, Part, parse, serialize

NODECONFIG = """\
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  kubelet:
    config:
      maxPods: 110
"""

USER_ARCHIVE = (
    "MIME-Version: 1.0\r\n"
    'Content-Type: multipart/mixed; boundary="BOUNDARY"\r\n'
    "\r\n"
    "--BOUNDARY\r\n"
    'Content-Type: text/x-shellscript; charset="us-ascii"\r\n'
    "\r\n"
    "#!/bin/bash\r\n"
    "echo first > /etc/first\r\n"
    "--BOUNDARY\r\n"
    "Content-Type: application/node.eks.aws\r\n"
    "\r\n"
    + NODECONFIG.replace("\n", "\r\n")
    + "--BOUNDARY\r\n"
    "Content-Type: text/cloud-config\r\n"
    "\r\n"
    "#cloud-config\r\n"
    "write_files: []\r\n"
    "--BOUNDARY--\r\n"
)


def launch(sha: str = "ab" * 32) -> BootstrapLaunch:
    return BootstrapLaunch(artifact_uri="s3://cache-bucket/nodewarm/a.tar.gz", artifact_sha256=sha, profile="p",
                           cache_mount="/mnt/k8s-disks/0")


def content_types(user_data: str) -> list[str]:
    return [p["Content-Type"] for p in email.message_from_string(user_data).get_payload()]


def test_no_existing_user_data_gives_ours_alone_and_the_budget():
    ours = render_part(launch())
    result = merge(None, ours)
    assert result.added and result.user_data == ours
    assert result.bytes_used == len(ours.encode()) + KARPENTER_NODECONFIG_RESERVE
    assert result.budget_left == USER_DATA_LIMIT - result.bytes_used > 8000


def test_merge_is_idempotent_and_hands_back_the_same_bytes():
    ours = render_part(launch())
    first = merge(USER_ARCHIVE, ours)
    again = merge(first.user_data, ours)
    assert not again.added and again.user_data == first.user_data
    assert again.bytes_used == first.bytes_used


def test_user_parts_keep_their_order_and_content_and_ours_comes_last():
    result = merge(USER_ARCHIVE, render_part(launch()))
    parts = parse(result.user_data)
    assert [p.content_type for p in parts] == [SHELL_SCRIPT, NODE_CONFIG, "text/cloud-config", SHELL_SCRIPT]
    assert parts[0].content == "#!/bin/bash\necho first > /etc/first"
    assert parts[1].content == NODECONFIG.rstrip("\n")
    assert parts[3].is_nodewarm and not any(p.is_nodewarm for p in parts[:3])
    assert "\r" not in result.user_data


def test_an_older_nodewarm_part_is_replaced_where_it_stood():
    old = merge(USER_ARCHIVE, render_part(launch("09" * 32))).user_data
    parts = parse(old)
    moved = serialize([parts[3], *parts[:3]])           # the user had moved our part first
    result = merge(moved, render_part(launch("10" * 32)))
    new_parts = parse(result.user_data)
    assert result.added
    assert [p.is_nodewarm for p in new_parts] == [True, False, False, False]
    assert "10" * 32 in new_parts[0].content and "09" * 32 not in result.user_data


def test_ours_must_come_from_render_part():
    with pytest.raises(UserDataInvalid, match="render_part"):
        merge(None, serialize([Part(SHELL_SCRIPT, "#!/bin/bash\necho not ours")]))


def test_a_bare_script_is_wrapped_as_karpenter_would():
    result = merge("#!/bin/bash\necho hello\n", render_part(launch()))
    parts = parse(result.user_data)
    assert [p.content_type for p in parts] == [SHELL_SCRIPT, SHELL_SCRIPT]
    assert parts[0].content == "#!/bin/bash\necho hello\n" and parts[1].is_nodewarm


def test_a_bare_nodeconfig_is_wrapped_as_a_nodeconfig():
    parts = parse(merge(NODECONFIG, render_part(launch())).user_data)
    assert [p.content_type for p in parts] == [NODE_CONFIG, SHELL_SCRIPT]


@pytest.mark.parametrize("plain,why", [
    ("#!/bin/bash\n# set up later\n", "would label it application/node.eks.aws"),      # comments-only script
    ("#!/bin/bash\nkey: value\n", "would label it application/node.eks.aws"),          # a script that is YAML
    ("echo no shebang\n", "Add a #! line"),
    ("#cloud-config\npackages: [jq]\n", "Add a #! line"),
])
def test_plain_user_data_that_karpenter_would_mislabel_is_refused(plain, why):
    with pytest.raises(UserDataNotMime, match=why):
        merge(plain, render_part(launch()))


def test_a_mime_document_that_is_not_multipart_is_refused():
    single = 'MIME-Version: 1.0\nContent-Type: text/x-shellscript; charset="us-ascii"\n\n#!/bin/bash\necho\n'
    with pytest.raises(UserDataNotMime, match="not multipart"):
        merge(single, render_part(launch()))


def test_base64_parts_are_refused_and_quoted_printable_is_decoded():
    def archive(encoding: str, body: str) -> str:
        return ('MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="b"\n\n--b\n'
                f'Content-Type: text/x-shellscript\nContent-Transfer-Encoding: {encoding}\n\n{body}\n--b--\n')

    with pytest.raises(UserDataInvalid, match="Content-Transfer-Encoding base64"):
        merge(archive("base64", "IyEvYmluL2Jhc2gK"), render_part(launch()))
    parts = parse(merge(archive("quoted-printable", "#!/bin/bash\necho a=3Db"), render_part(launch())).user_data)
    assert parts[0].content == "#!/bin/bash\necho a=b"


def test_serialization_is_what_karpenter_writes():
    text = serialize([Part(SHELL_SCRIPT, "#!/bin/bash\necho a"), Part(NODE_CONFIG, "kind: NodeConfig")])
    assert text == (
        'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="//"\n\n'
        '--//\nContent-Type: text/x-shellscript; charset="us-ascii"\n\n#!/bin/bash\necho a\n'
        "--//\nContent-Type: application/node.eks.aws\n\nkind: NodeConfig\n"
        "--//--\n"
    )


def test_karpenter_appending_its_nodeconfig_keeps_every_part():
    merged = merge(USER_ARCHIVE, render_part(launch())).user_data
    rendered = serialize([*parse(merged), Part(NODE_CONFIG, "# Karpenter Generated NodeConfig\n" + NODECONFIG)])
    assert content_types(rendered)[-2:] == [SHELL_SCRIPT, NODE_CONFIG]


def test_a_part_holding_karpenters_boundary_line_is_refused():
    # Fine under the user's own boundary, but Karpenter re-serializes with "//" and would split the part.
    archive = ('MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="b"\n\n--b\n'
               'Content-Type: text/x-shellscript\n\n#!/bin/bash\ncat <<EOF\n--//\nEOF\n--b--\n')
    with pytest.raises(UserDataInvalid, match="boundary"):
        merge(archive, render_part(launch()))


def _user_script_of(size: int) -> str:
    """A user shell part whose serialized archive, with ours, is exactly ``size`` bytes plus the reserve."""
    ours = render_part(launch())
    base = merge("#!/bin/bash\necho pad\n", ours).bytes_used
    return "#!/bin/bash\necho pad\n" + "#" * (size - base)


def test_budget_at_the_limit_fits_and_one_byte_more_is_a_clear_error():
    ours = render_part(launch())
    at_limit = merge(_user_script_of(USER_DATA_LIMIT), ours)
    assert at_limit.bytes_used == USER_DATA_LIMIT and at_limit.budget_left == 0
    with pytest.raises(UserDataTooLarge, match=f"over EC2's {USER_DATA_LIMIT}-byte limit") as e:
        merge(_user_script_of(USER_DATA_LIMIT + 1), ours)
    assert e.value.reason == "UserDataTooLarge"
    assert "16385" in str(e.value) and "Karpenter's NodeConfig" in str(e.value)
