use super::*;

#[test]
fn the_heartbeat_is_due_when_never_applied_readiness_changed_or_the_period_passed() {
    let t0 = Instant::now();
    let every = Duration::from_secs(10);
    assert_eq!(heartbeat_due(None, true, every, t0), None);
    assert_eq!(
        heartbeat_due(Some((true, t0)), true, every, t0 + Duration::from_secs(4)),
        Some(Duration::from_secs(6))
    );
    assert_eq!(heartbeat_due(Some((false, t0)), true, every, t0), None);
    assert_eq!(heartbeat_due(Some((true, t0)), false, every, t0), None);
    assert_eq!(
        heartbeat_due(Some((true, t0)), true, every, t0 + every),
        None
    );
    assert_eq!(
        heartbeat_due(Some((true, t0)), true, every, t0 + Duration::from_secs(11)),
        None
    );
}

#[test]
fn refusal_names_the_flag_and_env() {
    let msg = refuse_foreign("worker-1").to_string();
    assert!(msg.contains("worker-1"));
    assert!(msg.contains("--node-name"));
    assert!(msg.contains("VK_NODE_NAME"));
}
