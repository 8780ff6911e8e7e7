//! Serial ports as the daemon lives with them: a port that vanishes and comes back (a `socat`
//! link, as a USB adapter unplugged), idle or mid-answer, two ports at once, and serial and MQTT requests sharing
//! the one queue fairly. The port's state is in the retained MQTT status.

mod common;

use common::mqtt::{Daemon, Mosquitto, collect, model_arg, subscribe};
use common::serial::Pty;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

/// `socat` joining two ptys, each behind a link path: `dev` for the daemon, `plc` for us.
fn socat(dir: &Path) -> Link {
    // Links a killed `socat` left may name another test's ptys by now (the kernel gives a
    // freed pty number to the next pty made): they must not pass for this one's.
    for n in ["dev", "plc"] {
        let _ = std::fs::remove_file(dir.join(n));
    }
    let link = |n: &str| format!("pty,raw,echo=0,link={}", dir.join(n).display());
    let c = Command::new("socat")
        .args([link("dev"), link("plc")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("socat (Debian package socat; scripts/setup.sh installs it)");
    let until = Instant::now() + Duration::from_secs(10);
    while !(dir.join("dev").exists() && dir.join("plc").exists()) {
        assert!(Instant::now() < until, "socat made no links");
        std::thread::sleep(Duration::from_millis(20));
    }
    Link(Some(c))
}

/// A running `socat` link; unplugged when dropped, so a failing test leaves no `socat`
/// behind holding its ptys.
struct Link(Option<Child>);

impl Link {
    /// The link goes as an unplugged adapter's node does: `socat` removes its links as it
    /// closes its ptys (SIGTERM). A SIGKILL would leave them naming pty numbers that other
    /// tests' ptys take next, and the daemon, reopening its path, would serve one of those
    /// (`a_port_whose_path_names_another_device_follows_it` is that case).
    fn unplug(&mut self) {
        // Taken out first: once waited for, its pid may be another process's.
        if let Some(mut c) = self.0.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = c.wait();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.unplug();
    }
}

/// A line exchange on the `plc` link (opened for this exchange only): the first line back,
/// within `T`. A lost request or answer fails the test, naming where the links point, instead
/// of hanging it.
fn ask_link(d: &Daemon, dir: &Path, cmd: &str) -> String {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking: a read that another reader of the same pty beat to the bytes must not
    // block past the deadline.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(dir.join("plc"))
        .unwrap();
    f.write_all(format!("{cmd}\r\n").as_bytes()).unwrap();
    let until = Instant::now() + T;
    let mut got = Vec::new();
    loop {
        if let Some(i) = got.iter().position(|&b| b == b'\n') {
            return String::from_utf8_lossy(&got[..i]).trim_end().to_owned();
        }
        let left = until.saturating_duration_since(Instant::now());
        let target = |n: &str| std::fs::read_link(dir.join(n)).ok();
        assert!(
            !left.is_zero(),
            "no answer to {cmd:?} within {T:?} (dev -> {:?}, plc -> {:?}; got {:?})\n{}",
            target("dev"),
            target("plc"),
            String::from_utf8_lossy(&got),
            d.log_text()
        );
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(ms)).unwrap_or(0) > 0 {
            let mut buf = [0u8; 1024];
            match f.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Ok(0) | Err(_) => panic!(
                    "the plc link closed while {cmd:?} waited for its answer\n{}",
                    d.log_text()
                ),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }
}

/// The device's retained status (null when none came within 10 s).
fn status(broker: u16, device: &str) -> serde_json::Value {
    let sub = subscribe(broker, &format!("edgellm/{device}/status"), 1, 10);
    collect(sub)
        .first()
        .and_then(|(_, p)| serde_json::from_str(p).ok())
        .unwrap_or_default()
}

/// The retained status's first serial port.
fn port_status(broker: u16, device: &str) -> serde_json::Value {
    let v = status(broker, device);
    assert!(!v.is_null(), "no retained status of {device}");
    v["serial"][0].clone()
}

/// `socat`'s link in `dir` and `edgellm serve` as `device` with its `dev` end as a line-mode
/// port at `baud`, once the port is open.
fn serve_link(dir: &Path, broker: u16, device: &str, baud: u32) -> (Link, Daemon) {
    serve_link_with(dir, broker, device, baud, &[])
}

/// [`serve_link`] with more environment for the daemon.
fn serve_link_with(
    dir: &Path,
    broker: u16,
    device: &str,
    baud: u32,
    env: &[(&str, &str)],
) -> (Link, Daemon) {
    let link = socat(dir);
    let m = model_arg(&common::model_path("q4_0"));
    let dev = format!("{}:{baud}:line", dir.join("dev").display());
    let b = format!("127.0.0.1:{broker}");
    let d = Daemon::start(
        &[
            "-m", &m, "--mqtt", &b, "--device", device, "--serial", &dev, "-c", "256",
        ],
        &[&[("EDGELLM_LOG", "info")], env].concat(),
    );
    d.wait_log(T, |l| l.contains("serial port open"));
    (link, d)
}

#[test]
fn a_port_that_vanishes_is_reopened_and_its_state_is_in_the_status() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut link, mut d) = serve_link(dir.path(), broker.port, "sp1", 9600);
    assert_eq!(ask_link(&d, dir.path(), "PING"), "OK PONG");
    let s = port_status(broker.port, "sp1");
    assert_eq!(s["state"], "open", "{s}");
    assert_eq!(s["mode"], "line");

    // The other end goes away: the daemon sees the hang-up, says so, and keeps trying.
    link.unplug();
    let log = d.wait_log(T, |l| l.contains("serial port lost"));
    assert!(log.contains("serial port lost, reopening"), "{log}");
    let until = Instant::now() + T;
    let s = loop {
        let s = port_status(broker.port, "sp1");
        if s["state"] == "reopening" || Instant::now() > until {
            break s;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(s["state"], "reopening", "{s}");
    assert!(
        s["last_error"].as_str().is_some_and(|e| !e.is_empty()),
        "{s}"
    );

    // It comes back under the same path: reopened, and it answers.
    let mut link = socat(dir.path());
    let log = d.wait_log(T, |l| l.matches("serial port open").count() >= 2);
    assert_eq!(log.matches("serial port open").count(), 2, "{log}");
    assert_eq!(ask_link(&d, dir.path(), "PING"), "OK PONG");
    let s = port_status(broker.port, "sp1");
    assert_eq!(
        (s["state"].as_str(), s["reopens"].as_u64()),
        (Some("open"), Some(1)),
        "{s}"
    );
    assert!(d.is_running());
    d.terminate(Duration::from_secs(20));
    link.unplug();
}

#[test]
fn a_port_that_vanishes_mid_answer_gets_the_whole_answer_once_it_is_back() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    // Every answer starts 1.5 s late (the test hook), so the line goes while it is being made:
    // 64 tokens alone take ~0.25 s here, and the answer could be out before the cut.
    let (mut link, mut d) = serve_link_with(
        dir.path(),
        broker.port,
        "sp2",
        115200,
        &[("EDGELLM_TEST_HOOK", "stall_ms=1500")],
    );
    assert_eq!(
        ask_link(&d, dir.path(), "SET max_tokens=64"),
        "OK max_tokens=64"
    );
    let ask = "GEN Write a long story about a robot who learns to paint.";

    // The answer is being made when the line goes (an adapter pulled mid-answer).
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("plc"))
            .unwrap();
        f.write_all(format!("{ask}\r\n").as_bytes()).unwrap();
    }
    let until = Instant::now() + T;
    loop {
        if status(broker.port, "sp2")["running"].is_string() {
            break;
        }
        assert!(Instant::now() < until, "never running\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    link.unplug();
    d.wait_log(T, |l| l.contains("serial port lost"));

    // Back under the same path: the answer comes whole, as the first line, and is the one
    // the same question gets on a line that stays up (greedy).
    let mut link = socat(dir.path());
    let plc = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("plc"))
        .unwrap();
    // A lost answer fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = String::new();
        let _ = BufReader::new(plc).read_line(&mut first);
        let _ = tx.send(first);
    });
    let first = rx
        .recv_timeout(T)
        .unwrap_or_else(|_| panic!("no answer after the reopen\n{}", d.log_text()));
    let log = d.log_text();
    assert!(log.matches("serial port open").count() >= 2, "{log}");
    assert!(first.starts_with("OK "), "{first:?}");
    let again = ask_link(&d, dir.path(), ask);
    assert_eq!(first.trim_end(), again, "the answer across the cut differs");
    assert!(again.len() > 40, "{again}");
    let s = port_status(broker.port, "sp2");
    assert_eq!(
        (s["state"].as_str(), s["reopens"].as_u64()),
        (Some("open"), Some(1)),
        "{s}"
    );
    d.terminate(Duration::from_secs(20));
    link.unplug();
}

#[test]
fn a_ping_sent_the_moment_the_port_is_back_is_answered() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut link, mut d) = serve_link(dir.path(), broker.port, "sp3", 9600);
    assert_eq!(ask_link(&d, dir.path(), "PING"), "OK PONG");
    // A PLC that writes as soon as its line is back, before the daemon has reopened it (the
    // daemon is between retries): the request waits in the pty and must be read, not
    // discarded with the bytes of before the reopen. Each round where the daemon was quicker
    // than the write proves nothing, so the port goes again, up to five times.
    let count = |l: &str, what: &str| l.matches(what).count();
    let opens = |l: &str| count(l, "serial port open");
    for round in 1.. {
        let failed = count(&d.log_text(), "serial port not available");
        link.unplug();
        // Its first retry found no port: it waits out its backoff now.
        let log = d.wait_log(T, |l| count(l, "serial port not available") > failed);
        let before = opens(&log);
        link = socat(dir.path());
        let ahead = opens(&d.log_text()) == before;
        assert_eq!(ask_link(&d, dir.path(), "PING"), "OK PONG", "round {round}");
        if ahead || round == 5 {
            assert!(
                ahead,
                "the daemon reopened before every write\n{}",
                d.log_text()
            );
            break;
        }
        d.wait_log(T, |l| opens(l) > before);
    }
    assert!(d.is_running());
    d.terminate(Duration::from_secs(20));
    link.unplug();
}

#[test]
fn a_port_whose_path_names_another_device_follows_it() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut link, mut d) = serve_link(dir.path(), broker.port, "sp4", 9600);
    assert_eq!(ask_link(&d, dir.path(), "PING"), "OK PONG");
    // The path is pointed at another tty while the first is still up, as a link left by a
    // dead `socat` or adapter is pointed at the real port when it comes back, after the
    // daemon reopened it onto whatever tty had taken its old number: the daemon must go to
    // what the path names now, and find the request its PLC sent meanwhile.
    let mut p = Pty::open();
    let tmp = dir.path().join("dev.new");
    std::os::unix::fs::symlink(&p.path, &tmp).unwrap();
    std::fs::rename(&tmp, dir.path().join("dev")).unwrap();
    let answer = p.ask("PING", T);
    let log = d.log_text();
    assert_eq!(answer, "OK PONG", "{log}");
    assert!(log.contains("now names another device"), "{log}");
    assert!(
        log.contains(&format!("device={}", p.path)),
        "the new device is in the log: {log}"
    );
    // Again as `socat` makes its link (removed, then made anew), not renamed over.
    let mut q = Pty::open();
    std::fs::remove_file(dir.path().join("dev")).unwrap();
    std::os::unix::fs::symlink(&q.path, dir.path().join("dev")).unwrap();
    let answer = q.ask("PING", T);
    let log = d.log_text();
    assert_eq!(answer, "OK PONG", "{log}");
    assert!(log.contains(&format!("device={}", q.path)), "{log}");
    let s = port_status(broker.port, "sp4");
    assert_eq!(
        (s["state"].as_str(), s["reopens"].as_u64()),
        (Some("open"), Some(2)),
        "{s}"
    );
    assert!(d.is_running());
    d.terminate(Duration::from_secs(20));
    link.unplug();
}

#[test]
fn two_ports_and_an_mqtt_load_share_the_queue_fairly() {
    let broker = Mosquitto::start();
    let (mut a, mut b) = (Pty::open(), Pty::open());
    let m = model_arg(&common::model_path("q4_0"));
    let pa = format!("{}:115200:line", a.path);
    let pb = format!("{}:115200:line", b.path);
    let url = format!("127.0.0.1:{}", broker.port);
    // One answer at a time: the load waits in the queue, where fairness decides who is next
    // (batched, four of the six would be answered at once and only two wait).
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(&conf, "[model]\nmax_batch = 1\n").unwrap();
    let c = conf.to_str().unwrap();
    let mut d = Daemon::start(
        &[
            "--config", c, "-m", &m, "--mqtt", &url, "--device", "fair", "--serial", &pa,
            "--serial", &pb, "-c", "256", "-t", "2",
        ],
        &[("EDGELLM_LOG", "info")],
    );
    d.wait_log(T, |l| l.matches("serial port open").count() >= 2);
    assert_eq!(a.ask("PING", T), "OK PONG");
    assert_eq!(b.ask("PING", T), "OK PONG");
    assert_eq!(a.ask("SET max_tokens=16", T), "OK max_tokens=16");
    assert_eq!(b.ask("SET max_tokens=16", T), "OK max_tokens=16");

    // One MQTT client queues six requests at once; then each port asks one question.
    let mut load = Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args([
            "ask",
            "--broker",
            &url,
            "--device",
            "fair",
            "--timeout",
            "120",
            "--repeat",
            "6",
            "--concurrency",
            "6",
            "--json",
            // Long answers (no early end token), so the load outlasts the serial answers by
            // seconds, not by a few short replies' worth of milliseconds (which a loaded CI
            // machine once lost).
            "-n",
            "64",
            "Write a long story about a robot who learns to paint.",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the queue holds the load (the status counts what was accepted).
    let until = Instant::now() + T;
    loop {
        let v = status(broker.port, "fair");
        if v["queue_depth"].as_u64().unwrap_or(0) >= 3 {
            break;
        }
        assert!(Instant::now() < until, "the load never queued: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    a.send(b"GEN Red is\r\n");
    b.send(b"GEN Blue is\r\n");
    let ra = a.line(T).expect("port a's answer");
    let rb = b.line(T).expect("port b's answer");
    assert!(
        ra.starts_with("OK ") && rb.starts_with("OK "),
        "{ra} / {rb}"
    );
    // Fair: each port was served before the MQTT client's six were all answered.
    assert!(
        load.try_wait().unwrap().is_none(),
        "the serial requests waited behind the whole MQTT load"
    );
    let out = load.wait_with_output().unwrap();
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["ok"], 6, "{s}");
    d.terminate(Duration::from_secs(20));
}

#[test]
fn rs485_mode_on_a_pty_is_reported_once_and_the_port_still_serves() {
    let mut p = Pty::open();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(
        &conf,
        format!(
            "[mqtt]\nbroker = \"off\"\n[[serial]]\npath = \"{}\"\nbaud = 19200\nparity = \"even\"\n\
             stop_bits = 2\nrs485 = true\n",
            p.path
        ),
    )
    .unwrap();
    let m = model_arg(&common::model_path("q4_0"));
    let c = conf.to_str().unwrap();
    let mut d = Daemon::start(
        &["--config", c, "-m", &m, "-c", "256"],
        &[("EDGELLM_LOG", "info")],
    );
    d.wait_log(T, |l| l.contains("serial port open"));
    assert_eq!(p.ask("PING", T), "OK PONG");
    // The line as configured: 19200 baud, 8 data bits, 2 stop bits, raw. (Linux's pty
    // driver clears PARENB and forces CS8 whatever is asked, so parity shows only on a UART.)
    use nix::sys::termios::{BaudRate, ControlFlags as C, LocalFlags as L, cfgetospeed};
    let t = p.termios();
    assert_eq!(cfgetospeed(&t), BaudRate::B19200);
    let c = t.control_flags;
    assert!(
        c.contains(C::CS8 | C::CSTOPB | C::CLOCAL | C::CREAD),
        "{c:?}"
    );
    assert!(!c.contains(C::CRTSCTS), "{c:?}");
    assert!(!t.local_flags.intersects(L::ECHO | L::ICANON), "raw mode");
    let log = d.log_text();
    assert_eq!(
        log.matches("RS-485 direction control is not available on this port")
            .count(),
        1,
        "{log}"
    );
    assert!(log.contains("ENOTTY"), "the reason is named: {log}");
    d.terminate(Duration::from_secs(20));
}
