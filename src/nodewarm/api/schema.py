"""The WarmProfile JSON Schema and its two views.

One file (``warmprofile.schema.json`` beside this module) is the source of truth. The CLI validates against a
*strict* view (every object with ``properties`` rejects unknown fields, like ``kubectl --validate=strict``)
and the WarmProfile CRD embeds the file as its openAPIV3Schema, where the API server prunes unknown
fields instead. Keeping both derived from one file means they cannot drift apart.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from importlib import resources

GROUP = "nodewarm.io"
VERSION = "v1alpha1"
KIND = "WarmProfile"
PLURAL = "warmprofiles"


@lru_cache(maxsize=1)
def profile_schema() -> dict:
    return json.loads(resources.files(__package__).joinpath("warmprofile.schema.json").read_text())


def _strict(node):
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if out.get("type") == "object" and "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@lru_cache(maxsize=1)
def strict_schema() -> dict:
    """The CLI view: unknown fields are errors (a typo must not silently fall back to a default)."""
    return _strict(profile_schema())


def _crd_schema(node):
    """The same schema in the OpenAPI v3.0 dialect a CRD speaks.

    Drops the JSON-Schema-only keys and rewrites numeric ``exclusiveMinimum: X`` (JSON Schema 2020-12)
    as ``minimum: X, exclusiveMinimum: true`` (OpenAPI 3.0, where the keyword is a boolean flag).
    """
    if isinstance(node, dict):
        out = {k: _crd_schema(v) for k, v in node.items() if k not in ("$comment", "$schema")}
        for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(out.get(bound), (int, float)) and not isinstance(out.get(bound), bool):
                out[flag], out[bound] = out[bound], True
        return out
    if isinstance(node, list):
        return [_crd_schema(v) for v in node]
    return node


def crd() -> dict:
    """The WarmProfile CustomResourceDefinition (apiextensions.k8s.io/v1), cluster-scoped."""
    schema = _crd_schema(copy.deepcopy(profile_schema()))
    schema["properties"]["status"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    # The API server owns metadata; a CRD schema may not constrain it beyond name/generateName.
    schema["properties"]["metadata"] = {"type": "object"}
    schema.pop("required", None)
    schema["required"] = ["spec"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"kind": KIND, "plural": PLURAL, "singular": "warmprofile", "listKind": "WarmProfileList",
                      "shortNames": ["wp"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Mode", "type": "string", "jsonPath": ".spec.nodes.mode"},
                    {"name": "NodePool", "type": "string", "jsonPath": ".spec.nodes.nodePool"},
                    {"name": "Model", "type": "string", "jsonPath": ".spec.model.uri"},
                ],
            }],
        },
    }
