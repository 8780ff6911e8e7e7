//! `edgellm serve` against a Mosquitto that authenticates: TLS with certificates the test
//! makes with `openssl` (the broker's, and a client certificate for a broker that wants one),
//! and a password file made with `mosquitto_passwd`. Right credentials answer; wrong ones are
//! named in the log and in systemd's status line, and retried with a growing delay while the
//! daemon keeps running, until a rotated password file lets it in.

mod common;

use common::json_of;
use common::mqtt::{Daemon, Mosquitto};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const DEVICE: &str = "auth-dev";

fn model() -> String {
    common::model_path("q4_0").to_str().unwrap().to_owned()
}

/// Runs `openssl ARGS` in `dir`; it must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `{name}.crt` / `{name}.key` in `dir` (P-256: quick to make, rustls and Mosquitto take it).
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=edgellm test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A certificate `{name}.crt` / `{name}.key` signed by the CA `ca`, with `ext` (a
/// subjectAltName for a server; none for a client).
fn make_cert(dir: &Path, ca: &str, name: &str, ext: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
    // The daemon refuses a key others may read; Mosquitto reads the server's as itself.
    std::fs::set_permissions(
        dir.join(format!("{name}.key")),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
}

/// The broker's CA and certificate (for 127.0.0.1 and localhost), a client certificate from
/// the same CA, and a second CA that signed none of them.
fn certificates() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_ca(d, "ca");
    make_ca(d, "other-ca");
    make_cert(
        d,
        "ca",
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    );
    make_cert(d, "ca", "client", "extendedKeyUsage=clientAuth\n");
    dir
}

/// Started as root, Mosquitto becomes the user `mosquitto` before it reads its key and its
/// password file, which sit in the test's private directory: it stays who it is (a broker
/// started by another user stays that user whatever this says).
const STAY: &str = "user root\n";

/// Mosquitto with a TLS listener on the server certificate.
fn tls_broker(certs: &Path, require_certificate: bool) -> Mosquitto {
    let p = |f: &str| certs.join(f).display().to_string();
    Mosquitto::with_config(&format!(
        "{STAY}allow_anonymous true\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate {}\n",
        p("ca.crt"),
        p("server.crt"),
        p("server.key"),
        require_certificate
    ))
}

/// An edgellm configuration for the broker on `port` with `mqtt` lines added to `[mqtt]` and
/// `tables` after it, in `dir`.
fn config(dir: &Path, name: &str, port: u16, mqtt: &str, tables: &str) -> PathBuf {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(
        &file,
        format!(
            "[model]\nctx = 256\nthreads = 1\n\n[mqtt]\nbroker = \"127.0.0.1:{port}\"\n\
             device = \"{DEVICE}\"\n{mqtt}\n{tables}"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    file
}

/// `edgellm serve --config FILE --model …`, its log without colours (the tests read it).
fn spawn(conf: &Path) -> Daemon {
    let m = model();
    Daemon::spawn(
        &["--config", conf.to_str().unwrap(), "--model", &m],
        &[("NO_COLOR", "1")],
    )
}

fn ask(port: u16, args: &[&str]) -> std::process::Output {
    let mut a = vec!["-n", "4", "--json"];
    a.extend_from_slice(args);
    a.push("Hi");
    common::mqtt::ask(port, DEVICE, &a)
}

/// The daemon said READY=1 and its status line shows no trouble with the broker.
fn ready_and_connected(d: &Daemon) {
    let got = d.wait_notify("READY=1", Duration::from_secs(60));
    assert!(
        got.contains("READY=1") && !got.contains("MQTT:") && !got.contains("not reachable"),
        "{got}\n{}",
        d.log_text()
    );
}

/// The `retry_in_ms` values of the daemon's failed connection attempts, in order.
fn retries(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|l| l.split("retry_in_ms=").nth(1))
        .filter_map(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn over_tls_the_daemon_answers_with_the_brokers_ca_and_names_a_wrong_one() {
    let certs = certificates();
    let c = certs.path();
    let broker = tls_broker(c, false);
    let ca = c.join("ca.crt");
    let other = c.join("other-ca.crt");
    let good = config(
        c,
        "good",
        broker.port,
        "",
        &format!("[mqtt.tls]\nca_file = {:?}\n", ca.display().to_string()),
    );
    let bad = config(
        c,
        "bad",
        broker.port,
        "",
        &format!("[mqtt.tls]\nca_file = {:?}\n", other.display().to_string()),
    );
    let d = spawn(&good);
    let mut wrong = spawn(&bad);
    ready_and_connected(&d);
    let answer = json_of(&ask(broker.port, &["--ca-file", ca.to_str().unwrap()]));
    assert_eq!(answer["done"], true, "{answer}");

    // The daemon trusting another CA says so, in its log and on systemd's status line, and
    // keeps trying.
    let why = "the broker's certificate is not signed by a CA of mqtt.tls.ca_file";
    let log = wrong.wait_log(Duration::from_secs(30), |l| l.contains(why));
    assert!(log.contains(why), "{log}");
    let status = wrong.wait_notify(why, Duration::from_secs(30));
    assert!(status.contains("STATUS=serving"), "{status}");
    assert!(status.contains(why), "{status}");
    assert!(wrong.is_running(), "{log}");

    // `ask` with the wrong CA fails at once, in the same words with its own flag.
    let out = ask(broker.port, &["--ca-file", other.to_str().unwrap()]);
    assert!(!out.status.success());
    let said = "the broker's certificate is not signed by a CA of --ca-file";
    assert!(stderr(&out).contains(said), "{}", stderr(&out));
}

#[test]
fn a_broker_that_wants_a_client_certificate_takes_the_daemons_own() {
    let certs = certificates();
    let c = certs.path();
    let broker = tls_broker(c, true);
    let s = |f: &str| c.join(f).display().to_string();
    let conf = config(
        c,
        "client",
        broker.port,
        "",
        &format!(
            "[mqtt.tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
            s("ca.crt"),
            s("client.crt"),
            s("client.key")
        ),
    );
    let d = spawn(&conf);
    ready_and_connected(&d);
    let (ca, cert, key) = (s("ca.crt"), s("client.crt"), s("client.key"));
    let answer = json_of(&ask(
        broker.port,
        &["--ca-file", &ca, "--cert-file", &cert, "--key-file", &key],
    ));
    assert_eq!(answer["done"], true, "{answer}");

    // Without one, the broker's refusal is named.
    let out = ask(broker.port, &["--ca-file", &ca]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("wants one (--cert-file and --key-file)"),
        "a clear refusal: {}",
        stderr(&out)
    );
}

#[test]
fn a_wrong_password_is_named_in_the_log_and_status_and_retried_with_a_growing_delay() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let passwd = d.join("mosquitto.passwd");
    let st = Command::new("mosquitto_passwd")
        .args(["-b", "-c"])
        .arg(&passwd)
        .args(["edgellm", "s3cret"])
        .status()
        .expect("mosquitto_passwd (Debian package mosquitto)");
    assert!(st.success());
    let broker = Mosquitto::with_config(&format!(
        "{STAY}allow_anonymous false\npassword_file {}\n",
        passwd.display()
    ));
    let secret = |name: &str, pw: &str| {
        let f = d.join(name);
        std::fs::write(&f, format!("{pw}\n")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        f
    };
    let right = secret("right.pw", "s3cret");
    let wrong = secret("wrong.pw", "guess");
    let mqtt = |pw: &Path| {
        format!(
            "username = \"edgellm\"\npassword_file = {:?}\n",
            pw.display().to_string()
        )
    };
    let good = spawn(&config(d, "good", broker.port, &mqtt(&right), ""));
    let mut bad = spawn(&config(d, "bad", broker.port, &mqtt(&wrong), ""));
    ready_and_connected(&good);
    let r = right.to_str().unwrap();
    let answer = json_of(&ask(
        broker.port,
        &["--username", "edgellm", "--password-file", r],
    ));
    assert_eq!(answer["done"], true, "{answer}");

    // Mosquitto answers an MQTT 5 client "not authorized", others "bad user name or
    // password": the line says both.
    let why = "the broker refused the connection: ";
    let bad_pw = |l: &str| l.contains(why) && l.contains("bad user name or password");
    // 250, 500, 1000 ms: three attempts within a few seconds, each waiting longer.
    let log = bad.wait_log(Duration::from_secs(20), |l| retries(l).len() >= 3);
    assert!(log.lines().any(bad_pw), "{log}");
    let waits = retries(&log);
    assert!(waits.len() >= 3, "{log}");
    assert!(waits.windows(2).all(|w| w[0] < w[1]), "{waits:?}\n{log}");
    let status = bad.wait_notify(why, Duration::from_secs(20));
    assert!(status.lines().any(bad_pw), "{status}");
    // Once the start's wait for the broker is over, the warning gives the broker's reason,
    // not a guess that it cannot be reached.
    let warned = |l: &str| l.contains("serving, and retrying");
    let log = bad.wait_log(Duration::from_secs(20), |l| l.lines().any(warned));
    let line = log
        .lines()
        .find(|l| warned(l))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(bad_pw(line) && !line.contains("not reachable"), "{line}");
    assert!(bad.is_running(), "{log}");
    // Neither password ever reaches a log or systemd's status line.
    for text in [&log, &status, &good.log_text()] {
        assert!(
            !text.contains("s3cret") && !text.contains("guess"),
            "a password in the output:\n{text}"
        );
    }

    // `ask` with the wrong password fails at once, with the same words.
    let w = wrong.to_str().unwrap();
    let asked = std::time::Instant::now();
    let out = ask(
        broker.port,
        &["--username", "edgellm", "--password-file", w],
    );
    assert!(!out.status.success());
    assert!(bad_pw(&stderr(&out)), "{}", stderr(&out));
    assert!(stderr(&out).contains("--password-file"), "its own flag");

    // The password file is read again before each attempt: once it holds the right password
    // the daemon connects, without a restart, and its status line is clear again.
    std::fs::write(&wrong, "s3cret\n").unwrap();
    let log = bad.wait_log(Duration::from_secs(40), |l| l.contains("MQTT connected"));
    assert!(log.contains("MQTT connected"), "{log}");
    let clear = |l: &str| l.starts_with("STATUS=serving") && !l.contains("MQTT:");
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let mut status = String::new();
    while !status.lines().any(clear) && std::time::Instant::now() < until {
        status += &bad.wait_notify("STATUS=", Duration::from_secs(1));
    }
    assert!(status.lines().any(clear), "{status}");
    assert!(asked.elapsed() < Duration::from_secs(20), "not at once");
}
