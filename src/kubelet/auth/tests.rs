use super::fakes::*;
use super::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

fn user(name: &str) -> UserInfo {
    UserInfo {
        name: name.into(),
        ..UserInfo::default()
    }
}

#[test]
fn subresource_and_verb_mapping() {
    let cases = [
        (Method::GET, "/pods", "get", "proxy"),
        (Method::GET, "/runningpods/", "get", "proxy"),
        (Method::GET, "/stats/summary", "get", "stats"),
        (Method::GET, "/stats", "get", "stats"),
        (Method::GET, "/statsx", "get", "proxy"),
        (Method::GET, "/metrics/resource", "get", "metrics"),
        (Method::GET, "/metrics", "get", "metrics"),
        (Method::GET, "/logs/syslog", "get", "log"),
        (Method::GET, "/containerLogs/ns/p/c", "get", "proxy"),
        (Method::POST, "/exec/ns/p/c", "create", "proxy"),
        (Method::GET, "/exec/ns/p/c", "create", "proxy"),
        (Method::GET, "/attach/ns/p/uid/c", "create", "proxy"),
        (Method::GET, "/portForward/ns/p", "create", "proxy"),
        (Method::GET, "/executive", "get", "proxy"),
        (Method::PUT, "/x", "update", "proxy"),
        (Method::PATCH, "/x", "patch", "proxy"),
        (Method::DELETE, "/x", "delete", "proxy"),
        (Method::HEAD, "/pods", "get", "proxy"),
    ];
    for (method, path, verb, sub) in cases {
        let a = request_attributes(&method, path, "node-a");
        assert_eq!((a.verb, a.subresource), (verb, sub), "{method} {path}");
        assert_eq!(a.resource, "nodes");
        assert_eq!(a.name, "node-a");
    }
}

#[test]
fn fine_grained_subresources_come_first() {
    let subs = |path: &str| -> Vec<&'static str> {
        authorization_attributes(&Method::GET, path, "n")
            .iter()
            .map(|a| a.subresource)
            .collect()
    };
    assert_eq!(subs("/pods"), ["pods", "proxy"]);
    assert_eq!(subs("/runningpods/"), ["pods", "proxy"]);
    assert_eq!(subs("/healthz"), ["healthz", "proxy"]);
    assert_eq!(subs("/stats/summary"), ["stats"]);
    assert_eq!(subs("/exec/ns/p/c"), ["proxy"]);
    assert_eq!(subs("/podsx"), ["proxy"]);
}

#[test]
fn sar_body() {
    let mut u = user("system:kube-apiserver");
    u.groups = vec!["system:masters".into()];
    let sar = subject_access_review(&u, &request_attributes(&Method::GET, "/pods", "n1"));
    let v = serde_json::to_value(&sar).unwrap();
    assert_eq!(v["apiVersion"], "authorization.k8s.io/v1");
    assert_eq!(v["kind"], "SubjectAccessReview");
    assert_eq!(v["spec"]["user"], "system:kube-apiserver");
    assert_eq!(v["spec"]["groups"][0], "system:masters");
    let ra = &v["spec"]["resourceAttributes"];
    assert_eq!(ra["resource"], "nodes");
    assert_eq!(ra["subresource"], "proxy");
    assert_eq!(ra["name"], "n1");
    assert_eq!(ra["verb"], "get");
}

#[test]
fn bearer_parsing() {
    let mut h = HeaderMap::new();
    assert_eq!(bearer_token(&h), None);
    h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
    assert_eq!(bearer_token(&h), Some("abc"));
    h.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
    assert_eq!(bearer_token(&h), Some("abc"));
    h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
    assert_eq!(bearer_token(&h), None);
    h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
    assert_eq!(bearer_token(&h), None);
}

fn auth_with(
    authn: FakeAuthenticator,
    authz: FakeAuthorizer,
    anonymous: bool,
) -> (KubeletAuth, Arc<FakeAuthenticator>, Arc<FakeAuthorizer>) {
    let authn = Arc::new(authn);
    let authz = Arc::new(authz);
    (
        KubeletAuth::new(authn.clone(), authz.clone(), "node-a", anonymous),
        authn,
        authz,
    )
}

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    h
}

#[tokio::test]
async fn token_results_are_cached() {
    let (auth, authn, _) = auth_with(
        FakeAuthenticator {
            tokens: HashMap::from([("good".to_string(), user("alice"))]),
            ..Default::default()
        },
        FakeAuthorizer::default(),
        false,
    );
    for _ in 0..3 {
        assert_eq!(
            auth.authenticate(None, &bearer("good")).await.unwrap().name,
            "alice"
        );
    }
    assert_eq!(authn.calls.load(Ordering::SeqCst), 1);
    for _ in 0..2 {
        assert_eq!(
            auth.authenticate(None, &bearer("bad")).await,
            Err(Refusal::Unauthenticated)
        );
    }
    assert_eq!(authn.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn anonymous_only_when_enabled_and_cert_wins() {
    let (off, _, _) = auth_with(Default::default(), Default::default(), false);
    assert_eq!(
        off.authenticate(None, &HeaderMap::new()).await,
        Err(Refusal::Unauthenticated)
    );
    let (on, _, _) = auth_with(Default::default(), Default::default(), true);
    assert_eq!(
        on.authenticate(None, &HeaderMap::new()).await.unwrap(),
        UserInfo::anonymous()
    );
    let peer = user("system:kube-apiserver-kubelet-client");
    assert_eq!(
        off.authenticate(Some(&peer), &bearer("whatever"))
            .await
            .unwrap(),
        peer
    );
}

#[tokio::test]
async fn authentication_error_is_a_refusal_not_cached() {
    let (auth, authn, _) = auth_with(
        FakeAuthenticator {
            fail: true,
            ..Default::default()
        },
        Default::default(),
        false,
    );
    for _ in 0..2 {
        let r = auth.authenticate(None, &bearer("t")).await.unwrap_err();
        assert_eq!(r.metric_label(), "authentication_error");
    }
    assert_eq!(authn.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn decisions_are_cached_per_user_verb_subresource() {
    let (auth, _, authz) = auth_with(
        Default::default(),
        FakeAuthorizer {
            allow: vec![("bob".into(), "stats")],
            ..Default::default()
        },
        false,
    );
    let bob = user("bob");
    assert!(
        auth.authorize(&bob, &Method::GET, "/stats/summary")
            .await
            .is_ok()
    );
    assert!(
        auth.authorize(&bob, &Method::GET, "/stats/summary/")
            .await
            .is_ok()
    );
    assert_eq!(authz.calls.load(Ordering::SeqCst), 1);
    let err = auth
        .authorize(&bob, &Method::GET, "/pods")
        .await
        .unwrap_err();
    let resp = err.clone().into_response();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(matches!(err, Refusal::Forbidden { ref reason, .. } if reason == "no RBAC rule"));
    assert!(
        matches!(err, Refusal::Forbidden { ref subresources, .. } if subresources == &["pods", "proxy"])
    );
    // nodes/pods, then nodes/proxy.
    assert_eq!(authz.calls.load(Ordering::SeqCst), 3);
    assert!(auth.authorize(&bob, &Method::GET, "/pods").await.is_err());
    assert_eq!(authz.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn authorization_error_is_500() {
    let (auth, _, _) = auth_with(
        Default::default(),
        FakeAuthorizer {
            fail: true,
            ..Default::default()
        },
        false,
    );
    let err = auth
        .authorize(&user("x"), &Method::GET, "/pods")
        .await
        .unwrap_err();
    assert_eq!(err.metric_label(), "authorization_error");
    assert_eq!(
        err.into_response().status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[test]
fn identity_from_certificate() {
    let kp = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, "system:kube-apiserver");
    dn.push(rcgen::DnType::OrganizationName, "system:masters");
    params.distinguished_name = dn;
    let cert = params.self_signed(&kp).unwrap();
    let u = UserInfo::from_certificate(cert.der()).unwrap();
    assert_eq!(u.name, "system:kube-apiserver");
    assert_eq!(u.groups, vec!["system:masters".to_string()]);
    assert!(UserInfo::from_certificate(b"junk").is_none());
}
