"""Rendered documents as multi-document YAML: what `nodewarm render` prints and the Helm chart is written from."""

from __future__ import annotations

import yaml


class _PlainDumper(yaml.SafeDumper):
    """No anchors and aliases: documents that share a dict (a label map used twice) would otherwise print as
    &id001 / *id001, which kubectl reads but tools that diff or patch manifests (and people) do not."""

    def ignore_aliases(self, data) -> bool:
        return True


def dump_all(docs: list[dict]) -> str:
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)
