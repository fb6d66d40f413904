use super::*;
use x509_parser::prelude::*;

#[test]
fn self_signed_certificate_has_the_documented_shape() {
    let (key, pem) = self_signed("vk-node-a", Some("10.1.2.3")).unwrap();
    let der = key.end_entity_cert().unwrap().to_vec();
    let (_, cert) = parse_x509_certificate(&der).unwrap();
    assert_eq!(
        cert.subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap(),
        "vk-sandbox"
    );
    assert_eq!(cert.subject(), cert.issuer(), "self-issued");
    let sans: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => format!("DNS:{d}"),
            GeneralName::IPAddress(b) => {
                let ip: IpAddr = match b.len() {
                    4 => <[u8; 4]>::try_from(*b).unwrap().into(),
                    _ => <[u8; 16]>::try_from(*b).unwrap().into(),
                };
                format!("IP:{ip}")
            }
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(sans, ["DNS:vk-node-a", "IP:10.1.2.3", "IP:127.0.0.1"]);
    let bc = cert.basic_constraints().unwrap().unwrap();
    assert!(!bc.value.ca);
    let eku = cert.extended_key_usage().unwrap().unwrap();
    assert!(eku.value.server_auth);
    let ku = cert.key_usage().unwrap().unwrap();
    assert!(ku.value.digital_signature());
    let nb = cert.validity().not_before.timestamp();
    let na = cert.validity().not_after.timestamp();
    let now = ::time::OffsetDateTime::now_utc().unix_timestamp();
    assert!((now - 3600 - nb).abs() < 60, "not before = now - 1h");
    assert!(
        (na - (now + 3650 * 86400)).abs() < 60,
        "not after = now + 3650d"
    );
    assert_eq!(cert.raw_serial().len(), 16);
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
    // Key type ECDSA P-256.
    assert_eq!(
        cert.public_key().algorithm.algorithm.to_id_string(),
        "1.2.840.10045.2.1"
    );
    // Serials differ between runs.
    let (key2, _) = self_signed("vk-node-a", None).unwrap();
    let (_, cert2) = parse_x509_certificate(key2.end_entity_cert().unwrap().as_ref()).unwrap();
    assert_ne!(cert.raw_serial(), cert2.raw_serial());
}

#[test]
fn self_signed_ip_node_name_and_dns_node_ip() {
    let (key, _) = self_signed("10.9.9.9", Some("node.example")).unwrap();
    let (_, cert) = parse_x509_certificate(key.end_entity_cert().unwrap().as_ref()).unwrap();
    let names = &cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names;
    assert!(matches!(names[0], GeneralName::IPAddress(b) if b == [10, 9, 9, 9]));
    assert!(matches!(names[1], GeneralName::DNSName("node.example")));
    assert_eq!(names.len(), 3);
}

#[test]
fn pair_loading_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let kp = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["x.test".to_string()])
        .unwrap()
        .self_signed(&kp)
        .unwrap();
    let c = dir.path().join("c.pem");
    let k = dir.path().join("k.pem");
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, kp.serialize_pem()).unwrap();
    assert!(load_pair(&c, &k).is_ok());

    let files = TlsFiles {
        cert: Some(c.clone()),
        key: Some(k.clone()),
    };
    assert!(usable_pair(&files).is_some());
    let tls = KubeletTls::init(&files, "n", None).unwrap();
    assert!(!tls.is_self_signed());

    // Missing key file -> self-sign.
    let missing = TlsFiles {
        cert: Some(c.clone()),
        key: Some(dir.path().join("nope")),
    };
    assert!(usable_pair(&missing).is_none());
    assert!(
        KubeletTls::init(&missing, "n", None)
            .unwrap()
            .is_self_signed()
    );
    // A directory is not a regular file -> self-sign.
    let dir_pair = TlsFiles {
        cert: Some(dir.path().to_path_buf()),
        key: Some(k.clone()),
    };
    assert!(
        KubeletTls::init(&dir_pair, "n", None)
            .unwrap()
            .is_self_signed()
    );

    // Garbage -> start-up error naming the flags.
    std::fs::write(&k, "not a key").unwrap();
    let err = KubeletTls::init(&files, "n", None).unwrap_err().to_string();
    assert!(err.contains("--tls-key"), "{err}");
    assert!(err.contains("VK_TLS_CERT"), "{err}");

    // A key of another pair -> mismatch error.
    let other = KeyPair::generate().unwrap();
    std::fs::write(&k, other.serialize_pem()).unwrap();
    let err = load_pair(&c, &k).unwrap_err();
    assert!(err.contains("does not fit"), "{err}");
}

#[test]
fn roots_parsing() {
    let kp = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&kp).unwrap();
    assert_eq!(
        roots_from_pem(ca.pem().as_bytes(), "test").unwrap().len(),
        1
    );
    let err = roots_from_pem(b"", "the ConfigMap")
        .unwrap_err()
        .to_string();
    assert!(err.contains("--client-ca-file"), "{err}");
}
