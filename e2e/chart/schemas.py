#!/usr/bin/env python3
"""JSON schemas for `kubeconform -strict`, written offline (e2e/check-chart.sh).

    schemas.py OUT SWAGGER CRD_DIR...

OUT/native/<kind>-<group>-<version>.json  every kind of Kubernetes' own
    OpenAPI v2 document SWAGGER (api/openapi-spec/swagger.json of the
    k8s.io/kubernetes module the local control plane is built from), in
    kubeconform's file naming ({{ .ResourceKind }}{{ .KindSuffix }}.json).
OUT/crd/<group>/<kind>_<version>.json  every version of every
    CustomResourceDefinition in the YAML files of each CRD_DIR.

Both are "standalone strict": $refs inlined, and every object that lists
its properties refuses others (additionalProperties: false) unless the API
says it keeps unknown fields, so a misspelt or misplaced field fails.
"""
import copy
import glob
import json
import os
import sys

import yaml

INT_OR_STRING = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
QUANTITY = {"oneOf": [{"type": "string"}, {"type": "number"}]}


def subschemas(node):
    """The schemas directly below the schema node (not property names)."""
    for k in ("properties", "patternProperties", "definitions"):
        if isinstance(node.get(k), dict):
            yield from node[k].values()
    for k in ("items", "additionalProperties", "not"):
        if isinstance(node.get(k), dict):
            yield node[k]
    if isinstance(node.get("items"), list):
        yield from node["items"]
    for k in ("allOf", "anyOf", "oneOf"):
        if isinstance(node.get(k), list):
            yield from node[k]


def strict(node):
    """Adds additionalProperties: false below the schema node, in place."""
    if not isinstance(node, dict):
        return
    if node.get("format") == "int-or-string" or node.get("x-kubernetes-int-or-string") is True:
        keep = {k: v for k, v in node.items() if k == "description"}
        node.clear()
        node.update(copy.deepcopy(INT_OR_STRING))
        node.update(keep)
        return
    if (
        isinstance(node.get("properties"), dict)
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        node["additionalProperties"] = False
    for sub in list(subschemas(node)):
        strict(sub)


def nullable(node):
    """Lets Kubernetes' optional fields be null, as the apiserver does."""
    if not isinstance(node, dict):
        return
    t = node.get("type")
    if isinstance(t, str) and t != "null":
        node["type"] = [t, "null"]
    for sub in subschemas(node):
        nullable(sub)


def native(swagger_path, out):
    with open(swagger_path) as f:
        defs = json.load(f)["definitions"]
    special = {
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString": INT_OR_STRING,
        "io.k8s.apimachinery.pkg.api.resource.Quantity": QUANTITY,
    }
    resolved = {}

    def resolve(node, stack):
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                name = ref.rsplit("/", 1)[-1]
                if name in special:
                    return copy.deepcopy(special[name])
                if name in stack:
                    # A recursive type (JSONSchemaProps): accept anything.
                    return {}
                if name not in resolved:
                    resolved[name] = resolve(defs[name], stack | {name})
                return copy.deepcopy(resolved[name])
            return {k: resolve(v, stack) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v, stack) for v in node]
        return node

    n = 0
    os.makedirs(os.path.join(out, "native"), exist_ok=True)
    for name, d in defs.items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            group, version, kind = gvk["group"], gvk["version"], gvk["kind"]
            schema = resolve(d, {name})
            strict(schema)
            nullable(schema)
            api = f"{group}/{version}" if group else version
            for field, value in (("apiVersion", api), ("kind", kind)):
                schema.setdefault("properties", {})[field] = {"type": "string", "enum": [value]}
            suffix = "-" + group.split(".")[0].lower() + "-" + version if group else "-" + version
            path = os.path.join(out, "native", f"{kind.lower()}{suffix}.json")
            with open(path, "w") as f:
                json.dump(schema, f)
            n += 1
    return n


def crds(dirs, out):
    n = 0
    for d in dirs:
        for file in sorted(glob.glob(os.path.join(d, "*.yaml"))):
            with open(file) as f:
                for doc in yaml.safe_load_all(f):
                    if not doc or doc.get("kind") != "CustomResourceDefinition":
                        continue
                    spec = doc["spec"]
                    group, kind = spec["group"], spec["names"]["kind"]
                    for v in spec["versions"]:
                        schema = copy.deepcopy(v.get("schema", {}).get("openAPIV3Schema", {}))
                        strict(schema)
                        props = schema.setdefault("properties", {})
                        props["apiVersion"] = {"type": "string", "enum": [f"{group}/{v['name']}"]}
                        props["kind"] = {"type": "string", "enum": [kind]}
                        # metadata is the apiserver's to check (ObjectMeta).
                        props["metadata"] = {"type": "object"}
                        schema["additionalProperties"] = False
                        folder = os.path.join(out, "crd", group)
                        os.makedirs(folder, exist_ok=True)
                        path = os.path.join(folder, f"{kind.lower()}_{v['name']}.json")
                        with open(path, "w") as f:
                            json.dump(schema, f)
                        n += 1
    return n


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, swagger, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    a = native(swagger, out)
    b = crds(dirs, out)
    print(f"{a} native kinds, {b} CRD versions")


if __name__ == "__main__":
    main()
