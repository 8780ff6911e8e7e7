//! Real parts for the MQTT tests: a Mosquitto broker on a free loopback port with a config the
//! test writes, and `edgellm serve` as a child process whose systemd notifications the test
//! receives on its own `NOTIFY_SOCKET`.
#![allow(dead_code)]

use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A loopback port nobody listens on now, for a server the test starts next.
///
/// It is drawn below the kernel's ephemeral range: a port from `bind(:0)` is one the kernel
/// also hands to outgoing connections, so a client socket of a test running beside this one
/// could take it between the check and the server's bind, or while a broker restarts on it.
pub fn free_port() -> u16 {
    free_ports(1)
}

/// The first of `n` consecutive free loopback ports (the embedded broker listens on two).
/// A port is handed out once per test process: two tests of one binary run side by side, and
/// a port both drew would leave one test's broker talking to the other's.
pub fn free_ports(n: u16) -> u16 {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static HANDED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768)
        .clamp(12000, 65000);
    let (base, span) = (low - 10000, 10000 - u32::from(n));
    // Different processes start at different places (ports below the ephemeral range, so no
    // outgoing connection takes one meanwhile).
    let seed = std::process::id().wrapping_mul(2654435761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    let mut handed = HANDED.lock().unwrap_or_else(|e| e.into_inner());
    for k in 0..1000u32 {
        let first = (base + (seed.wrapping_add(k.wrapping_mul(7919)) % span)) as u16;
        let ports = first..first + n;
        let free = ports
            .clone()
            .all(|p| !handed.contains(&p) && std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if free {
            handed.extend(ports);
            return first;
        }
    }
    panic!("no {n} free loopback ports below {low}");
}

/// Waits for the Mosquitto `child` to listen on `port`, and checks it is still running then:
/// something else answering on the port while ours failed to bind would pass the wait and
/// fail the test later for no visible reason.
pub fn wait_mosquitto(child: &mut Child, port: u16) {
    let until = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < until,
            "mosquitto is not listening on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50));
    let exited = child.try_wait().ok().flatten();
    assert!(exited.is_none(), "mosquitto exited at start: {exited:?}");
}

/// A Mosquitto broker, killed when dropped.
pub struct Mosquitto {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Anonymous clients on 127.0.0.1, no persistence.
    pub fn start() -> Mosquitto {
        Mosquitto::with_config("allow_anonymous true\n")
    }

    /// `extra` is added to a config that listens on a free loopback port.
    pub fn with_config(extra: &str) -> Mosquitto {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!("listener {port} 127.0.0.1\npersistence false\nlog_dest stderr\n{extra}"),
        )
        .unwrap();
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto (Debian package mosquitto; scripts/setup.sh installs it)");
        // Held before the wait, so that a broker that does not come up is killed on the
        // way out of a failed wait too.
        let mut m = Mosquitto {
            port,
            child,
            _dir: dir,
        };
        wait_mosquitto(&mut m.child, port);
        m
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `edgellm serve` as a child process; SIGTERM then SIGKILL when dropped.
pub struct Daemon {
    pub child: Child,
    pub notify: UnixDatagram,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts `edgellm serve ARGS` with `env`, and waits for its `READY=1`.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut d = Daemon::spawn(args, env);
        d.wait_ready();
        d
    }

    /// Waits up to 60 s for `READY=1`, failing at once if the daemon exits first.
    fn wait_ready(&mut self) {
        let until = Instant::now() + Duration::from_secs(60);
        let mut got = String::new();
        while Instant::now() < until {
            got.push_str(&self.wait_notify("READY=1", Duration::from_millis(200)));
            if got.contains("READY=1") {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the daemon exited ({status}) before READY=1: {got}\n{}",
                    self.log_text()
                );
            }
        }
        panic!("no READY=1 within 60 s: {got}\n{}", self.log_text());
    }

    /// As [`Daemon::start`], run by `wrapper` (a command that ends by exec'ing its arguments,
    /// such as `unshare … sh -c '…; exec "$@"'`), so the daemon keeps the child's pid.
    pub fn start_wrapped(wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut d = Daemon::spawn_by(wrapper, args, env);
        d.wait_ready();
        d
    }

    /// Starts it without waiting.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn_by(&[], args, env)
    }

    fn spawn_by(wrapper: &[&str], args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("notify");
        let notify = UnixDatagram::bind(&sock).unwrap();
        let log = dir.path().join("daemon.log");
        let bin = env!("CARGO_BIN_EXE_edgellm");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("serve")
            .args(args)
            .env("NOTIFY_SOCKET", &sock)
            .env_remove("WATCHDOG_USEC")
            .env_remove("EDGELLM_CONFIG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn edgellm serve");
        Daemon {
            child,
            notify,
            log,
            _dir: dir,
        }
    }

    /// Notifications until one contains `want` (or `within` passes); all of them, joined.
    pub fn wait_notify(&self, want: &str, within: Duration) -> String {
        let until = Instant::now() + within;
        let mut all = String::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < until {
            self.notify
                .set_read_timeout(Some(
                    until
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ))
                .unwrap();
            match self.notify.recv(&mut buf) {
                Ok(n) => {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    all.push_str(&msg);
                    all.push('\n');
                    if msg.contains(want) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        all
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status (SIGKILL after `within`).
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let until = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!(
                    "the daemon did not stop within {within:?} of SIGTERM\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One `mosquitto_pub -l`: every line a QoS 1 message to `topic`, published back to back by
/// one client.
pub fn publish_lines(port: u16, topic: &str, lines: &[String]) {
    use std::io::Write;
    let mut child = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", topic])
        .args(["-q", "1", "-l"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("mosquitto_pub");
    let mut stdin = child.stdin.take().unwrap();
    for l in lines {
        writeln!(stdin, "{l}").unwrap();
    }
    drop(stdin);
    assert!(child.wait().unwrap().success(), "mosquitto_pub -l failed");
}

/// `edgellm ask --broker 127.0.0.1:PORT --device DEVICE --timeout 60 ARGS`.
pub fn ask(port: u16, device: &str, args: &[&str]) -> Output {
    let broker = format!("127.0.0.1:{port}");
    let mut a = vec![
        "ask",
        "--broker",
        &broker,
        "--device",
        device,
        "--timeout",
        "60",
    ];
    a.extend_from_slice(args);
    edgellm(&a)
}

/// Runs `edgellm ARGS`.
pub fn edgellm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args(args)
        .output()
        .expect("run edgellm")
}

/// A `mosquitto_sub` whose subscription is in place: the lines it prints (`topic payload`),
/// one at a time as they come. Killed when dropped.
pub struct Sub {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Sub {
    /// The next line, waiting for it; `None` once `mosquitto_sub` has exited.
    pub fn next_line(&mut self) -> Option<String> {
        self.lines.recv().ok()
    }

    /// The lines still to come, up to `mosquitto_sub`'s exit.
    pub fn lines(&mut self) -> impl Iterator<Item = String> + '_ {
        std::iter::from_fn(|| self.next_line())
    }
}

impl Drop for Sub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A topic of its own, with a retained message on it: a subscriber that also subscribes to it
/// knows its subscription is in place once the message arrives (one SUBSCRIBE holds all of a
/// `mosquitto_sub`'s topics). A fixed pause was not enough on a loaded machine.
pub fn retained_probe(port: u16) -> String {
    retained_probe_by(port, &[])
}

/// As [`retained_probe`], with `mosquitto_pub` options (`-V mqttv311`).
fn retained_probe_by(port: u16, opts: &[&str]) -> String {
    static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("edgellm-test/probe/{}-{n}", std::process::id());
    let published = Command::new("mosquitto_pub")
        .args(opts)
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", &probe])
        .args(["-r", "-q", "1", "-m", "probe"])
        .status()
        .expect("mosquitto_pub (Debian package mosquitto-clients)");
    assert!(published.success(), "the probe could not be published");
    probe
}

/// `mosquitto_sub` collecting `count` messages on `topic` (or stopping after `secs`); returns
/// once it has subscribed, so the caller may publish at once.
pub fn subscribe(port: u16, topic: &str, count: usize, secs: u64) -> Sub {
    subscribe_by(port, topic, count, secs, &[])
}

/// As [`subscribe`], as an MQTT 3.1.1 client.
pub fn subscribe_v311(port: u16, topic: &str, count: usize, secs: u64) -> Sub {
    subscribe_by(port, topic, count, secs, &["-V", "mqttv311"])
}

fn subscribe_by(port: u16, topic: &str, count: usize, secs: u64, opts: &[&str]) -> Sub {
    let probe = retained_probe_by(port, opts);
    let mut child = Command::new("mosquitto_sub")
        .args(opts)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-t", topic, "-t", &probe, "-q", "1", "-v"])
        // The probe is one of the messages it counts.
        .args(["-C", &(count + 1).to_string(), "-W", &secs.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub (Debian package mosquitto-clients)");
    let out = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let (subscribed, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if line.split_once(' ').is_some_and(|(t, _)| t == probe) {
                let _ = subscribed.send(());
            } else if tx.send(line).is_err() {
                break;
            }
        }
    });
    ready
        .recv_timeout(Duration::from_secs(30))
        .expect("mosquitto_sub did not subscribe within 30 s");
    Sub { child, lines }
}

/// The `(topic, payload)` lines a [`subscribe`] child printed, up to its exit.
pub fn collect(mut sub: Sub) -> Vec<(String, String)> {
    sub.lines()
        .filter_map(|l| l.split_once(' ').map(|(t, p)| (t.to_owned(), p.to_owned())))
        .collect()
}

/// `mosquitto_pub` of `payload` to `topic`.
pub fn publish(port: u16, topic: &str, payload: &[u8]) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), payload).unwrap();
    let st = Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            topic,
            "-q",
            "1",
            "-f",
        ])
        .arg(file.path())
        .status()
        .expect("mosquitto_pub");
    assert!(st.success(), "mosquitto_pub failed");
}

pub fn model_arg(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

impl Daemon {
    /// The daemon's log once `done` says it holds what the test waits for, or when `within`
    /// has passed (the caller asserts on what it got).
    pub fn wait_log(&self, within: Duration, done: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + within;
        loop {
            let log = self.log_text();
            if done(&log) || Instant::now() >= until {
                return log;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon is still running (not exited, whatever the reason).
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}
