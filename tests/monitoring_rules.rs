//! The alerts of manifests/monitoring/prometheusrule.yaml, proven with
//! `promtool test rules` (manifests/monitoring/prometheusrule.test.yaml):
//! every alert has a case where it fires and one where it is silent, every
//! case passes, and the cases notice an alert that no longer waits for its
//! `for:`. promtool reads plain rule files, so the PrometheusRule's `spec`
//! is written to one beside a copy of the test file.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/monitoring")
}

fn read_yaml(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

/// The PrometheusRule's `spec`: a plain rule file.
fn rule_spec() -> Value {
    read_yaml(&monitoring().join("prometheusrule.yaml"))["spec"].clone()
}

fn alerts(spec: &Value) -> Vec<&Value> {
    spec["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// Run the test file against `spec`; promtool's exit status and output.
fn promtool_test(spec: &Value) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("vk-sandbox.rules.yaml"),
        serde_saphyr::to_string(spec).expect("yaml"),
    )
    .expect("write rules");
    let tests = dir.path().join("prometheusrule.test.yaml");
    std::fs::copy(monitoring().join("prometheusrule.test.yaml"), &tests).expect("copy tests");
    let tests = tests.to_str().expect("a UTF-8 temporary path");
    support::prometheus::promtool(&["test", "rules", tests], "")
}

#[test]
fn every_alert_fires_in_its_situation_and_only_then() {
    let spec = rule_spec();
    let (ok, output) = promtool_test(&spec);
    assert!(ok, "promtool test rules failed:\n{output}");

    // alertname -> (eval times with the alert firing, eval times silent).
    let tests = read_yaml(&monitoring().join("prometheusrule.test.yaml"));
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for test in tests["tests"].as_array().expect("tests") {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_string();
            let firing = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            let entry = cases.entry(name).or_default();
            if firing {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }
    let names: BTreeSet<String> = alerts(&spec)
        .iter()
        .map(|r| r["alert"].as_str().expect("alert name").to_string())
        .collect();
    assert!(names.len() >= 15, "only {} alerts", names.len());
    for name in &names {
        let (firing, silent) = cases.get(name).copied().unwrap_or_default();
        assert!(
            firing > 0,
            "{name}: no case in prometheusrule.test.yaml where it fires"
        );
        assert!(
            silent > 0,
            "{name}: no case in prometheusrule.test.yaml where it stays silent"
        );
    }
    for name in cases.keys() {
        assert!(
            names.contains(name),
            "prometheusrule.test.yaml tests {name}, which prometheusrule.yaml does not define"
        );
    }
}

/// An alert with its `for:` removed fires early: its cases must notice.
#[test]
fn the_cases_notice_an_alert_that_does_not_wait_for_its_for() {
    let spec = rule_spec();
    let with_for: Vec<String> = alerts(&spec)
        .iter()
        .filter(|r| r.get("for").is_some())
        .map(|r| r["alert"].as_str().expect("alert").to_string())
        .collect();
    assert!(with_for.len() >= 10, "{with_for:?}");
    for name in with_for {
        let mut mutated = spec.clone();
        for group in mutated["groups"].as_array_mut().expect("groups") {
            for rule in group["rules"].as_array_mut().expect("rules") {
                if rule["alert"].as_str() == Some(name.as_str()) {
                    rule.as_object_mut().expect("rule").remove("for");
                }
            }
        }
        let (ok, _) = promtool_test(&mutated);
        assert!(
            !ok,
            "{name} without its `for:` still passes prometheusrule.test.yaml: add a case \
             showing it silent before the `for:` has passed"
        );
    }
}
