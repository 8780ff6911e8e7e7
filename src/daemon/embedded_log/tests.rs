use super::*;
use rumqttd::protocol::Error as Protocol;
use std::sync::Mutex as StdMutex;

fn broker_1883() -> Broker {
    Broker {
        v5_port: 1883,
        v311_port: 1884,
        max_payload: 65536,
        max_packet: 135168,
    }
}

/// rumqttd's Debug of `Network(Protocol(e))`, as its link error wraps a protocol error.
fn in_network(e: Protocol) -> String {
    format!("Network(Protocol({e:?}))")
}

#[test]
fn a_packet_over_the_limit_is_read_from_either_of_rumqttds_wordings() {
    let whole = in_network(Protocol::PayloadSizeLimitExceeded(40_029));
    assert_eq!(
        classify("disconnected", &whole),
        Some(Refusal::TooLarge { size: 40_029 })
    );
    // Behind another packet in one read, the error arrives as I/O with its Display.
    let io = format!(
        "Network(Io({:?}))",
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            Protocol::PayloadSizeLimitExceeded(40_029).to_string()
        )
    );
    assert_eq!(
        classify("disconnected", &io),
        Some(Refusal::TooLarge { size: 40_029 })
    );
    // In the CONNECT itself (a huge will), too.
    assert_eq!(
        classify(CONNECT_FAILED, &whole),
        Some(Refusal::TooLarge { size: 40_029 })
    );
}

#[test]
fn a_connect_of_the_other_version_names_its_protocol_level() {
    assert_eq!(
        classify(
            CONNECT_FAILED,
            &in_network(Protocol::InvalidProtocolLevel(4))
        ),
        Some(Refusal::Version { level: Some(4) })
    );
    assert_eq!(
        classify(CONNECT_FAILED, &in_network(Protocol::InvalidProtocol)),
        Some(Refusal::Version { level: None })
    );
}

#[test]
fn a_peer_that_leaves_before_its_connect_and_an_ordinary_disconnect_are_not_refusals() {
    let closed = format!(
        "Network(Io({:?}))",
        std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "connection closed by peer"
        )
    );
    assert_eq!(classify(CONNECT_FAILED, &closed), None);
    assert_eq!(
        classify("disconnected", "Network(KeepAlive(Elapsed(())))"),
        None
    );
    assert_eq!(classify("Listening for remote connections", ""), None);
}

#[test]
fn other_refused_connects_are_reported_in_words_where_the_reason_is_known() {
    let Some(Refusal::Connect { reason }) = classify(CONNECT_FAILED, "Timeout(Elapsed(()))") else {
        panic!("a CONNECT that never came is a refusal");
    };
    assert!(reason.contains("10 s"), "{reason}");
    let Some(Refusal::Connect { reason }) = classify(LINK_REFUSED, "Link(…)") else {
        panic!("a link the router refused is a refusal");
    };
    assert!(reason.contains("Link(…)"), "{reason}");
}

#[test]
fn each_line_names_what_the_clients_owner_must_change() {
    let b = broker_1883();
    let big = describe(&Refusal::TooLarge { size: 140_000 }, Some("press-7"), &b);
    for want in ["\"press-7\"", "140000", "135168", "65536"] {
        assert!(big.contains(want), "{want}: {big}");
    }
    let v311 = describe(&Refusal::Version { level: Some(4) }, None, &b);
    assert!(
        v311.contains("3.1.1") && v311.contains("port 1884"),
        "{v311}"
    );
    let v5 = describe(&Refusal::Version { level: Some(5) }, None, &b);
    assert!(v5.contains("port 1883"), "{v5}");
    let v31 = describe(&Refusal::Version { level: None }, None, &b);
    assert!(
        v31.contains("3.1 ") && v31.contains("1883") && v31.contains("1884"),
        "{v31}"
    );
}

#[test]
fn a_client_refused_in_a_loop_is_logged_once_every_ten_seconds() {
    let mut l = Limiter::default();
    let t0 = Instant::now();
    let big = Refusal::TooLarge { size: 1 };
    assert!(l.allow(&big, Some("a"), t0));
    assert!(!l.allow(&big, Some("a"), t0 + Duration::from_secs(9)));
    // Another client, or another kind of refusal, has its own line.
    assert!(l.allow(&big, Some("b"), t0));
    assert!(l.allow(&Refusal::Version { level: Some(4) }, Some("a"), t0));
    // A client of each wrong version has no id yet: each version has its own line.
    assert!(l.allow(&Refusal::Version { level: Some(4) }, None, t0));
    assert!(!l.allow(&Refusal::Version { level: Some(4) }, None, t0));
    assert!(l.allow(&Refusal::Version { level: Some(5) }, None, t0));
    assert!(l.allow(&big, Some("a"), t0 + Limiter::EVERY));
}

#[test]
fn a_flood_of_client_ids_is_not_remembered_past_the_cap() {
    let mut l = Limiter::default();
    let t0 = Instant::now();
    let big = Refusal::TooLarge { size: 1 };
    for i in 0..Limiter::CAP {
        assert!(l.allow(&big, Some(&i.to_string()), t0));
    }
    assert!(!l.allow(&big, Some("one more"), t0));
    assert!(l.last.len() <= Limiter::CAP);
    // Once the period is over, the old entries make room.
    assert!(l.allow(&big, Some("one more"), t0 + Limiter::EVERY));
    assert_eq!(l.last.len(), 1);
}

static SAID: StdMutex<Vec<String>> = StdMutex::new(Vec::new());

fn said(line: &str) {
    SAID.lock().unwrap().push(line.to_owned());
}

#[test]
fn rumqttds_error_in_a_connection_span_becomes_one_line_naming_the_recorded_client() {
    use tracing_subscriber::layer::SubscriberExt;
    serving(broker_1883());
    let subscriber = tracing_subscriber::registry().with(layer_with(said));
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::error_span!(
            target: "rumqttd::server::broker",
            "remote_link",
            client_id = tracing::field::Empty
        );
        let _in = span.enter();
        span.record("client_id", "press-7");
        for _ in 0..3 {
            tracing::error!(
                target: "rumqttd::server::broker",
                error = ?format_args!("{}", in_network(Protocol::PayloadSizeLimitExceeded(140_000))),
                "disconnected"
            );
        }
        // edgellm's own errors are not read.
        tracing::error!(
            error = ?format_args!("{}", in_network(Protocol::PayloadSizeLimitExceeded(9))),
            "disconnected"
        );
    });
    let lines = std::mem::take(&mut *SAID.lock().unwrap());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("\"press-7\"") && lines[0].contains("140000"),
        "{lines:?}"
    );
}
