//! The daemon's configuration file: defaults, the example at the repository root, and a
//! refusal naming the key for every kind of mistake a technician makes.

use edgellm::daemon::{
    Broker, Config, ConfigError, Overrides, Parity, Protocol, SerialFlow, SerialMode,
};
use edgellm::kv::KvType;
use edgellm::service::Sessions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The key and the one-line message of a refusal.
fn refused(text: &str) -> (String, String) {
    match text.parse::<Config>() {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "not one line: {msg}");
            assert!(!msg.contains("--"), "names a flag: {msg}");
            (e.key().unwrap_or("").to_owned(), msg)
        }
    }
}

fn assert_refused(text: &str, key: &str, why: &str) {
    let (k, msg) = refused(text);
    assert_eq!(k, key, "{msg}");
    assert!(msg.contains(why), "{msg:?} does not say {why:?}");
}

/// A file with these contents and mode, in its own directory.
fn file(text: &str, mode: u32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edgellm.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    (dir, path)
}

const REMOTE_WITH_PASSWORD: &str = r#"
[mqtt]
broker = "10.0.0.5:8883"
username = "plc"
password = "hunter2"
[mqtt.tls]
ca_file = "/etc/ssl/plant-ca.pem"
"#;

#[test]
fn no_file_at_all_is_the_embedded_default() {
    let c = Config::default();
    assert_eq!("".parse::<Config>().unwrap(), c);
    assert_eq!(c.model.path, None);
    assert_eq!(c.model.threads, None);
    assert_eq!((c.model.ctx, c.model.chunk), (2048, 64));
    assert_eq!(c.model.kv_type, KvType::F16);
    assert!(!c.model.mlock);
    assert_eq!(c.state.dir, None);
    assert_eq!(
        (c.state.disk_budget, c.state.ram_budget),
        (256 << 20, 64 << 20)
    );
    assert_eq!(c.mqtt.broker, Broker::Embedded);
    assert_eq!(c.mqtt.protocol, Protocol::V5);
    assert_eq!(c.mqtt.device, edgellm::daemon::config::default_device());
    assert_eq!((c.mqtt.prefix.as_str(), c.mqtt.qos), ("edgellm", 1));
    assert_eq!(c.mqtt.keepalive(), Duration::from_secs(30));
    assert_eq!(c.mqtt.max_payload, 64 << 10);
    assert!(!c.mqtt.has_credentials() && c.mqtt.tls.is_none());
    assert!(c.serial.is_empty());
    assert_eq!(c.limits.max_prompt_bytes, 16 << 10);
    assert_eq!((c.limits.max_tokens, c.limits.queue_depth), (512, 16));
    assert_eq!((c.limits.per_source, c.limits.max_sessions), (8, 64));
    assert_eq!(c.limits.request_timeout(), Duration::from_secs(120));
    assert_eq!(c.log.level, "info");
    assert!(c.store_config().is_none());
    assert!(matches!(c.service_config().sessions, Sessions::None));
    assert_eq!(
        c.topics().unwrap().request,
        format!("edgellm/{}/request", c.mqtt.device)
    );
}

#[test]
fn the_example_file_parses_and_says_the_true_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("edgellm.toml");
    let example = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let d = Config::default();
    assert_eq!(example.model, d.model);
    assert_eq!(example.state, d.state);
    assert_eq!(example.mqtt, d.mqtt);
    assert_eq!(example.serial, d.serial);
    assert_eq!(example.modbus, d.modbus);
    assert_eq!(example.limits, d.limits);
    assert_eq!(example.audit, d.audit);
    assert_eq!(example.log, d.log);
}

#[test]
fn every_key_reaches_the_layer_that_uses_it() {
    let c: Config = r#"
        [model]
        path = "/opt/models/qwen.gguf"
        threads = 2
        ctx = 4096
        chunk = 32
        kv_type = "F32"
        mlock = true
        board = "imx8mp"
        [state]
        dir = "/var/lib/edgellm"
        disk_budget = "1G"
        ram_budget = 33554432
        [mqtt]
        broker = "[fd00::5]:1883"
        protocol = "v311"
        device = "press-7"
        username = "plc"
        password_file = "/etc/edgellm/mqtt.pw"
        allow_plaintext_credentials = true
        keepalive_s = 60
        prefix = "plant/line2"
        qos = 2
        fleet_group = "presses"
        max_payload = "1M"
        [[serial]]
        path = "/dev/ttyS1"
        baud = 9600
        data_bits = 8
        parity = "even"
        stop_bits = 1
        flow = "rtscts"
        mode = "modbus"
        unit_id = 17
        rs485 = true
        [[serial]]
        path = "/dev/ttyUSB0"
        flow = "xonxoff"
        mode = "console"
        [limits]
        max_prompt_bytes = "4K"
        max_tokens = 128
        queue_depth = 4
        per_source = 9
        request_timeout_s = 30
        max_sessions = 8
        format_max_row_items = 800
        [audit]
        max_bytes = "1M"
        texts = true
        [log]
        level = "edgellm=debug,warn"
    "#
    .parse()
    .unwrap_or_else(|e| panic!("{e}"));
    let a = c.audit_config().unwrap();
    assert_eq!(a.dir, Path::new("/var/lib/edgellm/audit"));
    assert_eq!((a.max_bytes, a.texts), (1 << 20, true));
    let e = c.engine_config();
    assert_eq!(
        (e.n_ctx, e.chunk, e.threads, e.kv_type),
        (4096, 32, 2, KvType::F32)
    );
    assert!(c.model.mlock);
    assert_eq!(c.model.board.as_deref(), Some("imx8mp"));
    let store = c.store_config().unwrap();
    assert_eq!(store.dir, Path::new("/var/lib/edgellm"));
    assert_eq!((store.disk_bytes, store.ram_bytes), (1 << 30, 32 << 20));
    let s = c.service_config();
    assert_eq!((s.queue_depth, s.max_prompt_bytes), (4, 4096));
    assert_eq!(s.per_source, 4, "per_source is clamped to queue_depth");
    assert!(matches!(s.sessions, Sessions::Dir(_)));
    assert_eq!(s.format_limits.max_row_items, 800);
    let l = c.limits();
    assert_eq!((l.max_payload, l.max_tokens), (1 << 20, 128));
    assert_eq!(l.timeout, Some(Duration::from_secs(30)));
    assert_eq!(
        c.mqtt.broker,
        Broker::Remote {
            host: "fd00::5".into(),
            port: 1883
        }
    );
    assert_eq!(c.mqtt.protocol, Protocol::V311);
    assert_eq!((c.mqtt.qos, c.mqtt.keepalive_s), (2, 60));
    let t = c.topics().unwrap();
    assert_eq!(t.request, "plant/line2/press-7/request");
    assert_eq!(
        t.fleet_request.as_deref(),
        Some("$share/presses/plant/line2/fleet/request")
    );
    let (modbus, console) = (&c.serial[0], &c.serial[1]);
    assert_eq!(
        (modbus.baud, modbus.parity, modbus.flow),
        (9600, Parity::Even, SerialFlow::RtsCts)
    );
    assert_eq!(
        (modbus.mode, modbus.unit_id, modbus.rs485),
        (SerialMode::Modbus, 17, true)
    );
    assert_eq!(
        (console.baud, console.data_bits, console.stop_bits),
        (115_200, 8, 1)
    );
    assert_eq!(
        (console.parity, console.mode),
        (Parity::None, SerialMode::Console)
    );
    assert_eq!(console.flow, SerialFlow::XonXoff);
    assert_eq!(c.log.level, "edgellm=debug,warn");
}

#[test]
fn a_typo_in_a_key_is_refused_naming_it_and_its_line() {
    let (key, msg) = refused("[mqtt]\nqos = 1\nkeepalive = 30\n");
    assert_eq!(key, "mqtt.keepalive");
    assert!(
        msg.starts_with("configuration:3: mqtt.keepalive: unknown field"),
        "{msg}"
    );
    assert!(
        msg.contains("keepalive_s"),
        "the message lists the right keys: {msg}"
    );
    assert_refused(
        "[mqtt.tls]\nca_file = \"a\"\ncafile = \"b\"\n",
        "mqtt.tls.cafile",
        "unknown field",
    );
    assert_refused(
        "[[serial]]\npath = \"/dev/ttyS0\"\nbuad = 9600\n",
        "serial[0].buad",
        "unknown field",
    );
    for table in ["model", "state", "limits", "log"] {
        assert_refused(
            &format!("[{table}]\ntypo = 1\n"),
            &format!("{table}.typo"),
            "unknown field",
        );
    }
    assert_refused("[mqt]\n", "mqt", "unknown field");
}

#[test]
fn a_value_of_the_wrong_type_is_refused_naming_the_key() {
    assert_refused(
        "[mqtt]\nkeepalive_s = \"30\"\n",
        "mqtt.keepalive_s",
        "invalid type",
    );
    assert_refused("[model]\nmlock = \"yes\"\n", "model.mlock", "invalid type");
    assert_refused(
        "[model]\nkv_type = \"q8\"\n",
        "model.kv_type",
        "expected f16 or f32",
    );
    assert_refused(
        "[state]\ndisk_budget = \"1T\"\n",
        "state.disk_budget",
        "is not a size",
    );
    assert_refused(
        "[mqtt]\nprotocol = \"v4\"\n",
        "mqtt.protocol",
        "unknown variant",
    );
    assert_refused(
        "[[serial]]\npath = \"/dev/ttyS0\"\nparity = \"evn\"\n",
        "serial[0].parity",
        "unknown variant",
    );
}

#[test]
fn a_keepalive_out_of_range_is_refused() {
    assert_refused(
        "[mqtt]\nkeepalive_s = 4\n",
        "mqtt.keepalive_s",
        "4 is out of range 5..=3600",
    );
    assert_refused(
        "[mqtt]\nkeepalive_s = 3601\n",
        "mqtt.keepalive_s",
        "out of range",
    );
    for ok in [5, 3600] {
        format!("[mqtt]\nkeepalive_s = {ok}\n")
            .parse::<Config>()
            .unwrap();
    }
}

#[test]
fn an_audit_budget_under_16k_and_an_unknown_audit_key_are_refused() {
    assert_refused(
        "[audit]\nmax_bytes = \"4K\"\n",
        "audit.max_bytes",
        "out of range 16384..=",
    );
    assert_refused(
        "[audit]\ntext = true\n",
        "audit.text",
        "unknown field `text`",
    );
    let c: Config = "[audit]\nenabled = false\n[state]\ndir = \"/var/lib/x\"\n"
        .parse()
        .unwrap();
    assert!(
        c.audit_config().is_none(),
        "audit.enabled = false still keeps a trail"
    );
}

#[test]
fn a_qos_above_two_is_refused() {
    assert_refused("[mqtt]\nqos = 3\n", "mqtt.qos", "out of range 0..=2");
    "[mqtt]\nqos = 0\n".parse::<Config>().unwrap();
}

#[test]
fn a_baud_rate_out_of_range_is_refused_naming_the_port() {
    let port = |extra: &str| {
        format!("[[serial]]\npath = \"/dev/ttyS0\"\n[[serial]]\npath = \"/dev/ttyS1\"\n{extra}\n")
    };
    assert_refused(
        &port("baud = 300"),
        "serial[1].baud",
        "out of range 1200..=921600",
    );
    assert_refused(&port("baud = 1000000"), "serial[1].baud", "out of range");
    port("baud = 921600").parse::<Config>().unwrap();
}

#[test]
fn serial_framing_out_of_range_is_refused() {
    let port = |extra: &str| format!("[[serial]]\npath = \"/dev/ttyS0\"\n{extra}\n");
    assert_refused(
        &port("data_bits = 9"),
        "serial[0].data_bits",
        "out of range 5..=8",
    );
    assert_refused(
        &port("stop_bits = 3"),
        "serial[0].stop_bits",
        "out of range 1..=2",
    );
    assert_refused(
        &port("mode = \"modbus\"\ndata_bits = 7"),
        "serial[0].data_bits",
        "Modbus RTU",
    );
    assert_refused("[[serial]]\nbaud = 9600\n", "serial[0].path", "is required");
    assert_refused(
        "[[serial]]\npath = \"/dev/ttyS0\"\n[[serial]]\npath = \"/dev/ttyS0\"\n",
        "serial[1].path",
        "already serial[0]",
    );
}

#[test]
fn a_modbus_unit_id_outside_1_to_247_is_refused() {
    let port =
        |id: u32| format!("[[serial]]\npath = \"/dev/ttyS0\"\nmode = \"modbus\"\nunit_id = {id}\n");
    assert_refused(&port(0), "serial[0].unit_id", "out of range 1..=247");
    assert_refused(&port(248), "serial[0].unit_id", "out of range 1..=247");
    port(247).parse::<Config>().unwrap();
}

#[test]
fn a_broker_that_is_not_host_port_embedded_or_off_is_refused() {
    assert_refused(
        "[mqtt]\nbroker = \"10.0.0.5\"\n",
        "mqtt.broker",
        "the port is required",
    );
    assert_refused(
        "[mqtt]\nbroker = \"::1:1883\"\n",
        "mqtt.broker",
        "in brackets",
    );
    assert_refused(
        "[mqtt]\nbroker = \"emedded\"\n",
        "mqtt.broker",
        "expected embedded, off",
    );
    assert_refused(
        "[mqtt]\nbroker = \"h:99999\"\n",
        "mqtt.broker",
        "not a port",
    );
    let off: Config = "[mqtt]\nbroker = \"off\"\n".parse().unwrap();
    assert_eq!(off.mqtt.broker, Broker::Off);
}

#[test]
fn topic_names_are_held_to_the_contract() {
    assert_refused(
        "[mqtt]\ndevice = \"a/b\"\n",
        "mqtt.device",
        "one topic level",
    );
    assert_refused("[mqtt]\nprefix = \"plant/#\"\n", "mqtt.prefix", "wildcards");
    assert_refused(
        "[mqtt]\nfleet_group = \"\"\n",
        "mqtt.fleet_group",
        "1 to 64 bytes",
    );
}

#[test]
fn a_password_and_a_password_file_together_are_refused() {
    assert_refused(
        "[mqtt]\nusername = \"u\"\npassword = \"p\"\npassword_file = \"/etc/pw\"\n",
        "mqtt.password_file",
        "not both",
    );
    assert_refused(
        "[mqtt]\npassword = \"p\"\n",
        "mqtt.password",
        "needs mqtt.username",
    );
}

#[test]
fn a_client_certificate_without_its_key_is_refused() {
    let tls = |extra: &str| {
        format!("[mqtt]\nbroker = \"b:8883\"\n[mqtt.tls]\nca_file = \"/ca.pem\"\n{extra}\n")
    };
    assert_refused(
        &tls("cert_file = \"/c.pem\""),
        "mqtt.tls.key_file",
        "needs its key",
    );
    assert_refused(
        &tls("key_file = \"/k.pem\""),
        "mqtt.tls.cert_file",
        "needs its certificate",
    );
    tls("cert_file = \"/c.pem\"\nkey_file = \"/k.pem\"")
        .parse::<Config>()
        .unwrap();
    assert_refused(
        "[mqtt.tls]\ncert_file = \"/c.pem\"\n",
        "mqtt.tls.ca_file",
        "is required",
    );
    assert_refused(
        "[mqtt.tls]\nca_file = \"/ca.pem\"\n",
        "mqtt.tls",
        "embedded broker",
    );
}

#[test]
fn credentials_in_plaintext_to_a_remote_broker_are_refused_unless_allowed() {
    let plain = "[mqtt]\nbroker = \"10.0.0.5:1883\"\nusername = \"plc\"\npassword = \"hunter2\"\n";
    let (key, msg) = refused(plain);
    assert_eq!(key, "mqtt.password");
    assert!(
        msg.contains("[mqtt.tls]") && msg.contains("mqtt.allow_plaintext_credentials"),
        "{msg}"
    );
    assert!(!msg.contains("hunter2"), "{msg}");
    assert_refused(
        "[mqtt]\nbroker = \"broker:1883\"\nusername = \"plc\"\n",
        "mqtt.username",
        "plaintext",
    );
    format!("{plain}allow_plaintext_credentials = true\n")
        .parse::<Config>()
        .unwrap();
    REMOTE_WITH_PASSWORD.parse::<Config>().unwrap();
    for lo in ["127.0.0.1:1883", "localhost:1883", "[::1]:1883"] {
        format!("[mqtt]\nbroker = \"{lo}\"\nusername = \"u\"\npassword = \"p\"\n")
            .parse::<Config>()
            .unwrap_or_else(|e| panic!("{lo}: {e}"));
    }
}

#[test]
fn limits_out_of_range_are_refused() {
    assert_refused(
        "[limits]\nqueue_depth = 0\n",
        "limits.queue_depth",
        "out of range",
    );
    assert_refused(
        "[limits]\nmax_tokens = 0\n",
        "limits.max_tokens",
        "out of range",
    );
    assert_refused(
        "[limits]\nrequest_timeout_s = 0\n",
        "limits.request_timeout_s",
        "out of range",
    );
    assert_refused(
        "[mqtt]\nmax_payload = \"17M\"\n",
        "mqtt.max_payload",
        "out of range",
    );
    assert_refused(
        "[limits]\nformat_max_row_items = 10\n",
        "limits.format_max_row_items",
        "out of range 50..=100000",
    );
    assert_refused("[model]\nctx = 0\n", "model.ctx", "out of range");
    assert_refused("[model]\nthreads = 0\n", "model.threads", "out of range");
    assert_refused(
        "[log]\nlevel = \"edgellm=loud\"\n",
        "log.level",
        "edgellm=loud",
    );
}

#[test]
fn a_file_error_names_the_file_and_the_line() {
    let (_dir, path) = file("[model]\nctx = 2048\n[mqtt]\nqos = 7\n", 0o644);
    let e = Config::load(&path).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("{}:4: mqtt.qos: 7 is out of range 0..=2", path.display())
    );
    let (_dir, path) = file("[model]\nctx = \"big\"\n", 0o644);
    let msg = Config::load(&path).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("{}:2: model.ctx: invalid type", path.display())),
        "{msg}"
    );
    let (_dir, path) = file("[model\n", 0o644);
    let msg = Config::load(&path).unwrap_err().to_string();
    assert!(msg.starts_with(&format!("{}:1: ", path.display())), "{msg}");
    let missing = Config::load(Path::new("/nonexistent/edgellm.toml")).unwrap_err();
    assert!(matches!(missing, ConfigError::Read { .. }), "{missing}");
    assert!(
        missing
            .to_string()
            .starts_with("/nonexistent/edgellm.toml: cannot read")
    );
}

#[test]
fn a_file_over_one_mebibyte_is_refused_unread() {
    let mut big = String::from("[log]\nlevel = \"info\"\n");
    big.push_str(&"# padding\n".repeat(110_000));
    let (_dir, path) = file(&big, 0o644);
    let e = Config::load(&path).unwrap_err();
    assert!(matches!(e, ConfigError::TooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .ends_with("too large: more than 1048576 bytes"),
        "{e}"
    );
    let (_dir, path) = file(&big[..1 << 20], 0o644);
    Config::load(&path).unwrap_or_else(|e| panic!("exactly 1 MiB is accepted: {e}"));
}

#[test]
fn a_password_in_a_file_others_can_read_is_refused() {
    for mode in [0o644, 0o604, 0o660] {
        let (_dir, path) = file(REMOTE_WITH_PASSWORD, mode);
        let e = Config::load(&path).unwrap_err();
        assert_eq!(e.key(), Some("mqtt.password"), "{e}");
        assert!(e.to_string().contains(&format!("mode {mode:03o}")), "{e}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
    // 0600, and 0640 in this process's own group (the file is made in it).
    for mode in [0o600, 0o640] {
        let (_dir, path) = file(REMOTE_WITH_PASSWORD, mode);
        let c = Config::load(&path).unwrap();
        assert_eq!(c.password().unwrap().unwrap().expose(), "hunter2");
    }
    let (_dir, path) = file("[mqtt]\nprefix = \"x\"\n", 0o644);
    Config::load(&path).expect("a file without secrets may be world-readable");
}

#[test]
fn a_password_file_others_can_read_is_refused_and_a_private_one_is_read() {
    let text =
        "[mqtt]\nbroker = \"127.0.0.1:1883\"\nusername = \"plc\"\npassword_file = \"mqtt.pw\"\n";
    let (dir, path) = file(text, 0o644);
    let pw = dir.path().join("mqtt.pw");
    std::fs::write(&pw, "s3cret\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Config::load(&path).unwrap_err();
    assert_eq!(e.key(), Some("mqtt.password_file"), "{e}");
    assert!(
        e.to_string().contains("others may read it (mode 644)"),
        "{e}"
    );
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let c = Config::load(&path).unwrap();
    assert_eq!(
        c.mqtt.password_file.as_deref(),
        Some(pw.as_path()),
        "relative to the file"
    );
    assert_eq!(c.password().unwrap().unwrap().expose(), "s3cret");
    std::fs::remove_file(&pw).unwrap();
    let e = Config::load(&path).unwrap_err();
    assert_eq!(e.key(), Some("mqtt.password_file"), "{e}");
}

#[test]
fn a_tls_key_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client.key");
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = format!(
        "[mqtt]\nbroker = \"b:8883\"\n[mqtt.tls]\nca_file = \"/ca.pem\"\ncert_file = \"/c.pem\"\nkey_file = {key:?}\n"
    );
    let path = dir.path().join("edgellm.toml");
    std::fs::write(&path, text).unwrap();
    let e = Config::load(&path).unwrap_err();
    assert_eq!(e.key(), Some("mqtt.tls.key_file"), "{e}");
}

#[test]
fn relative_paths_are_taken_from_the_files_directory() {
    let (dir, path) = file(
        "[model]\npath = \"models/m.gguf\"\n[state]\ndir = \"/var/lib/edgellm\"\n",
        0o644,
    );
    let c = Config::load(&path).unwrap();
    assert_eq!(c.model.path, Some(dir.path().join("models/m.gguf")));
    assert_eq!(c.state.dir.as_deref(), Some(Path::new("/var/lib/edgellm")));
    assert_eq!(c.file(), Some(path.as_path()));
}

#[test]
fn overrides_win_over_the_file() {
    let (_dir, path) = file(
        "[model]\npath = \"/a.gguf\"\nthreads = 2\nctx = 1024\n[mqtt]\nbroker = \"off\"\ndevice = \"d1\"\n",
        0o644,
    );
    let mut c = Config::load(&path).unwrap();
    c.apply(&Overrides {
        model: Some("b.gguf".into()),
        mqtt: Some("[::1]:1884".into()),
        device: Some("d2".into()),
        state_dir: Some("state".into()),
        threads: Some(3),
        ctx: Some(512),
        serial: vec!["/dev/ttyUSB0:9600:modbus".into()],
        board: Some("rk3588".into()),
        chat_template: Some("gemma".into()),
    })
    .unwrap();
    assert_eq!(c.model.board.as_deref(), Some("rk3588"));
    assert_eq!(c.model.chat_template.as_deref(), Some(Path::new("gemma")));
    assert_eq!(c.serial.len(), 1);
    assert_eq!(
        (c.serial[0].baud, c.serial[0].mode),
        (9600, edgellm::daemon::SerialMode::Modbus)
    );
    assert_eq!(
        c.model.path.as_deref(),
        Some(Path::new("b.gguf")),
        "as given, not resolved"
    );
    assert_eq!((c.model.threads, c.model.ctx), (Some(3), 512));
    assert_eq!(
        c.mqtt.broker,
        Broker::Remote {
            host: "::1".into(),
            port: 1884
        }
    );
    assert_eq!(c.mqtt.device, "d2");
    assert_eq!(c.state.dir.as_deref(), Some(Path::new("state")));
    c.apply(&Overrides::default()).unwrap();
    assert_eq!(c.model.ctx, 512, "an empty override changes nothing");
}

#[test]
fn a_bad_override_is_refused_as_an_override_and_changes_nothing() {
    let mut c = Config::default();
    let before = c.clone();
    for (o, key) in [
        (
            Overrides {
                mqtt: Some("nowhere".into()),
                ..Overrides::default()
            },
            "mqtt.broker",
        ),
        (
            Overrides {
                device: Some("a/b".into()),
                ..Overrides::default()
            },
            "mqtt.device",
        ),
        (
            Overrides {
                threads: Some(0),
                ..Overrides::default()
            },
            "model.threads",
        ),
        (
            Overrides {
                ctx: Some(usize::MAX),
                ..Overrides::default()
            },
            "model.ctx",
        ),
        (
            Overrides {
                serial: vec!["/dev/ttyS0:115200:line".into(), "/dev/ttyS1:250000".into()],
                ..Overrides::default()
            },
            "serial[1].baud",
        ),
        (
            Overrides {
                serial: vec![":9600".into()],
                ..Overrides::default()
            },
            "serial[0]",
        ),
    ] {
        let e = c.apply(&o).unwrap_err();
        assert_eq!(e.key(), Some(key), "{e}");
        assert!(
            e.to_string().starts_with(&format!("override: {key}: ")),
            "{e}"
        );
        assert_eq!(c, before);
    }
}

#[test]
fn an_override_is_held_to_the_files_credentials_rule() {
    let mut c: Config = "[mqtt]\nbroker = \"127.0.0.1:1883\"\nusername = \"u\"\npassword = \"p\"\n"
        .parse()
        .unwrap();
    let e = c
        .apply(&Overrides {
            mqtt: Some("10.0.0.5:1883".into()),
            ..Overrides::default()
        })
        .unwrap_err();
    assert_eq!(e.key(), Some("mqtt.password"), "{e}");
    assert!(
        e.to_string()
            .starts_with("configuration:4: mqtt.password: credentials"),
        "{e}"
    );
}

#[test]
fn debug_output_never_shows_the_password() {
    let c: Config = REMOTE_WITH_PASSWORD.parse().unwrap();
    let dbg = format!("{c:?} {:?}", c.password().unwrap());
    assert!(!dbg.contains("hunter2"), "{dbg}");
    assert!(dbg.contains("<redacted>"), "{dbg}");
}

#[test]
fn a_serial_flag_is_read_from_the_right_so_paths_keep_their_colons() {
    use edgellm::daemon::SerialMode;
    use edgellm::daemon::config::parse_serial;
    let p = parse_serial("/dev/ttyAMA0").unwrap();
    assert_eq!((p.baud, p.mode), (115_200, SerialMode::Line));
    let p = parse_serial("/dev/ttyAMA0:9600").unwrap();
    assert_eq!((p.path.to_str(), p.baud), (Some("/dev/ttyAMA0"), 9600));
    let p = parse_serial("/dev/pts/3:19200:console").unwrap();
    assert_eq!((p.baud, p.mode), (19200, SerialMode::Console));
    let by_path = "/dev/serial/by-path/platform-xhci-usb-0:1.3:1.0-port0";
    let p = parse_serial(&format!("{by_path}:frame")).unwrap();
    assert_eq!(
        (p.path.to_str(), p.mode),
        (Some(by_path), SerialMode::Frame)
    );
    assert!(parse_serial("").is_err());
    assert!(parse_serial(":modbus").is_err());
}

#[test]
fn the_modbus_section_takes_a_tcp_address_and_holds_the_unit_id_to_its_range() {
    let c: Config = "[modbus]\ntcp = \"127.0.0.1:1502\"\nunit_id = 9\n"
        .parse()
        .unwrap();
    assert_eq!(c.modbus.tcp, Some("127.0.0.1:1502".parse().unwrap()));
    assert_eq!(c.modbus.unit_id, 9);
    assert_eq!(Config::default().modbus.tcp, None);
    let e = "[modbus]\nunit_id = 0\n".parse::<Config>().unwrap_err();
    assert!(e.to_string().contains("modbus.unit_id"), "{e}");
    let e = "[modbus]\ntcp = \"nowhere\"\n"
        .parse::<Config>()
        .unwrap_err();
    assert!(e.to_string().contains("modbus.tcp"), "{e}");
}

/// The packaged layout, as the unit meets it: the configuration root-owned, mode 0640, in
/// the daemon's group, read by a daemon that is neither root nor the owner, with the
/// password in it. The same file in another group the daemon's user owns is refused: that
/// group's members could read the password. (Run as root, as the test command runs, to
/// switch to an unprivileged user and group.)
#[test]
fn a_password_in_the_packaged_0640_root_daemon_group_file_is_accepted() {
    use std::os::unix::fs::chown;
    use std::os::unix::process::CommandExt;
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test switches to an unprivileged user: run it as root"
    );
    let (daemon_uid, daemon_gid, other_gid) = (65534u32, 65533u32, 65532u32);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The binary where the unprivileged user can run it (the build directory may not be).
    let bin = dir.path().join("edgellm");
    std::fs::copy(env!("CARGO_BIN_EXE_edgellm"), &bin).unwrap();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"").unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(
        &conf,
        format!(
            "[model]\npath = {model:?}\n[mqtt]\nbroker = \"127.0.0.1:1883\"\nusername = \"plc\"\npassword = \"hunter2\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o640)).unwrap();
    let check = || {
        std::process::Command::new(&bin)
            .args(["serve", "--config", conf.to_str().unwrap(), "--check"])
            .uid(daemon_uid)
            .gid(daemon_gid)
            .output()
            .unwrap()
    };
    // root:daemon-group 0640: what the .deb's postinst and the Yocto recipe install.
    chown(&conf, Some(0), Some(daemon_gid)).unwrap();
    let o = check();
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("configuration OK"),
        "{o:?}"
    );
    // Owned by the daemon's user, but readable by another group: refused, saying why.
    chown(&conf, Some(daemon_uid), Some(other_gid)).unwrap();
    let o = check();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains(&format!(
            "group {other_gid} may read it (mode 640) and is not the daemon's group"
        )),
        "{e}"
    );
    assert!(!e.contains("hunter2"), "{e}");
}

/// An error found after parsing (a range, a combination) names the line of its key, as the
/// parser's own errors do: the technician goes straight to it. A key that is missing names
/// the table it belongs in.
#[test]
fn errors_found_after_parsing_name_the_line_of_the_key() {
    let text = "# site configuration\n\n[mqtt]\nbroker = \"embedded\"\nkeepalive_s = 4\n";
    let (_dir, path) = file(text, 0o644);
    let e = Config::load(&path).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{}:5: mqtt.keepalive_s: 4 is out of range 5..=3600",
            path.display()
        )
    );
    let text =
        "[[serial]]\npath = \"/dev/ttyS0\"\n\n[[serial]]\npath = \"/dev/ttyS1\"\nbaud = 1000000\n";
    let (_dir, path) = file(text, 0o644);
    let e = Config::load(&path).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("{}:6: serial[1].baud: ", path.display())),
        "{e}"
    );
    // A password without a user name: the key that is there.
    let text = "[mqtt]\nbroker = \"127.0.0.1:1883\"\n\npassword = \"x\"\n";
    let (_dir, path) = file(text, 0o600);
    let e = Config::load(&path).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{}:4: mqtt.password: a password needs mqtt.username",
            path.display()
        )
    );
}

/// `modbus.tcp` takes host:port as the reference says: an address, `[ipv6]:port`, or a name
/// resolved when the file is read; anything else is refused naming the key.
#[test]
fn modbus_tcp_takes_a_host_name_or_an_address() {
    let tcp = |v: &str| format!("[modbus]\ntcp = {v:?}\n").parse::<Config>();
    assert_eq!(
        tcp("localhost:1502")
            .unwrap()
            .modbus
            .tcp
            .map(|a| (a.ip().is_loopback(), a.port())),
        Some((true, 1502))
    );
    assert_eq!(
        tcp("0.0.0.0:502").unwrap().modbus.tcp,
        Some("0.0.0.0:502".parse().unwrap())
    );
    assert_eq!(
        tcp("[::1]:502").unwrap().modbus.tcp,
        Some("[::1]:502".parse().unwrap())
    );
    for bad in ["localhost", "localhost:99999", ":502"] {
        assert_refused(&format!("[modbus]\ntcp = {bad:?}\n"), "modbus.tcp", "");
    }
    assert_refused(
        "[modbus]\ntcp = \"plc:x\"\n",
        "modbus.tcp",
        "is not host:port",
    );
}

#[test]
fn modbus_formats_name_configured_formats_once_each() {
    let ok: Config = "[choices]\nsev = [\"low\", \"high\"]\n[modbus]\nformats = [\"sev\"]\n"
        .parse()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ok.modbus.formats, ["sev"]);
    assert_refused(
        "[modbus]\nformats = [\"alarm\"]\n",
        "modbus.formats",
        "\"alarm\" is in neither [schemas] nor [choices]",
    );
    assert_refused(
        "[choices]\nsev = [\"low\"]\n[modbus]\nformats = [\"sev\", \"sev\"]\n",
        "modbus.formats",
        "\"sev\" is listed twice",
    );
}
