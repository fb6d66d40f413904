//! The claims store's metrics: rows by state, read at each scrape
//! (`vk_sandbox_claims{state}`), and each write batch's duration.

use std::sync::Arc;

use super::ClaimsStore;
use crate::error::Result;
use crate::metrics::{Metrics, SampledGauge};

/// Registers the claims gauge over `store` and times its writes.
pub fn instrument(store: &Arc<ClaimsStore>, metrics: &Arc<Metrics>) -> Result<()> {
    let m = Arc::clone(metrics);
    store.on_write(move |elapsed, ok| m.claims_store_wrote(elapsed, ok));
    let store = Arc::clone(store);
    metrics.register_sampled(SampledGauge::new(
        "vk_sandbox_claims",
        "Claims held in the claims store, by state (settled, tentative, quarantined).",
        "state",
        move || {
            let c = store.counts();
            vec![
                ("settled".to_string(), c.settled as i64),
                ("tentative".to_string(), c.tentative as i64),
                ("quarantined".to_string(), c.quarantined as i64),
            ]
        },
    )?)
}
