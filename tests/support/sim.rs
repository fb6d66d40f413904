//! Reading the sandboxd simulator's request log.

use sandboxd_sim::SimHandle;

/// Claim requests sent for the Pod `key` (`<namespace>/<name>`): the
/// request's `claim_ref` names that Pod, with or without vk-sandbox's tag.
pub fn claims_for_key(sim: &SimHandle, key: &str) -> usize {
    sim.sim()
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/claim")
        .filter(|r| {
            serde_json::from_str::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|b| b["claim_ref"].as_str().map(str::to_string))
                .is_some_and(|cr| vk_sandbox::pods::claim_ref::display(&cr) == key)
        })
        .count()
}
