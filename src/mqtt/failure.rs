//! Why the connection to the broker failed, said for the person who reads the log or
//! `systemctl status`: what the broker refused, or why TLS failed, instead of rumqttc's debug
//! names (`ConnectionRefused(BadUserNamePassword)`, `TLS: I/O: invalid peer certificate:
//! UnknownIssuer`). Pure: an error in, one line out.

use rumqttc::v5::ConnectionError;
use rumqttc::v5::mqttbytes::v5::ConnectReturnCode;
use rustls::{AlertDescription, CertificateError};

/// One line saying why the connection failed, naming the configuration keys to look at.
pub fn describe(e: &ConnectionError) -> String {
    if let ConnectionError::ConnectionRefused(code) = e {
        return format!("the broker refused the connection: {}", refused(*code));
    }
    match find_rustls(e) {
        Some(t) => format!("TLS: {}", tls(t)),
        None => e.to_string(),
    }
}

/// Whether the failure lasts: the broker said no (credentials, authorisation) or TLS failed
/// (a certificate): trying again the same way will not help until a configuration changes,
/// unlike a broker that is down or restarting.
pub fn lasting(e: &ConnectionError) -> bool {
    matches!(e, ConnectionError::ConnectionRefused(_)) || find_rustls(e).is_some()
}

/// [`describe`], for a 3.1.1 connection.
pub fn describe_v4(e: &rumqttc::ConnectionError) -> String {
    use rumqttc::ConnectReturnCode as C;
    if let rumqttc::ConnectionError::ConnectionRefused(code) = e {
        // The same words as over MQTT 5, from the same table; only the version differs.
        let v5 = match code {
            C::BadUserNamePassword => ConnectReturnCode::BadUserNamePassword,
            C::NotAuthorized => ConnectReturnCode::NotAuthorized,
            C::BadClientId => ConnectReturnCode::BadClientId,
            C::ServiceUnavailable => ConnectReturnCode::ServiceUnavailable,
            C::RefusedProtocolVersion => {
                return "the broker refused the connection: it does not speak MQTT 3.1.1".into();
            }
            C::Success => return "the broker refused the connection: no reason given".into(),
        };
        return format!("the broker refused the connection: {}", refused(v5));
    }
    match find_rustls_v4(e) {
        Some(t) => format!("TLS: {}", tls(t)),
        None => e.to_string(),
    }
}

/// [`lasting`], for a 3.1.1 connection.
pub fn lasting_v4(e: &rumqttc::ConnectionError) -> bool {
    matches!(e, rumqttc::ConnectionError::ConnectionRefused(_)) || find_rustls_v4(e).is_some()
}

fn find_rustls_v4(e: &rumqttc::ConnectionError) -> Option<&rustls::Error> {
    use rumqttc::StateError;
    match e {
        rumqttc::ConnectionError::MqttState(
            StateError::Io(io) | StateError::Deserialization(rumqttc::Error::Io(io)),
        ) => find_in(io),
        e => find_in(e),
    }
}

fn refused(code: ConnectReturnCode) -> String {
    use ConnectReturnCode as C;
    match code {
        C::BadUserNamePassword => {
            "bad user name or password (mqtt.username, mqtt.password or mqtt.password_file)".into()
        }
        // What Mosquitto answers an MQTT 5 client whose password is wrong, too.
        C::NotAuthorized => {
            "not authorized (bad user name or password, or none where the broker wants one: \
             mqtt.username, mqtt.password or mqtt.password_file)"
                .into()
        }
        C::BadClientId | C::ClientIdentifierNotValid => {
            "the client id is not valid (it is edgellm-{mqtt.device})".into()
        }
        C::Banned => "this client is banned".into(),
        C::ServerUnavailable | C::ServiceUnavailable | C::ServerBusy => {
            "the broker is unavailable or busy".into()
        }
        C::UnsupportedProtocolVersion | C::RefusedProtocolVersion => {
            "the broker does not speak MQTT 5 (Mosquitto 1.6 and EMQX 4 on do)".into()
        }
        other => format!("{other:?}"),
    }
}

fn tls(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => {
                "the broker's certificate is not signed by a CA of mqtt.tls.ca_file".into()
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "the broker's certificate is not for the host name or address of mqtt.broker".into()
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "the broker's certificate has expired (or this device's clock is wrong)".into()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "the broker's certificate is not valid yet (or this device's clock is wrong)".into()
            }
            other => format!("the broker's certificate is refused: {other:?}"),
        },
        rustls::Error::AlertReceived(
            a @ (AlertDescription::CertificateRequired
            | AlertDescription::HandshakeFailure
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied),
        ) => format!(
            "the broker refused this client's certificate, or wants one (mqtt.tls.cert_file \
             and mqtt.tls.key_file): alert {a:?}"
        ),
        other => other.to_string(),
    }
}

/// The rustls error under `e`, through rumqttc's and tokio-rustls' wrappers: the latter puts
/// it inside an `io::Error` (whose `source` skips it), and an alert that arrives after the
/// handshake (TLS 1.3 refuses a client certificate then) comes as a read error of the MQTT
/// state, which names no source.
fn find_rustls(e: &ConnectionError) -> Option<&rustls::Error> {
    use rumqttc::v5::StateError;
    use rumqttc::v5::mqttbytes::Error as Bytes;
    match e {
        ConnectionError::MqttState(
            StateError::Io(io) | StateError::Deserialization(Bytes::Io(io)),
        ) => find_in(io),
        e => find_in(e),
    }
}

fn find_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut e = e;
    for _ in 0..8 {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            e = inner;
            continue;
        }
        e = e.source()?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_password_over_3_1_1_is_said_the_same_way() {
        let e = rumqttc::ConnectionError::ConnectionRefused(
            rumqttc::ConnectReturnCode::BadUserNamePassword,
        );
        let s = describe_v4(&e);
        assert!(
            s.starts_with("the broker refused the connection: bad user name or password"),
            "{s}"
        );
        assert!(lasting_v4(&e));
        let down = rumqttc::ConnectionError::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ));
        assert!(!lasting_v4(&down));
    }

    #[test]
    fn a_refused_password_is_said_as_such_with_the_keys_to_check() {
        let e = ConnectionError::ConnectionRefused(ConnectReturnCode::BadUserNamePassword);
        let s = describe(&e);
        assert!(
            s.starts_with("the broker refused the connection: bad user name or password"),
            "{s}"
        );
        assert!(s.contains("mqtt.password_file"), "{s}");
        assert!(lasting(&e));
    }

    #[test]
    fn an_unknown_issuer_is_found_inside_the_io_error_of_the_handshake() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        let e = ConnectionError::Tls(rumqttc::TlsError::Io(io));
        let s = describe(&e);
        assert_eq!(
            s,
            "TLS: the broker's certificate is not signed by a CA of mqtt.tls.ca_file"
        );
        assert!(lasting(&e));
    }

    #[test]
    fn a_client_certificate_the_broker_wants_is_named_from_its_alert() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
        );
        // After the handshake, as a read of the MQTT state.
        let e = ConnectionError::MqttState(rumqttc::v5::StateError::Deserialization(
            rumqttc::v5::mqttbytes::Error::Io(io),
        ));
        let s = describe(&e);
        assert!(s.contains("mqtt.tls.cert_file"), "{s}");
        assert!(lasting(&e));
    }

    #[test]
    fn other_errors_keep_their_own_words() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = ConnectionError::Io(io);
        assert_eq!(describe(&e), "I/O: refused");
        assert!(!lasting(&e), "a broker that is down may come up");
    }
}
