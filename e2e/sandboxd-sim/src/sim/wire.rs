//! The JSON shapes several replies share (a claim's row, its deadline, the
//! owner address), with the configured quirks.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::Sim;
use crate::config::{DeadlineQuirk, OwnerAddrMode, Quirks, SimConfig};
use crate::model::{ClaimRecord, ZERO_TIME, format_deadline};

impl Sim {
    pub(super) fn owner_addr(cfg: &SimConfig) -> Option<String> {
        match cfg.owner_addr_mode {
            OwnerAddrMode::HostPort => Some(cfg.advertise_addr.clone()),
            OwnerAddrMode::HostLess => {
                let port = cfg
                    .advertise_addr
                    .rsplit_once(':')
                    .map_or("7777", |(_, p)| p);
                Some(format!(":{port}"))
            }
            OwnerAddrMode::Omit => None,
            OwnerAddrMode::Origin => Some(cfg.origin.clone()),
        }
    }

    /// The wire deadline. `in_list`: rows always carry one (zero time for
    /// "never"); a claim reply leaves a "never" deadline out.
    pub(super) fn deadline_json(
        q: &Quirks,
        deadline: Option<Timestamp>,
        in_list: bool,
    ) -> Option<Value> {
        match q.deadline {
            DeadlineQuirk::Missing => None,
            DeadlineQuirk::Zero => Some(Value::from(ZERO_TIME)),
            DeadlineQuirk::Unparseable => Some(Value::from("not-a-time")),
            DeadlineQuirk::Normal => match deadline {
                Some(ts) => Some(Value::from(format_deadline(ts, q.deadline_offset_minutes))),
                None if in_list => Some(Value::from(ZERO_TIME)),
                None => None,
            },
        }
    }

    /// A claim as a row of the list (and of `GET /v1/sandboxes/{id}`).
    pub(super) fn row_json(q: &Quirks, c: &ClaimRecord) -> Value {
        let mut v = json!({
            "id": c.id,
            "key": c.key.to_json(q.engine_in_key),
            "hibernated": c.hibernated,
        });
        if let Some(d) = Self::deadline_json(q, c.deadline, true) {
            v["deadline"] = d;
        }
        if c.archived {
            v["archived"] = Value::from(true);
        }
        if !c.claim_ref.is_empty() {
            v["claim_ref"] = Value::from(c.claim_ref.clone());
        }
        if let Some(reason) = &c.failed {
            v["failed"] = Value::from(reason.clone());
        }
        if !c.volumes.is_empty() {
            v["volumes"] = json!(c.volumes);
        }
        if !c.on_expire.is_empty() {
            v["on_expire"] = Value::from(c.on_expire.clone());
        }
        if q.extra_fields {
            v["claimed_at"] = Value::from(c.claimed_at.to_string());
            v["restarts"] = Value::from(0);
            v["x_sim_unknown"] = json!({ "nested": true });
        }
        v
    }
}
