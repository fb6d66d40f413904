//! `GET /metrics` (root token): sandboxd's Prometheus text, with the gauges
//! and counters of its contract that the simulator can know. Gauges are
//! read from the state at scrape time; counters count what the simulator
//! did since it started (a simulated restart keeps them, as they describe
//! the process).
//!
//! The contract names the families and the `tier` label of
//! `sandboxd_claims_total`, not the label's values: the simulator writes
//! `warm` (a warm VM handed over), `golden` (a warm miss cloned from the
//! pool's golden snapshot) and `cold` (a warm miss booted without one).
//! Forks, checkpoints and promotes are not simulated: their counters stay
//! 0. `sandboxd_config_digest_mismatch` (a mesh's) is left out.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Reply, Sim};
use crate::sim::Body;

/// The content type of Prometheus' text format, as the contract gives it.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// How a claim got its VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    Warm,
    Golden,
    Cold,
}

/// What the simulator did since it started.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    claims_warm: AtomicU64,
    claims_golden: AtomicU64,
    claims_cold: AtomicU64,
    claim_nanos: AtomicU64,
    wakes: AtomicU64,
    wake_nanos: AtomicU64,
    hibernates: AtomicU64,
    releases: AtomicU64,
    reaps: AtomicU64,
    archives: AtomicU64,
    unarchives: AtomicU64,
    archive_deletes: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    /// A claim granted, how long it took.
    pub(crate) fn claimed(&self, tier: Tier, took: Duration) {
        bump(match tier {
            Tier::Warm => &self.claims_warm,
            Tier::Golden => &self.claims_golden,
            Tier::Cold => &self.claims_cold,
        });
        self.claim_nanos.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// A paused (or archived, or failed) VM running again.
    pub(crate) fn woken(&self, took: Duration, from_archive: bool) {
        bump(&self.wakes);
        if from_archive {
            bump(&self.unarchives);
        }
        self.wake_nanos.fetch_add(nanos(took), Ordering::Relaxed);
    }

    pub(crate) fn hibernated(&self, n: usize) {
        self.hibernates.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn released(&self) {
        bump(&self.releases);
    }

    /// The reaper destroyed a claim at its deadline: an archived one at the
    /// end of its retention, or a live one.
    pub(crate) fn reaped(&self, was_archived: bool) {
        bump(if was_archived {
            &self.archive_deletes
        } else {
            &self.reaps
        });
    }

    pub(crate) fn archived(&self, n: usize) {
        self.archives.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// One metric family being written.
struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP sandboxd_{name} {help}");
        let _ = writeln!(self.0, "# TYPE sandboxd_{name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let _ = write!(self.0, "sandboxd_{name}");
        if !labels.is_empty() {
            let pairs: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = write!(self.0, "{{{}}}", pairs.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// A label value as the text format writes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn seconds(c: &AtomicU64) -> f64 {
    Duration::from_nanos(load(c)).as_secs_f64()
}

impl Sim {
    /// `GET /metrics`: root only (a tenant 403, no or a wrong token 401;
    /// open mode serves anyone).
    pub fn metrics(&self, auth: Option<&str>) -> Reply {
        let st = self.lock();
        if let Err(reply) = Self::auth_root(&st, auth) {
            return reply;
        }
        let count = |f: &dyn Fn(&crate::model::ClaimRecord) -> bool| {
            st.claims.values().filter(|c| f(c)).count()
        };
        let mut t = Text(String::new());
        t.one("claimed", "gauge", "Live claims.", st.claims.len());
        t.one(
            "hibernated",
            "gauge",
            "Claims whose VM is hibernated.",
            count(&|c| c.hibernated),
        );
        t.one(
            "archived",
            "gauge",
            "Claims archived to the checkpoint store.",
            count(&|c| c.archived),
        );
        t.one(
            "failed",
            "gauge",
            "Claims whose VM is down.",
            count(&|c| c.failed.is_some()),
        );
        t.one(
            "draining",
            "gauge",
            "1 while the node is draining.",
            u8::from(st.cfg.draining),
        );
        let mut tenants: BTreeMap<&str, usize> = st
            .cfg
            .tenants
            .iter()
            .map(|t| (t.name.as_str(), 0))
            .collect();
        for c in st.claims.values() {
            if let Some(name) = &c.tenant {
                *tenants.entry(name.as_str()).or_default() += 1;
            }
        }
        t.family("tenant_claims", "gauge", "Live claims per tenant.");
        for (tenant, n) in &tenants {
            t.sample("tenant_claims", &[("tenant", tenant)], n);
        }
        t.family("pool_warm", "gauge", "Warm VMs per pool.");
        for (k, p) in &st.pools {
            let labels = [
                ("template", k.template.as_str()),
                ("net", k.net.as_str()),
                ("size", k.size.as_str()),
            ];
            t.sample("pool_warm", &labels, p.warm);
        }
        t.family("pool_target", "gauge", "Warm VMs each pool refills to.");
        for (k, p) in &st.pools {
            let labels = [
                ("template", k.template.as_str()),
                ("net", k.net.as_str()),
                ("size", k.size.as_str()),
            ];
            t.sample("pool_target", &labels, p.target);
        }
        drop(st);
        let c = &self.counters;
        t.family(
            "claims_total",
            "counter",
            "Claims granted, by how the VM was had.",
        );
        for (tier, n) in [
            ("cold", &c.claims_cold),
            ("golden", &c.claims_golden),
            ("warm", &c.claims_warm),
        ] {
            t.sample("claims_total", &[("tier", tier)], load(n));
        }
        let counters: [(&str, &str, String); 12] = [
            (
                "claim_seconds_total",
                "Time spent granting claims.",
                seconds(&c.claim_nanos).to_string(),
            ),
            (
                "wake_seconds_total",
                "Time spent waking VMs.",
                seconds(&c.wake_nanos).to_string(),
            ),
            ("wakes_total", "VMs woken.", load(&c.wakes).to_string()),
            (
                "hibernates_total",
                "VMs hibernated.",
                load(&c.hibernates).to_string(),
            ),
            ("forks_total", "Forks (not simulated).", "0".into()),
            (
                "checkpoints_total",
                "Checkpoints (not simulated).",
                "0".into(),
            ),
            ("promotes_total", "Promotes (not simulated).", "0".into()),
            (
                "releases_total",
                "Claims released.",
                load(&c.releases).to_string(),
            ),
            (
                "reaps_total",
                "Claims destroyed at their deadline.",
                load(&c.reaps).to_string(),
            ),
            (
                "archives_total",
                "Claims archived.",
                load(&c.archives).to_string(),
            ),
            (
                "unarchives_total",
                "Claims woken from the archive.",
                load(&c.unarchives).to_string(),
            ),
            (
                "archive_deletes_total",
                "Archived claims deleted at the end of their retention.",
                load(&c.archive_deletes).to_string(),
            ),
        ];
        for (name, help, value) in &counters {
            t.one(name, "counter", help, value);
        }
        Reply {
            status: 200,
            body: Body::Raw {
                content_type: CONTENT_TYPE.to_string(),
                bytes: t.0.into_bytes(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
        let mut t = Text(String::new());
        t.sample(
            "pool_warm",
            &[("template", "base:24.04"), ("net", "none")],
            3,
        );
        assert_eq!(
            t.0,
            "sandboxd_pool_warm{template=\"base:24.04\",net=\"none\"} 3\n"
        );
    }
}
