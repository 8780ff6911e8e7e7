//! systemd's notification protocol (`sd_notify(3)`), by hand: one datagram per message to the
//! socket named by `NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). `READY=1`
//! once the model is mapped and the front ends listen, `STATUS=` lines for `systemctl status`,
//! `WATCHDOG=1` while the engine loop is alive, `STOPPING=1` on the way out.
//!
//! Without `NOTIFY_SOCKET` (not started by systemd) every call does nothing. A failed send is
//! logged once and otherwise ignored: the daemon's work never depends on its supervisor. Nor
//! does it wait for it: the socket is non-blocking, because a supervisor that stops reading
//! (a full datagram queue holds 10 messages by default) would otherwise stall the I/O thread
//! that sends, and with it MQTT (seen in a test whose listener read only `READY=1`). A
//! `STATUS=` or `WATCHDOG=1` that finds the queue full is dropped (the next one follows);
//! `READY=1` and `STOPPING=1` are tried again for up to 200 ms.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Where notifications go.
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    warned: AtomicBool,
}

impl Notifier {
    /// The supervisor named by `NOTIFY_SOCKET`, if any.
    pub fn from_env() -> Notifier {
        Notifier::to(
            std::env::var_os("NOTIFY_SOCKET")
                .as_deref()
                .and_then(|s| s.to_str()),
        )
    }

    /// Notifications to `socket` (`/run/…` or `@abstract`); `None` sends nothing.
    pub fn to(socket: Option<&str>) -> Notifier {
        let target = socket.and_then(|s| match open(s) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(socket = s, "systemd notification socket unusable: {e}");
                None
            }
        });
        Notifier {
            target,
            warned: AtomicBool::new(false),
        }
    }

    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `state` (newline-separated `KEY=value` lines) as one datagram, never waiting for
    /// room in the supervisor's queue (the message is then dropped).
    pub fn notify(&self, state: &str) {
        self.send(state, Duration::ZERO);
    }

    /// As `notify`, trying again for up to `patience` while the supervisor's queue is full.
    fn send(&self, state: &str, patience: Duration) {
        let Some((sock, addr)) = &self.target else {
            return;
        };
        let until = std::time::Instant::now() + patience;
        let err = loop {
            match sock.send_to_addr(state.as_bytes(), addr) {
                Ok(_) => return,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && std::time::Instant::now() < until =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => break e,
            }
        };
        if err.kind() == std::io::ErrorKind::WouldBlock {
            tracing::debug!("systemd's notification queue is full: {state:?} dropped");
        } else if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("cannot notify systemd ({state:?}): {err}");
        }
    }

    /// The service is up: `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send(
            &format!("READY=1\nSTATUS={}", one_line(status)),
            Duration::from_millis(200),
        );
    }

    pub fn status(&self, status: &str) {
        self.notify(&format!("STATUS={}", one_line(status)));
    }

    pub fn watchdog(&self) {
        self.notify("WATCHDOG=1");
    }

    pub fn stopping(&self, status: &str) {
        self.send(
            &format!("STOPPING=1\nSTATUS={}", one_line(status)),
            Duration::from_millis(200),
        );
    }
}

/// How often to ping the watchdog: half of `WATCHDOG_USEC`, when it is set for this process.
pub fn watchdog_interval() -> Option<Duration> {
    watchdog_interval_from(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

fn watchdog_interval_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    // WATCHDOG_PID names the process meant; a child that inherited the variables is not it.
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec / 2))
}

fn open(socket: &str) -> std::io::Result<(UnixDatagram, SocketAddr)> {
    let addr = match socket.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None => SocketAddr::from_pathname(socket)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    Ok((sock, addr))
}

/// A status is one line: a newline would start another `KEY=value` assignment.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_supervisor_that_stops_reading_never_blocks_the_sender() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let _listener = UnixDatagram::bind(&path).unwrap(); // bound, never read
        let n = Notifier::to(Some(path.to_str().unwrap()));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Far more than a datagram queue holds.
            for i in 0..500 {
                n.status(&format!("status {i}"));
                n.watchdog();
            }
            n.stopping("stopping");
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("notifying blocked on a supervisor that does not read");
    }

    #[test]
    fn messages_reach_a_path_socket_as_one_datagram_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = Notifier::to(Some(path.to_str().unwrap()));
        assert!(n.enabled());
        n.ready("serving smollm2\nSTOPPING=1");
        n.watchdog();
        n.stopping("bye");
        let mut buf = [0u8; 256];
        let mut next = || {
            let len = rx.recv(&mut buf).unwrap();
            String::from_utf8(buf[..len].to_vec()).unwrap()
        };
        assert_eq!(next(), "READY=1\nSTATUS=serving smollm2 STOPPING=1");
        assert_eq!(next(), "WATCHDOG=1");
        assert_eq!(next(), "STOPPING=1\nSTATUS=bye");
    }

    #[test]
    fn an_abstract_socket_is_reached_too() {
        let name = format!("edgellm-notify-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Notifier::to(Some(&format!("@{name}"))).watchdog();
        let mut buf = [0u8; 32];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }

    #[test]
    fn without_a_socket_nothing_is_sent_and_nothing_fails() {
        let n = Notifier::to(None);
        assert!(!n.enabled());
        n.ready("x");
        // A socket nobody listens on: logged once, not an error.
        let gone = Notifier::to(Some("/nonexistent/edgellm/notify"));
        gone.watchdog();
        gone.watchdog();
    }

    #[test]
    fn the_watchdog_interval_is_half_the_timeout_and_only_for_the_named_process() {
        let half = Some(Duration::from_secs(5));
        assert_eq!(watchdog_interval_from(Some("10000000"), None, 7), half);
        assert_eq!(watchdog_interval_from(Some("10000000"), Some("7"), 7), half);
        assert_eq!(watchdog_interval_from(Some("10000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_from(Some("soon"), None, 7), None);
        assert_eq!(watchdog_interval_from(None, None, 7), None);
    }
}
