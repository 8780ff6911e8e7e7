//! `mqtt.broker` (and the `--mqtt` override): the embedded broker, none, or `host:port`.

use serde::de::{self, Deserialize, Deserializer};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

/// Which MQTT broker to talk to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Broker {
    /// Start the embedded broker (rumqttd) on 127.0.0.1 and connect to it.
    Embedded,
    /// No MQTT at all (serial only).
    Off,
    /// An existing broker. `host` is a name or an address, IPv6 without its brackets.
    Remote { host: String, port: u16 },
}

impl Broker {
    /// Parses `embedded`, `off`, `host:port` or `[ipv6]:port`.
    pub fn parse(s: &str) -> Result<Broker, String> {
        const EXPECTED: &str = "expected embedded, off, host:port or [ipv6]:port";
        if s.eq_ignore_ascii_case("embedded") {
            return Ok(Broker::Embedded);
        }
        if s.eq_ignore_ascii_case("off") {
            return Ok(Broker::Off);
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (addr, port) = rest
                .split_once("]:")
                .ok_or_else(|| format!("{s:?}: {EXPECTED}"))?;
            if addr.parse::<Ipv6Addr>().is_err() {
                return Err(format!("{s:?}: {addr:?} is not an IPv6 address"));
            }
            (addr, port)
        } else {
            let (host, port) = s
                .rsplit_once(':')
                .ok_or_else(|| format!("{s:?}: {EXPECTED} (the port is required)"))?;
            if host.contains(':') {
                return Err(format!(
                    "{s:?}: an IPv6 address goes in brackets, as [::1]:1883"
                ));
            }
            let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
            if host.is_empty() || host.len() > 253 || !host.chars().all(name_ok) {
                return Err(format!("{s:?}: {host:?} is not a host name or address"));
            }
            (host, port)
        };
        match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok(Broker::Remote {
                host: host.to_owned(),
                port: p,
            }),
            _ => Err(format!("{s:?}: {port:?} is not a port (1 to 65535)")),
        }
    }

    /// The broker runs on this machine: credentials to it never cross a network.
    pub fn is_loopback(&self) -> bool {
        match self {
            Broker::Embedded | Broker::Off => true,
            Broker::Remote { host, .. } => {
                host.eq_ignore_ascii_case("localhost")
                    || host.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
            }
        }
    }
}

impl FromStr for Broker {
    type Err = String;
    fn from_str(s: &str) -> Result<Broker, String> {
        Broker::parse(s)
    }
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broker::Embedded => f.write_str("embedded"),
            Broker::Off => f.write_str("off"),
            Broker::Remote { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Broker::Remote { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl<'de> Deserialize<'de> for Broker {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Broker, D::Error> {
        let s = String::deserialize(d)?;
        Broker::parse(&s).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brokers_parse_names_addresses_and_bracketed_ipv6() {
        let remote = |h: &str, p| Broker::Remote {
            host: h.to_owned(),
            port: p,
        };
        assert_eq!(Broker::parse("embedded"), Ok(Broker::Embedded));
        assert_eq!(Broker::parse("OFF"), Ok(Broker::Off));
        assert_eq!(Broker::parse("10.0.0.5:1883"), Ok(remote("10.0.0.5", 1883)));
        assert_eq!(
            Broker::parse("mqtt.plant:8883"),
            Ok(remote("mqtt.plant", 8883))
        );
        assert_eq!(Broker::parse("[::1]:1883"), Ok(remote("::1", 1883)));
        assert_eq!(
            Broker::parse("[fe80::1]:1883").unwrap().to_string(),
            "[fe80::1]:1883"
        );
        for bad in [
            "",
            "host",
            "host:",
            "host:0",
            "host:65536",
            ":1883",
            "::1:1883",
            "[::1]",
            "[zz]:1",
            "a b:1",
            "embeded",
        ] {
            assert!(Broker::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn loopback_brokers_are_told_from_remote_ones() {
        for lo in [
            "localhost:1883",
            "127.0.0.1:1883",
            "127.1.2.3:1",
            "[::1]:1883",
        ] {
            assert!(Broker::parse(lo).unwrap().is_loopback(), "{lo}");
        }
        for far in ["10.0.0.5:1883", "[fe80::1]:1883", "broker:1883"] {
            assert!(!Broker::parse(far).unwrap().is_loopback(), "{far}");
        }
        assert!(Broker::Embedded.is_loopback());
    }
}
