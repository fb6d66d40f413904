//! The validation's shared pieces: the problem list, a path flag read.

use std::path::PathBuf;

/// Collects problems so one run reports all of them.
#[derive(Default)]
pub(super) struct Problems(pub(super) Vec<String>);

impl Problems {
    pub(super) fn push(
        &mut self,
        flag: &str,
        env: Option<&str>,
        value: &str,
        problem: &str,
        fix: &str,
    ) {
        let name = match env {
            Some(env) => format!("--{flag} (env {env})"),
            None => format!("--{flag}"),
        };
        self.0.push(format!("{name}={value:?}: {problem}; {fix}"));
    }
}

pub(super) fn non_empty_path(s: &str) -> Option<PathBuf> {
    (!s.is_empty()).then(|| PathBuf::from(s))
}
