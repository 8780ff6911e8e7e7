//! How `edgellm serve` ends when it cannot start, as systemd sees it: a configuration it refuses
//! or a model that does not load exits with 78 (EX_CONFIG), which the unit's
//! `RestartPreventExitStatus=78` keeps from a restart loop; other failures exit with 1 and are
//! restarted. The daemon runs as a real child process.

mod common;

use common::mqtt::{Mosquitto, collect, subscribe};
use std::io::Write;
use std::process::{Command, Output};

fn serve(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .arg("serve")
        .args(["--mqtt", "off"])
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("run edgellm serve")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_model_that_does_not_load_exits_78_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("corrupt.gguf");
    // A GGUF magic and version, then a tensor count far past the file.
    let mut f = std::fs::File::create(&bad).unwrap();
    f.write_all(
        b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f\x00\x00\x00\x00\x00\x00\x00\x00",
    )
    .unwrap();
    drop(f);
    let o = serve(&["--model", bad.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(e.contains("corrupt.gguf"), "names the file: {e}");
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn a_truncated_model_exits_78_and_leaves_the_error_as_the_retained_status() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("truncated.gguf");
    // The real model's first 4 MiB: a valid header whose tensors run past the end of the file.
    let whole = std::fs::read(common::model_path("q4_0")).unwrap();
    std::fs::write(&cut, &whole[..4 << 20]).unwrap();
    let url = format!("127.0.0.1:{}", broker.port);
    let o = Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args(["serve", "--mqtt", &url, "--device", "cut", "--model"])
        .arg(&cut)
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("run edgellm serve");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(e.contains("truncated.gguf"), "names the file: {e}");
    let got = collect(subscribe(broker.port, "edgellm/cut/status", 1, 5));
    let (_, payload) = got
        .first()
        .unwrap_or_else(|| panic!("no retained status: {e}"));
    let v: serde_json::Value = serde_json::from_str(payload).unwrap();
    assert_eq!(v["state"], "error", "{v}");
    let why = v["error"].as_str().unwrap_or_default();
    assert!(why.contains("truncated.gguf"), "{v}");
}

#[test]
fn a_missing_model_exits_78() {
    let o = serve(&["--model", "/nonexistent/edgellm/model.gguf"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(e.contains("/nonexistent/edgellm/model.gguf"), "{e}");
}

#[test]
fn a_refused_configuration_exits_78_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(&conf, "[mqtt]\nqos = 7\n").unwrap();
    let o = serve(&["--config", conf.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(e.contains("qos"), "{e}");
}

#[test]
fn a_usage_error_is_not_a_refused_configuration() {
    // clap's own usage errors keep their exit code (2): a typo on the command line of a unit
    // file is found by `systemd-analyze verify` and by the first start, not hidden as 78.
    let o = serve(&["--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
