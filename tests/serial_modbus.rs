//! `edgellm serve` as a Modbus slave, driven by two independent masters: tokio-modbus's client
//! and Debian's `mbpoll`, over a pty pair (RTU, made by `socat`) and over TCP on loopback. The
//! answer read back through the register map must equal `edgellm run`'s for the same greedy
//! prompt; illegal requests get their exception codes; garbage and a port that goes away do
//! not stop the server.

mod common;

use common::mqtt::{Daemon, free_port};
use common::serial::run_text;
use edgellm::serial::modbus::map::{self, registers_to_bytes, text_to_registers};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_modbus::prelude::*;

const PROMPT: &str = "The capital of France is";
const TOKENS: u16 = 12;
/// Every Modbus transaction of a test is bounded by this.
const OP: Duration = Duration::from_secs(5);

fn model() -> String {
    common::model_path("q4_0").to_str().unwrap().to_owned()
}

/// A pty pair joined by `socat`: the daemon opens `a`, the masters `b`. Killed when dropped.
struct Pty {
    child: Child,
    a: PathBuf,
    b: PathBuf,
}

impl Pty {
    fn start(dir: &Path) -> Pty {
        let a = dir.join("a");
        let b = dir.join("b");
        let _ = std::fs::remove_file(&a);
        let _ = std::fs::remove_file(&b);
        let child = Command::new("socat")
            .arg(format!("pty,raw,echo=0,link={}", a.display()))
            .arg(format!("pty,raw,echo=0,link={}", b.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("socat (scripts/setup.sh installs it)");
        let until = Instant::now() + Duration::from_secs(10);
        while !(a.exists() && b.exists()) {
            assert!(Instant::now() < until, "socat made no pty pair");
            std::thread::sleep(Duration::from_millis(20));
        }
        Pty { child, a, b }
    }

    /// Kills socat and removes its links: a link left behind would name a pty number that
    /// another test's pair may get next, and this daemon would open that test's port.
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.a);
        let _ = std::fs::remove_file(&self.b);
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The daemon with one Modbus RTU port on `pty` and Modbus TCP on `tcp`, no MQTT.
fn serve(dir: &Path, pty: &Path, tcp: u16) -> Daemon {
    serve_with(dir, pty, tcp, &[])
}

/// As [`serve`], with `env` in the daemon's environment.
fn serve_with(dir: &Path, pty: &Path, tcp: u16, env: &[(&str, &str)]) -> Daemon {
    let cfg = dir.join("edgellm.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[serial]]\npath = \"{}\"\nmode = \"modbus\"\nunit_id = 7\n\n[modbus]\ntcp = \"127.0.0.1:{tcp}\"\nunit_id = 7\n",
            pty.display()
        ),
    )
    .unwrap();
    start(&cfg, env)
}

/// The daemon on configuration file `cfg`, no MQTT, SmolLM2, a context of 512, one thread.
fn start(cfg: &Path, env: &[(&str, &str)]) -> Daemon {
    let (m, c) = (model(), cfg.to_str().unwrap().to_owned());
    Daemon::start(
        &[
            "--config", &c, "--model", &m, "--mqtt", "off", "--ctx", "512", "-t", "1",
        ],
        env,
    )
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn rtu_master(path: &Path, unit: u8) -> client::Context {
    let port =
        tokio_serial::SerialStream::open(&tokio_serial::new(path.to_string_lossy(), 115_200))
            .expect("open the master's end of the pty");
    rtu::attach_slave(port, Slave(unit))
}

async fn tcp_master(port: u16, unit: u8) -> client::Context {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    tokio::time::timeout(OP, tcp::connect_slave(addr, Slave(unit)))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// One transaction, bounded: the inner result is the slave's answer or its exception.
async fn op<T, F: std::future::Future<Output = tokio_modbus::Result<T>>>(
    f: F,
) -> Result<T, ExceptionCode> {
    tokio::time::timeout(OP, f)
        .await
        .expect("the slave answers in time")
        .expect("no transport error")
}

/// Writes the prompt and parameters, the sequence last, waits for done, reads the answer
/// page by page with FC23.
async fn ask(ctx: &mut client::Context, prompt: &str, n: u16, seq: u16) -> String {
    let regs = text_to_registers(prompt);
    for (i, c) in regs.chunks(map::MAX_WRITE).enumerate() {
        op(ctx.write_multiple_registers(map::PROMPT + (i * map::MAX_WRITE) as u16, c))
            .await
            .unwrap();
    }
    op(ctx.write_multiple_registers(map::PROMPT_LEN, &[prompt.len() as u16, n]))
        .await
        .unwrap();
    op(ctx.write_single_register(map::REQUEST_SEQ, seq))
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let s = op(ctx.read_input_registers(map::STATUS, 3)).await.unwrap();
        if s[2] == seq && s[0] >= map::Status::Done as u16 {
            break s;
        }
        assert!(Instant::now() < until, "no answer in time: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status[0], map::Status::Done as u16, "status {status:?}");
    let info = op(ctx.read_holding_registers(map::ANSWER_LEN, 3))
        .await
        .unwrap();
    let len = ((info[0] as usize) << 16) | info[1] as usize;
    let mut bytes = Vec::new();
    for p in 0..info[2] {
        let page = op(ctx.read_write_multiple_registers(
            map::ANSWER_PAGE,
            map::PAGE_REGS,
            map::PAGE_SELECT,
            &[p],
        ))
        .await
        .unwrap();
        bytes.extend(registers_to_bytes(&page));
    }
    bytes.truncate(len);
    String::from_utf8(bytes).unwrap()
}

#[test]
fn tokio_modbus_masters_over_rtu_and_tcp_read_back_what_edgellm_run_answers() {
    let dir = tempfile::tempdir().unwrap();
    let pty = Pty::start(dir.path());
    let tcp = free_port();
    let _d = serve(dir.path(), &pty.a, tcp);
    let want = run_text(PROMPT, TOKENS as usize, 512);
    assert!(!want.is_empty());
    rt().block_on(async {
        let mut rtu = rtu_master(&pty.b, 7).await;
        assert_eq!(ask(&mut rtu, PROMPT, TOKENS, 1).await, want, "over RTU");
        let mut tcp = tcp_master(tcp, 7).await;
        assert_eq!(ask(&mut tcp, PROMPT, TOKENS, 1).await, want, "over TCP");
        // The model and version by FC43/14.
        let id = op(tcp.read_device_identification(ReadCode::Basic, 0))
            .await
            .unwrap();
        let names: Vec<String> = id
            .device_id_objects
            .iter()
            .map(|o| String::from_utf8_lossy(&o.value).into_owned())
            .collect();
        assert_eq!(names[0], "edgellm");
        assert!(names[1].contains("135"), "model name: {names:?}");
        assert_eq!(names[2], env!("CARGO_PKG_VERSION"));
        // The heartbeat counts while the appliance works.
        let before = op(tcp.read_input_registers(map::HEARTBEAT, 1))
            .await
            .unwrap()[0];
        tokio::time::sleep(Duration::from_millis(2200)).await;
        let after = op(tcp.read_input_registers(map::HEARTBEAT, 1))
            .await
            .unwrap()[0];
        assert!(
            after.wrapping_sub(before) >= 1,
            "heartbeat {before} then {after}"
        );
    });
}

/// `mbpoll ARGS`, bounded: its stdout.
fn mbpoll(args: &[&str]) -> String {
    let child = Command::new("timeout")
        .arg("20")
        .arg("mbpoll")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mbpoll (scripts/setup.sh installs it)");
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mbpoll {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The values of mbpoll's `[addr]: value` lines, in order.
fn mbpoll_values(out: &str) -> Vec<u16> {
    out.lines()
        .filter_map(|l| l.trim().strip_prefix('[')?.split_once("]:"))
        .map(|(_, v)| v.trim().parse::<i64>().unwrap() as u16)
        .collect()
}

/// The whole exchange with mbpoll: `target` is the connection's options and the device or
/// host, which mbpoll wants before the values.
fn ask_with_mbpoll(target: &[&str], prompt: &str, n: u16, seq: u16) -> String {
    let write = |addr: u16, values: &[u16]| {
        let r = addr.to_string();
        let vals: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let mut a: Vec<&str> = vec!["-0", "-1", "-o", "5", "-t", "4", "-r", &r];
        a.extend_from_slice(target);
        a.extend(vals.iter().map(String::as_str));
        mbpoll(&a);
    };
    let read = |addr: u16, count: u16| {
        let r = addr.to_string();
        let c = count.to_string();
        let mut a: Vec<&str> = vec!["-0", "-1", "-o", "5", "-t", "3", "-r", &r, "-c", &c];
        a.extend_from_slice(target);
        mbpoll_values(&mbpoll(&a))
    };
    let regs = text_to_registers(prompt);
    for (i, c) in regs.chunks(map::MAX_WRITE).enumerate() {
        write(map::PROMPT + (i * map::MAX_WRITE) as u16, c);
    }
    write(map::PROMPT_LEN, &[prompt.len() as u16, n]);
    write(map::REQUEST_SEQ, &[seq]);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let s = read(map::STATUS, 3);
        if s[2] == seq && s[0] >= map::Status::Done as u16 {
            assert_eq!(s[0], map::Status::Done as u16, "status {s:?}");
            break;
        }
        assert!(Instant::now() < until, "no answer in time: {s:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = read(map::ANSWER_LEN, 3);
    let len = ((info[0] as usize) << 16) | info[1] as usize;
    let mut bytes = Vec::new();
    for p in 0..info[2] {
        write(map::PAGE_SELECT, &[p]);
        bytes.extend(registers_to_bytes(&read(map::ANSWER_PAGE, map::PAGE_REGS)));
    }
    bytes.truncate(len);
    String::from_utf8(bytes).unwrap()
}

#[test]
fn mbpoll_over_rtu_and_tcp_reads_back_what_edgellm_run_answers() {
    let dir = tempfile::tempdir().unwrap();
    let pty = Pty::start(dir.path());
    let tcp = free_port();
    let _d = serve(dir.path(), &pty.a, tcp);
    let want = run_text(PROMPT, TOKENS as usize, 512);
    let b = pty.b.to_str().unwrap();
    let rtu = ["-m", "rtu", "-a", "7", "-b", "115200", "-P", "none", b];
    assert_eq!(ask_with_mbpoll(&rtu, PROMPT, TOKENS, 11), want, "over RTU");
    let port = tcp.to_string();
    let tcp = ["-m", "tcp", "-a", "7", "-p", &port, "127.0.0.1"];
    assert_eq!(ask_with_mbpoll(&tcp, PROMPT, TOKENS, 12), want, "over TCP");
}

#[test]
fn illegal_functions_addresses_values_and_a_second_request_get_their_exception_codes() {
    let dir = tempfile::tempdir().unwrap();
    let pty = Pty::start(dir.path());
    let tcp = free_port();
    let _d = serve(dir.path(), &pty.a, tcp);
    rt().block_on(async {
        let mut m = rtu_master(&pty.b, 7).await;
        assert_eq!(
            op(m.read_coils(0, 1)).await.unwrap_err(),
            ExceptionCode::IllegalFunction
        );
        assert_eq!(
            op(m.read_holding_registers(158, 1)).await.unwrap_err(),
            ExceptionCode::IllegalDataAddress
        );
        assert_eq!(
            op(m.write_single_register(map::STATUS, 1))
                .await
                .unwrap_err(),
            ExceptionCode::IllegalDataAddress
        );
        assert_eq!(
            op(m.write_single_register(map::MODE, 4)).await.unwrap_err(),
            ExceptionCode::IllegalDataValue
        );
        // No prompt yet: the service refuses it, and the status says so.
        op(m.write_single_register(map::REQUEST_SEQ, 9))
            .await
            .unwrap();
        assert_eq!(
            op(m.read_input_registers(map::STATUS, 3)).await.unwrap(),
            [map::Status::Error as u16, 1, 9],
            "an empty prompt is bad_request"
        );
        // A long answer, then a second request while it runs: busy.
        let regs = text_to_registers(PROMPT);
        op(m.write_multiple_registers(map::PROMPT, &regs))
            .await
            .unwrap();
        op(m.write_multiple_registers(map::PROMPT_LEN, &[PROMPT.len() as u16, 400]))
            .await
            .unwrap();
        op(m.write_single_register(map::REQUEST_SEQ, 1))
            .await
            .unwrap();
        assert_eq!(
            op(m.write_single_register(map::REQUEST_SEQ, 2))
                .await
                .unwrap_err(),
            ExceptionCode::ServerDeviceBusy
        );
        // The retry of the accepted write is acknowledged and runs nothing twice.
        op(m.write_single_register(map::REQUEST_SEQ, 1))
            .await
            .unwrap();
        op(m.write_single_register(map::CANCEL, 1)).await.unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let s = op(m.read_input_registers(map::STATUS, 9)).await.unwrap();
            // Cancelled while running: done, finish reason 4; before the worker took it:
            // error, code 6. Either is the cancel.
            if s[0] >= map::Status::Done as u16 {
                let running =
                    s[0] == map::Status::Done as u16 && s[map::FINISH_REASON as usize] == 4;
                let queued = s[0] == map::Status::Error as u16 && s[map::ERROR_CODE as usize] == 6;
                assert!(running || queued, "not cancelled: {s:?}");
                break;
            }
            assert!(Instant::now() < until, "the cancel did not end it: {s:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // Another unit id on the RTU bus: no reply at all.
        drop(m);
        let mut other = rtu_master(&pty.b, 8).await;
        let r =
            tokio::time::timeout(Duration::from_secs(2), other.read_holding_registers(0, 1)).await;
        assert!(r.is_err(), "unit 8 must get silence, got {r:?}");
        drop(other);
        // On TCP another unit id is told so at once; 0xFF is served.
        let mut t = tcp_master(tcp, 9).await;
        assert_eq!(
            op(t.read_holding_registers(0, 1)).await.unwrap_err(),
            ExceptionCode::GatewayTargetDevice
        );
        let mut t = tcp_master(tcp, 0xFF).await;
        assert_eq!(
            op(t.read_holding_registers(map::MAP_VERSION, 1))
                .await
                .unwrap(),
            vec![map::VERSION]
        );
    });
}

/// An MBAP frame to unit 7: transaction `tid`, the PDU `pdu`.
fn mbap(tid: u16, pdu: &[u8]) -> Vec<u8> {
    let mut f = tid.to_be_bytes().to_vec();
    f.extend([0, 0]);
    f.extend(((pdu.len() + 1) as u16).to_be_bytes());
    f.push(7);
    f.extend_from_slice(pdu);
    f
}

/// Registers 29–31 are unmapped, as the map says; a 124-register FC16 over TCP (one over the
/// protocol's 123: tokio-modbus's own master will not even encode it) is answered 0x03 and the
/// connection goes on; the RTU and the TCP mailbox give their requests ids of their own.
#[test]
fn unmapped_registers_an_oversized_write_and_the_request_ids_of_each_mailbox() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let pty = Pty::start(dir.path());
    let tcp = free_port();
    let d = serve_with(dir.path(), &pty.a, tcp, &[("EDGELLM_LOG", "info")]);
    rt().block_on(async {
        let mut rtu = rtu_master(&pty.b, 7).await;
        let mut t = tcp_master(tcp, 7).await;
        for m in [&mut rtu, &mut t] {
            for (addr, n) in [(29, 1), (31, 1), (28, 2), (0, 32), (0, 125)] {
                assert_eq!(
                    op(m.read_holding_registers(addr, n)).await.unwrap_err(),
                    ExceptionCode::IllegalDataAddress,
                    "{n} from {addr}"
                );
            }
            assert_eq!(op(m.read_input_registers(0, 29)).await.unwrap().len(), 29);
        }
        // One request on each mailbox.
        ask(&mut rtu, PROMPT, 2, 1).await;
        ask(&mut t, PROMPT, 2, 1).await;
    });

    let mut s = std::net::TcpStream::connect(("127.0.0.1", tcp)).unwrap();
    s.set_read_timeout(Some(OP)).unwrap();
    let mut pdu = vec![0x10, 0x01, 0x00, 0x00, 124, 248];
    pdu.extend(std::iter::repeat_n(0x41, 248));
    s.write_all(&mbap(0x1234, &pdu)).unwrap();
    let mut reply = [0u8; 9];
    s.read_exact(&mut reply)
        .expect("an answer, not a closed connection");
    assert_eq!(reply, [0x12, 0x34, 0, 0, 0, 3, 7, 0x90, 0x03]);
    // The same connection goes on: MAP_VERSION.
    s.write_all(&mbap(0x1235, &[0x03, 0x00, 0x0A, 0x00, 0x01]))
        .unwrap();
    let mut reply = [0u8; 11];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply, [0x12, 0x35, 0, 0, 0, 5, 7, 0x03, 2, 0, 2]);

    let log = d.wait_log(Duration::from_secs(10), |l| {
        l.matches("Modbus request").count() >= 2
    });
    let ids: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Modbus request"))
        .filter_map(|l| l.split(" id=").nth(1)?.split_whitespace().next())
        .collect();
    assert_eq!(ids.len(), 2, "{log}");
    assert_ne!(ids[0], ids[1], "{log}");
    // The RTU port is `<temporary directory>/a`.
    assert!(
        ids[0].starts_with("modbus-tmp-") && ids[0].contains("-a-"),
        "{ids:?}"
    );
    assert!(ids[1].starts_with("modbus-tcp-"), "{ids:?}");
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Reads MAP_VERSION until the slave answers (garbage may still be draining), bounded.
async fn answers(path: &Path, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(port) =
            tokio_serial::SerialStream::open(&tokio_serial::new(path.to_string_lossy(), 115_200))
        {
            let mut m = rtu::attach_slave(port, Slave(7));
            if let Ok(Ok(Ok(v))) = tokio::time::timeout(
                Duration::from_secs(1),
                m.read_holding_registers(map::MAP_VERSION, 1),
            )
            .await
                && v == vec![map::VERSION]
            {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[test]
fn a_megabyte_of_random_bytes_leaves_memory_flat_and_the_port_answering() {
    let dir = tempfile::tempdir().unwrap();
    let pty = Pty::start(dir.path());
    let d = serve(dir.path(), &pty.a, free_port());
    let pid = d.child.id();
    rt().block_on(async {
        assert!(answers(&pty.b, Duration::from_secs(10)).await);
    });
    let before = rss_kib(pid);
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking: a daemon that stops reading fills the pty, and the test must fail in
        // bounded time rather than hang in write().
        let mut port = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&pty.b)
            .unwrap();
        // The same megabyte every run.
        let mut noise = common::serial::Noise(0x9E37_79B9_7F4A_7C15);
        let mut chunk = vec![0u8; 4096];
        let until = Instant::now() + Duration::from_secs(60);
        for _ in 0..256 {
            noise.fill(&mut chunk, &[], 0);
            let mut rest = &chunk[..];
            while !rest.is_empty() {
                match port.write(rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        assert!(
                            Instant::now() < until,
                            "the daemon stopped reading the port\n{}",
                            d.log_text()
                        );
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => panic!("writing the garbage: {e}"),
                }
            }
        }
    }
    rt().block_on(async {
        assert!(
            answers(&pty.b, Duration::from_secs(30)).await,
            "the port does not answer after the garbage\n{}",
            d.log_text()
        );
    });
    let after = rss_kib(pid);
    assert!(
        after < before + 2048,
        "RSS grew from {before} KiB to {after} KiB"
    );
}

#[test]
fn a_port_that_goes_away_and_comes_back_is_served_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut pty = Pty::start(dir.path());
    let d = serve(dir.path(), &pty.a, free_port());
    rt().block_on(async {
        assert!(answers(&pty.b, Duration::from_secs(10)).await);
    });
    pty.stop();
    std::thread::sleep(Duration::from_millis(700));
    let pty = Pty::start(dir.path());
    rt().block_on(async {
        assert!(
            answers(&pty.b, Duration::from_secs(20)).await,
            "not served after the port came back\n{}",
            d.log_text()
        );
    });
    assert!(
        d.log_text().contains("reopening"),
        "the daemon did not see the port go: {}",
        d.log_text()
    );
}

#[test]
fn a_taken_modbus_tcp_address_fails_the_start_and_says_why() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let m = model();
    let mut d = Daemon::spawn(
        &[
            "--model",
            &m,
            "--mqtt",
            "off",
            "--ctx",
            "512",
            "-t",
            "1",
            "--modbus-tcp",
            &addr,
        ],
        &[],
    );
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = d.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "the daemon started on a taken address"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let log = d.log_text();
    assert!(
        log.contains(&format!("Modbus TCP: cannot listen on {addr}")),
        "{log}"
    );
}

/// Modbus TCP on a socket systemd bound (`edgellm-modbus.socket`: port 502 under a unit
/// without capabilities), started as systemd does it: `systemd-socket-activate` listens, the
/// first master's connection starts the daemon, which takes the socket named `modbus` (no
/// `modbus.tcp` in its configuration) and answers that master, then a second one.
#[test]
fn a_socket_systemd_passes_serves_modbus_tcp_without_modbus_tcp_configured() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("daemon.log");
    let m = model();
    let mut activator = Command::new("systemd-socket-activate")
        .args(["-l", &format!("127.0.0.1:{port}"), "--fdname=modbus"])
        .arg(env!("CARGO_BIN_EXE_edgellm"))
        .args([
            "serve", "--model", &m, "--mqtt", "off", "--ctx", "512", "-t", "1",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("systemd-socket-activate (Debian's systemd package)");
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    // Listening before the daemon exists: wait for the activator's socket.
    let until = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < until,
            "systemd-socket-activate does not listen"
        );
        assert!(
            activator.try_wait().unwrap().is_none(),
            "the activator exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut activator = Kill(activator);
    let want = run_text(PROMPT, TOKENS as usize, 512);
    rt().block_on(async {
        for seq in [21, 22] {
            let mut ctx = tcp_master(port, 1).await;
            assert_eq!(
                ask(&mut ctx, PROMPT, TOKENS, seq).await,
                want,
                "request {seq}"
            );
        }
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("Modbus TCP on the socket systemd passed"),
        "{text}"
    );
    assert!(activator.0.try_wait().unwrap().is_none(), "{text}");
}

/// `rs485 = true` reaches Modbus RTU ports too: the kernel's RS-485 mode is asked for when
/// the port opens, and a port without it (here a pty: ENOTTY) is said once and still served.
#[test]
fn rs485_on_a_modbus_rtu_port_is_asked_for_and_a_pty_is_reported_once_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let pty = Pty::start(dir.path());
    let cfg = dir.path().join("edgellm.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[serial]]\npath = \"{}\"\nmode = \"modbus\"\nunit_id = 7\nrs485 = true\n",
            pty.a.display()
        ),
    )
    .unwrap();
    let m = model();
    let c = cfg.to_str().unwrap().to_owned();
    let d = Daemon::start(
        &[
            "--config", &c, "--model", &m, "--mqtt", "off", "--ctx", "512", "-t", "1",
        ],
        &[("EDGELLM_LOG", "info")],
    );
    d.wait_log(Duration::from_secs(30), |l| {
        l.contains("Modbus RTU serving")
    });
    let status = rt().block_on(async {
        let mut ctx = rtu_master(&pty.b, 7).await;
        op(ctx.read_input_registers(map::STATUS, 3)).await
    });
    assert!(status.is_ok(), "the port serves: {status:?}");
    let log = d.log_text();
    let note = "RS-485 direction control is not available on this port";
    assert_eq!(log.matches(note).count(), 1, "{log}");
    assert!(log.contains("ENOTTY"), "the reason is named: {log}");
}

#[test]
fn a_session_over_modbus_tcp_remembers_turn_one_in_turn_three_and_mode_2_resets_it() {
    let dir = tempfile::tempdir().unwrap();
    let tcp = common::mqtt::free_port();
    let cfg = dir.path().join("edgellm.toml");
    std::fs::write(
        &cfg,
        format!("[modbus]\ntcp = \"127.0.0.1:{tcp}\"\nunit_id = 7\n"),
    )
    .unwrap();
    let qwen = common::model_path(common::QWEN_05B);
    let (c, m, sd) = (
        cfg.to_str().unwrap(),
        qwen.to_str().unwrap(),
        dir.path().join("state"),
    );
    let s = sd.to_str().unwrap();
    let _d = Daemon::start(
        &[
            "--config",
            c,
            "--model",
            m,
            "--mqtt",
            "off",
            "--ctx",
            "1024",
            "-t",
            "2",
            "--state-dir",
            s,
        ],
        &[],
    );
    let fact = "My name is Ana and I look after pump seven. Please remember my name.";
    let question = "What is my name? Answer with the name only.";
    rt().block_on(async {
        let mut ctx = tcp_master(tcp, 7).await;
        // SESSION 42 (`modbus-42`), MODE 1: chat messages that continue its conversation.
        session_mode(&mut ctx, 1).await;
        ask(&mut ctx, fact, 16, 1).await;
        ask(&mut ctx, "Which planet is the largest?", 16, 2).await;
        let third = ask(&mut ctx, question, 16, 3).await;
        assert!(third.contains("Ana"), "turn 3 forgot turn 1: {third}");
        session_mode(&mut ctx, 3).await;
        let history = ask(&mut ctx, "", 0, 4).await;
        assert!(history.starts_with(&format!("user: {fact}")), "{history}");
        session_mode(&mut ctx, 2).await;
        assert_eq!(ask(&mut ctx, "", 0, 5).await, "");
        session_mode(&mut ctx, 1).await;
        let after = ask(&mut ctx, question, 16, 6).await;
        assert!(!after.contains("Ana"), "MODE 2 kept the name: {after}");
    });
}

/// SESSION 42 and MODE `mode` (adjacent registers, one write).
async fn session_mode(ctx: &mut client::Context, mode: u16) {
    op(ctx.write_multiple_registers(map::SESSION, &[42, mode]))
        .await
        .unwrap();
}

/// The alarm schema, a choice and a reading with a float and a 32-bit integer, selected by
/// `FORMAT` 1, 2 and 3.
fn serve_formats(dir: &Path, pty: &Path, tcp: u16) -> Daemon {
    let alarm = r#"{"type": "object", "properties": {
        "severity": {"type": "integer", "minimum": 0, "maximum": 3},
        "stop_line": {"type": "boolean"},
        "reason": {"enum": ["bearing", "belt", "sensor", "other"]}},
        "required": ["severity", "stop_line", "reason"], "additionalProperties": false}"#;
    let reading = r#"{"type": "object", "properties": {
        "temperature_c": {"type": "number"},
        "count": {"type": "integer"},
        "ok": {"type": "boolean"}},
        "required": ["temperature_c", "count", "ok"], "additionalProperties": false}"#;
    std::fs::write(dir.join("alarm.json"), alarm).unwrap();
    std::fs::write(dir.join("reading.json"), reading).unwrap();
    let cfg = dir.join("edgellm.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[serial]]\npath = \"{}\"\nmode = \"modbus\"\nunit_id = 7\n\n[modbus]\n\
             tcp = \"127.0.0.1:{tcp}\"\nunit_id = 7\nformats = [\"alarm\", \"severity\", \
             \"reading\"]\n\n[schemas]\nalarm = \"alarm.json\"\nreading = \"reading.json\"\n\n\
             [choices]\nseverity = [\"low\", \"medium\", \"high\", \"critical\"]\n",
            pty.display()
        ),
    )
    .unwrap();
    start(&cfg, &[])
}

const SEVERITY: [&str; 4] = ["low", "medium", "high", "critical"];
const REASONS: [&str; 4] = ["bearing", "belt", "sensor", "other"];
const ALARM: &str = "Classify this alarm: bearing temperature high on conveyor 2, line stopped.";

/// A master selects a format by number and reads the answer typed: a choice's index beside
/// its text, a schema's integer, boolean and enum in the typed block (tokio-modbus over TCP),
/// a float and a 32-bit integer in the documented word order (mbpoll over RTU, `-B`); an
/// answer cut short is marked not valid with "no value" everywhere; an unknown format number
/// is refused. `edgellm modbus map --schema` lists the same places.
#[test]
fn typed_answers_are_read_back_as_indices_and_typed_registers_by_both_masters() {
    let dir = tempfile::tempdir().unwrap();
    let pty = Pty::start(dir.path());
    let tcp = free_port();
    let _d = serve_formats(dir.path(), &pty.a, tcp);
    rt().block_on(async {
        let mut t = tcp_master(tcp, 7).await;
        let version = op(t.read_holding_registers(map::MAP_VERSION, 1)).await;
        assert_eq!(version.unwrap(), vec![2]);
        assert_eq!(
            op(t.write_single_register(map::FORMAT, 4))
                .await
                .unwrap_err(),
            ExceptionCode::IllegalDataValue,
            "three formats"
        );
        // Chat mode, the choice list.
        op(t.write_multiple_registers(map::MODE, &[1]))
            .await
            .unwrap();
        op(t.write_single_register(map::FORMAT, 2)).await.unwrap();
        let text = ask(&mut t, ALARM, 16, 1).await;
        let typed = op(t.read_holding_registers(map::VALID, 2)).await.unwrap();
        assert_eq!(typed[0], 1, "valid: {text:?}");
        assert_eq!(
            SEVERITY.get(typed[1] as usize),
            Some(&text.as_str()),
            "{typed:?}"
        );

        // The schema: integer, boolean, enum index, in the schema's order.
        op(t.write_single_register(map::FORMAT, 1)).await.unwrap();
        let text = ask(&mut t, ALARM, 96, 2).await;
        assert_eq!(
            op(t.read_holding_registers(map::VALID, 1)).await.unwrap(),
            [1]
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let regs = op(t.read_holding_registers(map::TYPED, 4)).await.unwrap();
        let reason = REASONS.iter().position(|r| json["reason"] == *r).unwrap();
        let want = [
            json["severity"].as_u64().unwrap() as u16,
            json["stop_line"].as_bool().unwrap() as u16,
            reason as u16,
            0,
        ];
        assert_eq!(regs, want, "{text}");

        // Too few tokens for the shape: finish length, not valid, no values.
        ask(&mut t, ALARM, 3, 3).await;
        let head = op(t.read_holding_registers(map::FINISH_REASON, 1)).await;
        assert_eq!(head.unwrap(), [2], "length");
        assert_eq!(
            op(t.read_holding_registers(map::VALID, 2)).await.unwrap(),
            [2, 0xFFFF]
        );
        let regs = op(t.read_holding_registers(map::TYPED, 3)).await.unwrap();
        assert_eq!(regs, [0xFFFF; 3]);
    });

    // mbpoll over RTU: the reading's float and 32-bit integer, high word first (-B).
    let b = pty.b.to_str().unwrap();
    let rtu = ["-m", "rtu", "-a", "7", "-b", "115200", "-P", "none", b];
    let mut set = vec!["-0", "-1", "-o", "5", "-t", "4", "-r", "26"];
    set.extend_from_slice(&rtu);
    set.push("3");
    mbpoll(&set);
    let text = ask_with_mbpoll(&rtu, "Reading of sensor 4: temperature and count:", 64, 5);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let read = |kind: &str, addr: &str| {
        let mut a = vec![
            "-0", "-1", "-o", "5", "-B", "-t", kind, "-r", addr, "-c", "1",
        ];
        a.extend_from_slice(&rtu);
        let out = mbpoll(&a);
        out.lines()
            .find_map(|l| {
                Some(
                    l.trim()
                        .strip_prefix('[')?
                        .split_once("]:")?
                        .1
                        .trim()
                        .to_owned(),
                )
            })
            .unwrap_or_else(|| panic!("no value in {out}"))
    };
    assert_eq!(read("3", "27"), "1", "valid: {text}");
    let temperature: f32 = read("3:float", "160").parse().unwrap();
    let want = json["temperature_c"].as_f64().unwrap() as f32;
    assert!(
        (temperature - want).abs() <= want.abs() * 1e-5,
        "{temperature} vs {text}"
    );
    let count: i64 = read("3:int", "162").parse().unwrap();
    assert_eq!(count, json["count"].as_i64().unwrap(), "{text}");
    let ok = if json["ok"] == true { "1" } else { "0" };
    assert_eq!(read("3", "164"), ok, "{text}");

    // The CLI names the same places.
    let cfg = dir.path().join("edgellm.toml");
    let c = cfg.to_str().unwrap();
    let out = common::mqtt::edgellm(&["modbus", "map", "--config", c, "--schema", "reading"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.contains("write FORMAT (register 26) = 3"), "{table}");
    for row in [
        "160-161   float32",
        "162-163   int32",
        "164       uint16 (0/1)",
    ] {
        assert!(table.contains(row), "{row:?} not in\n{table}");
    }
}
