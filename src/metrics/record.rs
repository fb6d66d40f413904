//! Every metric is recorded through a method here, so label names and
//! values live in one place; the components say what happened.

use std::time::Duration;

use super::{Controller, Metrics, Timer};
use crate::error::Result;
use crate::sandboxd::{Observer, Op, SandboxdError};

fn result_label(ok: bool) -> &'static str {
    if ok { "success" } else { "error" }
}

impl Metrics {
    /// Record one Lease renewal outcome (and its time when it succeeded).
    pub fn lease_renewed(&self, ok: bool) {
        self.lease_renewals
            .with_label_values(&[result_label(ok)])
            .inc();
        if ok {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            self.lease_last_success.set(now);
        }
    }

    /// Record one reconcile of `controller` that is not run by a
    /// kube-runtime `Controller` (node status, inventory).
    pub fn reconciled<T>(&self, controller: Controller, elapsed: Duration, result: &Result<T>) {
        let controller = controller.label();
        self.reconcile_runs.with_label_values(&[controller]).inc();
        self.reconcile_duration
            .with_label_values(&[controller])
            .observe(elapsed.as_secs_f64());
        if let Err(e) = result {
            self.reconcile_failures
                .with_label_values(&[controller, e.metric_label()])
                .inc();
        }
    }

    /// A reconcile of `controller` run by a kube-runtime Controller
    /// starts; the returned timer records its duration when dropped.
    pub fn reconcile_started(&self, controller: Controller) -> Timer {
        let controller = controller.label();
        self.reconcile_runs.with_label_values(&[controller]).inc();
        self.reconcile_duration
            .with_label_values(&[controller])
            .start_timer()
    }

    /// A reconcile of `controller` failed with an error of kind `kind`
    /// (`Error::metric_label`).
    pub fn reconcile_failed(&self, controller: Controller, kind: &str) {
        let controller = controller.label();
        self.reconcile_failures
            .with_label_values(&[controller, kind])
            .inc();
    }

    /// A claim or adoption reached the moment its Running write is sent
    /// (`sent`) and answered (`done`), both from the reconcile's start.
    pub fn claim_written(&self, sent: Duration, done: Duration) {
        self.claim_provider.observe(sent.as_secs_f64());
        self.claim_duration.observe(done.as_secs_f64());
    }

    /// A fresh claim's own share: its path to the Running write sent,
    /// less the sandboxd call and the commit.
    pub fn claim_own(&self, own: Duration) {
        self.claim_own.observe(own.as_secs_f64());
    }

    /// A resume's own share: its path to the Running write sent, less the
    /// sandboxd wake call and the commit.
    pub fn resume_own(&self, own: Duration) {
        self.resume_own.observe(own.as_secs_f64());
    }

    /// One `pods/status` write sent, by result (`written`, `conflict`,
    /// `gone`, `error`).
    /// One `pods/status` write sent and answered after `took`.
    pub fn pod_status_write(&self, result: &str, took: Duration) {
        self.pod_status_writes.with_label_values(&[result]).inc();
        self.pod_status_write_duration
            .with_label_values(&[result])
            .observe(took.as_secs_f64());
    }

    /// One kubelet API request answered, by route template and status.
    pub fn kubelet_request(&self, route: &str, code: &str) {
        self.kubelet_requests
            .with_label_values(&[route, code])
            .inc();
    }

    /// One kubelet API request refused, by reason.
    pub fn kubelet_refused(&self, reason: &str) {
        self.kubelet_auth_failures
            .with_label_values(&[reason])
            .inc();
    }

    /// One reload of the serving certificate.
    pub fn cert_reloaded(&self, ok: bool) {
        self.kubelet_cert_reloads
            .with_label_values(&[result_label(ok)])
            .inc();
    }

    /// One NodeInventory apply.
    pub fn inventory_applied(&self, ok: bool) {
        self.inventory_applies
            .with_label_values(&[result_label(ok)])
            .inc();
    }

    /// An inventory tick that applied nothing, by reason (`unchanged`,
    /// `list_failed`, `info_failed`).
    pub fn inventory_skipped(&self, reason: &str) {
        self.inventory_skips.with_label_values(&[reason]).inc();
    }

    /// Whether a NodeInventory of this node is left over in `group` (one
    /// vk-sandbox does not publish in).
    pub fn inventory_stale(&self, group: &str, stale: bool) {
        self.inventory_stale
            .with_label_values(&[group])
            .set(i64::from(stale));
    }

    /// The sandboxd taints as last written to the Node: `(key, present)`.
    pub fn node_sandboxd_taints(&self, taints: &[(&str, bool)]) {
        for (key, present) in taints {
            self.node_sandboxd_taint
                .with_label_values(&[*key])
                .set(i64::from(*present));
        }
    }

    /// One claims-store batch written (write and fsync), by outcome.
    pub fn claims_store_wrote(&self, elapsed: Duration, ok: bool) {
        self.claims_store_write_duration
            .with_label_values(&[result_label(ok)])
            .observe(elapsed.as_secs_f64());
    }

    /// An orphan audit cycle skipped: sandboxd could not be listed.
    pub fn orphan_scan_skipped(&self) {
        self.orphan_scans.with_label_values(&["skipped"]).inc();
    }

    /// An orphan audit cycle done: sandboxes per verdict label.
    pub fn orphan_scanned<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        self.orphan_scans.with_label_values(&["success"]).inc();
        for (verdict, n) in counts {
            self.orphan_audit.with_label_values(&[verdict]).set(n);
        }
    }
}

/// The `status` label of one sandboxd call.
fn sandboxd_status(outcome: Result<(), &SandboxdError>) -> String {
    match outcome {
        Ok(()) => "ok".to_string(),
        Err(SandboxdError::Http { status, .. } | SandboxdError::Refused { status, .. }) => {
            status.to_string()
        }
        Err(SandboxdError::CapacityMiss { .. }) => "capacity_miss".to_string(),
        Err(SandboxdError::Transport { timeout: true, .. }) => "timeout".to_string(),
        Err(SandboxdError::Transport { .. }) => "transport".to_string(),
        Err(SandboxdError::Decode { .. }) => "decode".to_string(),
        Err(e) => e.metric_label().trim_start_matches("sandboxd_").to_string(),
    }
}

impl Observer for Metrics {
    fn observe(&self, op: Op, elapsed: Duration, outcome: Result<(), &SandboxdError>) {
        let status = sandboxd_status(outcome);
        self.sandboxd_requests
            .with_label_values(&[op.as_str(), status.as_str()])
            .inc();
        self.sandboxd_request_duration
            .with_label_values(&[op.as_str()])
            .observe(elapsed.as_secs_f64());
    }
}

impl Metrics {
    /// One sandboxd lease renewal of a claim, by result.
    pub fn claim_renewed(&self, result: &str) {
        self.claim_renewals.with_label_values(&[result]).inc();
    }

    /// One hibernate or wake of a claim's VM, by result.
    pub fn claim_transition(&self, action: &str, result: &str) {
        self.claim_transitions
            .with_label_values(&[action, result])
            .inc();
    }

    /// One Pod handed back (`deleted` or `failed`).
    pub fn pod_handed_back(&self, how: &str) {
        self.pods_handed_back.with_label_values(&[how]).inc();
    }

    /// One claim's record corrected to the state sandboxd lists.
    pub fn claim_observed(&self, state: &str) {
        self.claim_observed.with_label_values(&[state]).inc();
    }

    /// The time left on the nearest lease vk-sandbox renews.
    pub fn claim_lease_remaining_min(&self, seconds: f64) {
        self.claim_lease_remaining_min.set(seconds);
    }
}
