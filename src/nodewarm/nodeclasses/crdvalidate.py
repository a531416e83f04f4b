"""Strict validation of rendered manifests against the CRDs' openAPIV3Schemas.

The API server we test against (v1.20) prunes unknown fields silently and ignores CEL, so "the server
accepted it" does not prove a manifest is right. This converts a CRD's structural schema to JSON Schema
and checks like ``kubectl --validate=strict``: unknown fields are errors unless the schema says
``x-kubernetes-preserve-unknown-fields``. CEL rules (x-kubernetes-validations) are NOT checked. A document
no loaded CRD describes fails, unless its API group is one the API server serves itself.
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


def load_docs(docs: list[dict]) -> dict[tuple[str, str], CrdSchema]:
    """(apiVersion, kind) -> schema, for every CustomResourceDefinition among ``docs``, plus nodewarm's own
    WarmProfile CRD (render emits WarmProfile documents; fail-closed validation must know their schema)."""
    from nodewarm.api.schema import crd as warmprofile_crd

    out = {}
    for doc in [warmprofile_crd(), *docs]:
        if doc and doc.get("kind") == "CustomResourceDefinition":
            c = load_crd(doc)
            out[(c.api_version, c.kind)] = c
    return out


def load_dir(paths: list[Path]) -> dict[tuple[str, str], CrdSchema]:
    """``load_docs`` of every document in the given CRD files."""
    return load_docs([d for p in paths for d in yaml.safe_load_all(Path(p).read_text())])


def builtin() -> dict[tuple[str, str], CrdSchema]:
    """Karpenter's CRDs as nodewarm generates them from Karpenter's Go types (karpenter.crds), and WarmProfile's."""
    from nodewarm.karpenter.crds import crds

    return load_docs(crds())


# API groups the API server itself serves (core is ""): no CRD describes them, the server validates them.
BUILTIN_GROUPS = frozenset({
    "", "admissionregistration.k8s.io", "apiextensions.k8s.io", "apps", "autoscaling", "batch",
    "certificates.k8s.io", "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io", "networking.k8s.io",
    "node.k8s.io", "policy", "rbac.authorization.k8s.io", "scheduling.k8s.io", "storage.k8s.io",
})


def _group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def validate(docs: list[dict], crds: dict[tuple[str, str], CrdSchema]) -> dict[str, list[str]]:
    """Errors per ``Kind/name``. Fails closed: a document of a non-built-in API group that no loaded CRD
    describes (a typo'd or old apiVersion, a kind from a CRD file that was not passed) is an error, not
    a silent pass; built-in kinds (Deployment, Role, ...) are the API server's to validate."""
    report = {}
    for d in docs:
        api_version, kind = d.get("apiVersion") or "", d.get("kind") or ""
        name = f"{kind or '<no kind>'}/{(d.get('metadata') or {}).get('name')}"
        if not api_version or not kind:
            report[name] = [".apiVersion/.kind: both are required to know which schema applies"]
            continue
        c = crds.get((api_version, kind))
        if c is None:
            if _group(api_version) in BUILTIN_GROUPS:
                continue
            same_group = sorted(f"{v} {k}" for v, k in crds if _group(v) == _group(api_version))
            hint = (f"the loaded CRDs of {_group(api_version)} serve: {', '.join(same_group)}" if same_group
                    else f"no loaded CRD has group {_group(api_version)}; pass its CRD file")
            report[name] = [f".apiVersion/.kind: no CRD schema for {api_version} {kind} ({hint})"]
            continue
        errs = c.errors(d)
        if errs:
            report[name] = errs
    return report
