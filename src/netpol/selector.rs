//! Label selectors (`metav1.LabelSelector`) as Kubernetes evaluates them,
//! compiled once per policy version (pure). A selector the apiserver would
//! reject (an unknown operator, `In` without values, `Exists` with values)
//! compiles to an error, which the caller turns into "matches nothing".

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Labels of a Pod or a namespace.
pub type Labels = BTreeMap<String, String>;

/// One requirement; all of a selector's must hold.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Requirement {
    /// `matchLabels` entries and `In`: the key is present with one of the
    /// values.
    In(String, Vec<String>),
    /// The key is absent, or its value is none of these.
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A compiled, valid selector. No requirement: every object matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// The selector of `s`, or why the apiserver would have refused it.
    pub fn compile(s: &LabelSelector) -> Result<Selector, String> {
        let mut requirements: Vec<Requirement> = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::In(k.clone(), vec![v.clone()]))
            .collect();
        for e in s.match_expressions.iter().flatten() {
            let mut values = e.values.clone().unwrap_or_default();
            values.sort();
            values.dedup();
            let key = e.key.clone();
            let r = match (e.operator.as_str(), values.is_empty()) {
                ("In", false) => Requirement::In(key, values),
                ("NotIn", false) => Requirement::NotIn(key, values),
                ("Exists", true) => Requirement::Exists(key),
                ("DoesNotExist", true) => Requirement::DoesNotExist(key),
                ("In" | "NotIn", true) => {
                    return Err(format!("{} {key:?} without values", e.operator));
                }
                ("Exists" | "DoesNotExist", false) => {
                    return Err(format!("{} {key:?} with values", e.operator));
                }
                (op, _) => return Err(format!("unknown operator {op:?} on {key:?}")),
            };
            requirements.push(r);
        }
        // One order, so equal selectors written differently are one watch.
        requirements.sort();
        requirements.dedup();
        Ok(Selector { requirements })
    }

    /// Selects every object.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

/// The selector in the apiserver's `labelSelector` query syntax (empty for
/// "everything"), for a watch that selects the same objects.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::In(k, vs) if vs.len() == 1 => write!(f, "{k}={}", vs[0])?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::DoesNotExist(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.map(|vs| vs.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn selector(ml: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> Selector {
        Selector::compile(&LabelSelector {
            match_labels: (!ml.is_empty()).then(|| labels(ml)),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        })
        .expect("valid selector")
    }

    #[test]
    fn an_empty_selector_matches_everything() {
        let s = selector(&[], vec![]);
        assert!(s.is_empty());
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("a", "b")])));
        assert_eq!(s.to_string(), "");
        let explicit_empty = Selector::compile(&LabelSelector {
            match_labels: Some(BTreeMap::new()),
            match_expressions: Some(vec![]),
        })
        .unwrap();
        assert!(explicit_empty.is_empty());
    }

    #[test]
    fn match_labels_need_every_pair() {
        let s = selector(&[("app", "web"), ("tier", "front")], vec![]);
        assert!(!s.is_empty());
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "front"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "back")])));
    }

    #[test]
    fn an_empty_value_is_not_an_absent_key() {
        let s = selector(&[("app", "")], vec![]);
        assert!(s.matches(&labels(&[("app", "")])));
        assert!(!s.matches(&labels(&[])));
    }

    #[test]
    fn in_needs_the_key_with_one_of_the_values() {
        let s = selector(&[], vec![expr("env", "In", Some(&["a", "b"]))]);
        assert!(s.matches(&labels(&[("env", "a")])));
        assert!(s.matches(&labels(&[("env", "b")])));
        assert!(!s.matches(&labels(&[("env", "c")])));
        assert!(!s.matches(&labels(&[])));
    }

    #[test]
    fn not_in_matches_an_absent_key() {
        let s = selector(&[], vec![expr("env", "NotIn", Some(&["a", "b"]))]);
        assert!(!s.matches(&labels(&[("env", "a")])));
        assert!(!s.matches(&labels(&[("env", "b")])));
        assert!(s.matches(&labels(&[("env", "c")])));
        assert!(s.matches(&labels(&[])));
    }

    #[test]
    fn exists_and_does_not_exist_look_at_the_key_only() {
        let e = selector(&[], vec![expr("k", "Exists", None)]);
        let d = selector(&[], vec![expr("k", "DoesNotExist", Some(&[]))]);
        for (l, present) in [(labels(&[("k", "")]), true), (labels(&[("j", "v")]), false)] {
            assert_eq!(e.matches(&l), present);
            assert_eq!(d.matches(&l), !present);
        }
    }

    #[test]
    fn labels_and_expressions_are_anded() {
        let s = selector(&[("app", "web")], vec![expr("env", "In", Some(&["prod"]))]);
        assert!(s.matches(&labels(&[("app", "web"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "dev")])));
        assert!(!s.matches(&labels(&[("app", "api"), ("env", "prod")])));
    }

    #[test]
    fn invalid_selectors_are_refused_with_the_reason() {
        for (e, why) in [
            (expr("k", "In", None), "In \"k\" without values"),
            (expr("k", "NotIn", Some(&[])), "NotIn \"k\" without values"),
            (
                expr("k", "Exists", Some(&["v"])),
                "Exists \"k\" with values",
            ),
            (
                expr("k", "DoesNotExist", Some(&["v"])),
                "DoesNotExist \"k\" with values",
            ),
            (
                expr("k", "Equals", Some(&["v"])),
                "unknown operator \"Equals\" on \"k\"",
            ),
            (
                expr("k", "in", Some(&["v"])),
                "unknown operator \"in\" on \"k\"",
            ),
        ] {
            let s = LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![e]),
            };
            assert_eq!(Selector::compile(&s), Err(why.to_string()));
        }
    }

    #[test]
    fn the_query_form_names_every_requirement_in_one_order() {
        let s = selector(
            &[("b", "2"), ("a", "1")],
            vec![
                expr("n", "NotIn", Some(&["x", "y"])),
                expr("i", "In", Some(&["p", "q"])),
                expr("e", "Exists", None),
                expr("d", "DoesNotExist", None),
            ],
        );
        assert_eq!(
            s.to_string(),
            "a=1,b=2,i in (p,q),n notin (x,y),e,!d",
            "In before NotIn before Exists before DoesNotExist, each by key"
        );
        let same = selector(
            &[],
            vec![
                expr("d", "DoesNotExist", None),
                expr("e", "Exists", None),
                expr("i", "In", Some(&["p", "q"])),
                expr("n", "NotIn", Some(&["x", "y"])),
                expr("a", "In", Some(&["1"])),
                expr("b", "In", Some(&["2"])),
                expr("b", "In", Some(&["2"])),
            ],
        );
        assert_eq!(same, s, "matchLabels are In requirements; duplicates go");
    }
}
