#!/usr/bin/env python3
"""The chart and the kustomize base compared object by object
(e2e/check-chart.sh).

    parity.py objects CHART.yaml OTHER.yaml
        every object of one is in the other (apiVersion, kind, namespace,
        name) with the same content, Helm's own labels aside
        (app.kubernetes.io/instance, managed-by, version, helm.sh/chart)
    parity.py dashboard CHART.yaml DASHBOARD.json
        the chart's dashboard ConfigMap holds the same JSON document

Exit 1 with each difference (its path and both values) when they differ.
"""
import json
import sys

import yaml

HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def key(o):
    m = o.get("metadata", {})
    return (o.get("apiVersion"), o.get("kind"), m.get("namespace", ""), m.get("name"))


def normal(o):
    o = json.loads(json.dumps(o))
    labels = o.get("metadata", {}).get("labels")
    if labels is not None:
        for k in HELM_LABELS:
            labels.pop(k, None)
        if not labels:
            del o["metadata"]["labels"]
    return o


def diff(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{path}.{k}: only in the other: {json.dumps(b[k])[:200]}")
            elif k not in b:
                out.append(f"{path}.{k}: only in the chart: {json.dumps(a[k])[:200]}")
            else:
                diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: chart {json.dumps(a)[:200]} != other {json.dumps(b)[:200]}")


def objects(chart_path, other_path):
    chart = {key(o): normal(o) for o in load(chart_path)}
    other = {key(o): normal(o) for o in load(other_path)}
    problems = []
    for k in sorted(set(chart) | set(other), key=str):
        name = "/".join(str(x) for x in k if x)
        if k not in other:
            problems.append(f"{name}: rendered by the chart, not in the other")
        elif k not in chart:
            problems.append(f"{name}: in the other, not rendered by the chart")
        else:
            d = []
            diff(chart[k], other[k], name, d)
            problems += d
    return len(chart), problems


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    mode = sys.argv[1]
    if mode == "objects":
        n, problems = objects(sys.argv[2], sys.argv[3])
        what = f"{n} object(s)"
    elif mode == "dashboard":
        cms = [o for o in load(sys.argv[2]) if o.get("kind") == "ConfigMap"]
        problems = []
        if len(cms) != 1:
            problems.append(f"expected one dashboard ConfigMap, the chart rendered {len(cms)}")
        else:
            data = cms[0].get("data", {})
            if list(data) != ["vk-sandbox.json"]:
                problems.append(f"dashboard ConfigMap keys {list(data)}")
            else:
                with open(sys.argv[3]) as f:
                    want = json.load(f)
                if json.loads(data["vk-sandbox.json"]) != want:
                    d = []
                    diff(json.loads(data["vk-sandbox.json"]), want, "dashboard", d)
                    problems += d
        what = "the dashboard"
    else:
        sys.exit(__doc__)
    if problems:
        print(f"parity: {len(problems)} difference(s):")
        for p in problems:
            print(f"  {p}")
        sys.exit(1)
    print(f"parity: {what} identical")


if __name__ == "__main__":
    main()
