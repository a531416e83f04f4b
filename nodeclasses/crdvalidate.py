"""Strict validation of rendered manifests against the CRDs' openAPIV3Schemas.

The API server we test against (v1.20) prunes unknown fields silently and ignores CEL, so "the server
accepted it" does not prove a manifest is right. This converts a CRD's structural schema to JSON Schema
and checks like ``kubectl --validate=strict``: unknown fields are errors unless the schema says
``x-kubernetes-preserve-unknown-fields``. CEL rules (x-kubernetes-validations) are NOT checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml


def _convert(node: dict) -> dict:
    """One openAPIV3Schema node (OpenAPI 3.0 dialect) -> JSON Schema draft 7."""
    out: dict = {}
    for k, v in node.items():
        if k in ("properties", "patternProperties"):
            out[k] = {name: _convert(sub) for name, sub in v.items()}
        elif k == "items":
            out[k] = _convert(v) if isinstance(v, dict) else [_convert(i) for i in v]
        elif k == "additionalProperties":
            out[k] = _convert(v) if isinstance(v, dict) else v
        elif k in ("allOf", "anyOf", "oneOf"):
            out[k] = [_convert(i) for i in v]
        elif k == "not":
            out[k] = _convert(v)
        elif k.startswith("x-kubernetes-") or k in ("nullable", "description", "default", "example", "format"):
            continue
        else:
            out[k] = v
    # OpenAPI 3.0 boolean exclusive bounds -> draft 7 numeric ones.
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if out.get(flag) is True and bound in out:
            out[flag] = out.pop(bound)
        elif out.get(flag) is False:
            out.pop(flag)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = out.get("anyOf", []) + [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else out["type"] + ["null"]
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@dataclass(frozen=True)
class CrdSchema:
    group: str
    kind: str
    version: str
    schema: dict

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def errors(self, doc: dict) -> list[str]:
        v = jsonschema.Draft7Validator(self.schema)
        msgs = []
        for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
            path = "." + ".".join(str(p) for p in e.absolute_path) if e.absolute_path else "(root)"
            msgs.append(f"{path}: {e.message}")
        if not (doc.get("metadata") or {}).get("name"):
            msgs.append(".metadata.name: required")
        return msgs


def load_crd(doc: dict, version: str | None = None) -> CrdSchema:
    spec = doc["spec"]
    versions = spec["versions"]
    chosen = next((v for v in versions if v["name"] == version), None) if version else \
        next((v for v in versions if v.get("storage")), versions[0])
    if chosen is None:
        raise ValueError(f"CRD {doc['metadata']['name']} has no version {version!r}")
    schema = _convert(chosen["schema"]["openAPIV3Schema"])
    # The API server owns metadata beyond these; don't let the strict mode reject them.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return CrdSchema(spec["group"], spec["names"]["kind"], chosen["name"], schema)


def load_dir(paths: list[Path]) -> dict[tuple[str, str], CrdSchema]:
    """(apiVersion, kind) -> schema, for every CRD in the given files."""
    out = {}
    for p in paths:
        for doc in yaml.safe_load_all(Path(p).read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                c = load_crd(doc)
                out[(c.api_version, c.kind)] = c
    return out


def validate(docs: list[dict], crds: dict[tuple[str, str], CrdSchema]) -> dict[str, list[str]]:
    """Errors per ``Kind/name`` for every document whose (apiVersion, kind) has a CRD; others are skipped."""
    report = {}
    for d in docs:
        c = crds.get((d.get("apiVersion"), d.get("kind")))
        if c is None:
            continue
        errs = c.errors(d)
        if errs:
            report[f"{d['kind']}/{(d.get('metadata') or {}).get('name')}"] = errs
    return report
