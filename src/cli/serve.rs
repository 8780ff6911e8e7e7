//! `edgellm serve`: the daemon.

use super::CliResult;
use edgellm::daemon::config::{Config, Overrides};
use std::path::PathBuf;

/// Run the appliance: load the model once, answer requests over MQTT and serial ports until
/// stopped.
///
/// With no configuration at all it serves the board's default model (`edgellm board detect`
/// names it; looked for in the models/fetch.sh cache, then /usr/share/edgellm/models) and
/// starts an embedded MQTT broker on 127.0.0.1 (MQTT 5 on 1883, 3.1.1 on 1884), so one command
/// brings up a working appliance offline. Flags override the file.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  edgellm serve                                   # embedded broker, default model
  edgellm serve --config /etc/edgellm/edgellm.toml
  edgellm serve --mqtt 192.168.1.10:1883 --device press-7 --state-dir /var/lib/edgellm
  edgellm serve --config edgellm.toml --check     # validate and exit 0 (valid) or 1
  edgellm serve --mqtt off --serial /dev/ttyAMA0:115200:line   # serial only
  edgellm serve --board rpi4b                     # a board profile (edgellm board list)

Requests go to {prefix}/{device}/request, answers to the MQTT 5 response topic (or
{prefix}/{device}/response/{id}), the retained status to {prefix}/{device}/status
(docs/mqtt.md). Under systemd (Type=notify) it reports READY=1 once serving, and pings the
watchdog while the engine makes progress. SIGTERM: stop taking requests, finish the answer
in progress (cancelled after 10 s), publish the offline status, exit 0. SIGHUP: read the
configuration again; [limits] and [log] apply at once, the log names what needs a restart.")]
pub struct Args {
    /// Configuration file (TOML, docs/config.md). Without it: the embedded default.
    #[arg(long, env = "EDGELLM_CONFIG")]
    config: Option<PathBuf>,
    /// Validate the configuration (and that the model file exists), print it, exit.
    #[arg(long)]
    check: bool,
    /// Model file (.gguf); default: the board's default model (`edgellm board detect`), from
    /// the models/fetch.sh cache or /usr/share/edgellm/models.
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    /// The broker: HOST:PORT, `embedded` (start one on 127.0.0.1) or `off`.
    #[arg(long)]
    mqtt: Option<String>,
    /// The device id in the topics (default: the host name).
    #[arg(long)]
    device: Option<String>,
    /// Keep named sessions and system prompts here (survive restarts).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Worker threads (default: the big cores, else all).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Context length in tokens.
    #[arg(short = 'c', long)]
    ctx: Option<usize>,
    /// Serve a serial port: PATH[:BAUD[:MODE]], MODE `line` (default), `frame`, `modbus` or
    /// `console`; repeat for more ports. Replaces the file's [[serial]] ports.
    #[arg(long, value_name = "PATH[:BAUD[:MODE]]")]
    serial: Vec<String>,
    /// Serve Modbus TCP on ADDR (`0.0.0.0:502`, `localhost:1502`), as `modbus.tcp`.
    #[arg(long, value_name = "ADDR", value_parser = edgellm::daemon::config::parse_listen_addr)]
    modbus_tcp: Option<std::net::SocketAddr>,
    /// Apply a board profile (`edgellm board list`): threads, CPU affinity, the kernel path
    /// check, the memory budget. As `model.board`.
    #[arg(long, value_name = "NAME")]
    board: Option<String>,
    /// Chat template for `messages` requests instead of the model's: a Jinja file, or a
    /// built-in name (gemma, chatml). As `model.chat_template`.
    #[arg(long, value_name = "FILE|NAME")]
    chat_template: Option<PathBuf>,
}

/// Where a model named by file only is looked for: the cache `models/fetch.sh` fills, then
/// where the packages install models.
fn model_dirs() -> Vec<PathBuf> {
    let cache = std::env::var_os("EDGELLM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/edgellm")));
    cache
        .map(|c| c.join("models"))
        .into_iter()
        .chain([PathBuf::from("/usr/share/edgellm/models")])
        .collect()
}

/// The board's default model (`model.board`, else the detected board's profile) and the
/// place it is found at, or the first place it was looked for.
fn default_model(cfg: &Config) -> (String, &'static str, PathBuf) {
    let profile = cfg.board().or_else(|| {
        let tree = edgellm::board::Tree::read(std::path::Path::new("/"));
        let caps = kernels_neon::cpu_features();
        let name = edgellm::board::detect(&tree, Some(caps.as_slice())).profile?;
        edgellm::board::get(&name).ok()
    });
    // Every architecture has a generic profile; a machine detection cannot place gets the
    // smallest shipped model.
    let (board, file) = profile.map_or(("none", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), |p| {
        (p.name.as_str(), p.default_model.as_str())
    });
    let dirs = model_dirs();
    let path = dirs
        .iter()
        .map(|d| d.join(file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| dirs[0].join(file));
    (file.to_owned(), board, path)
}

/// The configuration this invocation asks for: the file (or the default) with the flags on it.
pub fn config(a: &Args) -> Result<(Config, PathBuf), String> {
    let mut cfg = match &a.config {
        Some(p) => Config::load(p).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    cfg.apply(&Overrides {
        model: a.model.clone(),
        mqtt: a.mqtt.clone(),
        device: a.device.clone(),
        state_dir: a.state_dir.clone(),
        threads: a.threads,
        ctx: a.ctx,
        serial: a.serial.clone(),
        board: a.board.clone(),
        chat_template: a.chat_template.clone(),
    })
    .map_err(|e| e.to_string())?;
    if let Some(addr) = a.modbus_tcp {
        cfg.modbus.tcp = Some(addr);
    }
    let model = match cfg.model.path.clone() {
        Some(path) if path.is_file() => path,
        Some(path) => return Err(format!("{}: no such model file", path.display())),
        None => {
            let (file, board, path) = default_model(&cfg);
            if !path.is_file() {
                return Err(format!(
                    "no model at {}: board {board}'s default model is {file}; fetch it with \
                     `models/fetch.sh default` (or copy it to /usr/share/edgellm/models), or \
                     give --model (or model.path in the configuration)",
                    path.display()
                ));
            }
            path
        }
    };
    Ok((cfg, model))
}

pub fn run(a: Args, verbose: u8) -> CliResult {
    let (cfg, model) = match config(&a) {
        Ok(c) => c,
        Err(e) => {
            super::init_logging(verbose, "info");
            // `--check` answers 0 or 1; a start it refuses exits 78 (see Refused).
            return Err(if a.check {
                e.into()
            } else {
                Box::new(super::Refused(e))
            });
        }
    };
    let ring = std::sync::Arc::new(super::logring::LogRing::default());
    let set_filter =
        super::init_reloadable_logging(verbose, &log_filter(&cfg.log.level), Some(ring.clone()));
    if a.check {
        let ports: Vec<String> = cfg
            .serial
            .iter()
            .map(|s| format!("{} ({:?}, {} baud)", s.path.display(), s.mode, s.baud))
            .collect();
        println!(
            "configuration OK: model {}, mqtt {}, device {}, serial {}",
            model.display(),
            cfg.mqtt.broker,
            cfg.mqtt.device,
            if ports.is_empty() {
                "none".to_owned()
            } else {
                ports.join(", ")
            }
        );
        match edgellm::daemon::board::summary(&cfg) {
            Some(b) => println!("board {b}"),
            None => println!("board none (no model.board)"),
        }
        return Ok(());
    }
    let reload = edgellm::daemon::serve::Reload {
        config: Box::new(move || config(&a).map(|(c, _)| c)),
        log: Box::new(move |level| set_filter(&log_filter(level))),
        log_tail: std::sync::Arc::new(move |n| ring.tail(n)),
    };
    use edgellm::daemon::serve::DaemonError;
    match edgellm::daemon::serve::serve(cfg, model, reload) {
        Ok(()) => Ok(()),
        Err(e @ (DaemonError::Model(_) | DaemonError::Config(_) | DaemonError::Board(_))) => {
            Err(Box::new(super::Refused(e.to_string())))
        }
        Err(e) => Err(e.into()),
    }
}

/// The filter for `log.level`. The embedded broker logs every connection at info and every
/// disconnect as an error: noise in a field log, off unless the level names rumqttd.
fn log_filter(level: &str) -> String {
    if level.contains("rumqttd") {
        level.to_owned()
    } else {
        format!("{level},rumqttd=off")
    }
}
