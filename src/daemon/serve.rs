//! `edgellm serve`: the model, the service worker, the MQTT front end and systemd, wired.
//!
//! Threads: the engine's compute pool and the service worker are plain threads (they park
//! when idle); all I/O runs on one small tokio runtime of its own (the MQTT loop, the
//! publisher, signals, the watchdog), so a busy engine never holds up the network and an idle
//! daemon wakes for nothing. With `mqtt.broker = "embedded"` a rumqttd broker runs on its own
//! threads on 127.0.0.1.

use super::config::{Broker, Config};
use super::notify::{self, Notifier};
use super::status::{State, StatusBoard};
use crate::audit::{AuditLog, AuditState};
use crate::engine::Engine;
use crate::model::{LoadOptions, Model};
use crate::mqtt::client::{self, Role, Settings};
use crate::mqtt::journal::Journal;
use crate::service::{Service, ServiceError};
use rumqttc::v5::mqttbytes::QoS;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Why the daemon could not start (or stopped with an error).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Model(String),
    #[error("{0}")]
    Service(#[from] ServiceError),
    #[error("configuration: {0}")]
    Config(String),
    /// The board profile refuses (the memory budget).
    #[error("{0}")]
    Board(String),
    #[error("embedded broker: {0}")]
    Broker(String),
    #[error("cannot start the I/O runtime: {0}")]
    Runtime(std::io::Error),
}

/// How long a running answer may go on after SIGTERM before it is cancelled.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long start-up waits for the broker before it reports ready without it.
const BROKER_WAIT: Duration = Duration::from_secs(10);

/// Sets the log filter to a `log.level`; `Err` says why it cannot.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// What SIGHUP needs from the caller, who knows where the configuration came from.
pub struct Reload {
    /// Reads and validates the configuration again (the same file, the same overrides).
    pub config: Box<dyn Fn() -> Result<Config, String> + Send + Sync>,
    pub log: SetLogLevel,
    /// The last lines of the daemon's log, oldest first (a serial console's `log`).
    pub log_tail: Arc<dyn Fn(usize) -> Vec<String> + Send + Sync>,
}

/// What opens the audit trail the configuration asks for, once the service holds the state
/// directory. A trail that cannot be opened (a read-only or broken state partition) does not
/// stop the appliance answering: the status says why there is no trail, and so does the log.
fn audit_opener(
    cfg: &Config,
    board: &mut StatusBoard,
) -> impl FnOnce() -> Option<Box<dyn crate::service::Recorder>> + use<> {
    let ac = cfg.audit_config();
    if ac.is_none() {
        tracing::info!("no audit trail (no state directory, or audit.enabled = false)");
    }
    let (facts, sha256) = board.model_facts();
    let state = Arc::new(AuditState::default());
    board.audit = ac.is_some().then(|| Arc::clone(&state));
    move || {
        let ac = ac?;
        let dir = ac.dir.clone();
        match AuditLog::open(ac, facts, sha256, Arc::clone(&state)) {
            Ok(log) => {
                tracing::info!(
                    dir = %dir.display(),
                    last_seq = state.seq.load(Ordering::Relaxed),
                    "audit trail opened"
                );
                Some(Box::new(log) as Box<dyn crate::service::Recorder>)
            }
            Err(e) => {
                tracing::error!("audit trail cannot be opened, answers are not recorded: {e}");
                state.health.failed(e.to_string());
                None
            }
        }
    }
}

/// Runs the daemon until SIGTERM or SIGINT. `model` is the resolved model path.
pub fn serve(cfg: Config, model: PathBuf, reload: Reload) -> Result<(), DaemonError> {
    let started = Instant::now();
    // Before the model loads: a schema file that cannot be read is said at once.
    let formats = cfg
        .formats()
        .map_err(|e| DaemonError::Config(e.to_string()))?;
    #[cfg(feature = "test-hooks")]
    let hooks = super::hooks::TestHooks::from_env();
    let notifier = Arc::new(Notifier::from_env());
    notifier.status("loading the model");
    // A refusal here is final (the unit does not restart it): say it on the site's broker too.
    let refuse = |e: DaemonError| {
        super::refusal::publish(&cfg, &model, &e.to_string());
        e
    };
    let m = Model::load(
        &model,
        &LoadOptions {
            mlock: cfg.model.mlock,
        },
    )
    .map_err(|e| refuse(DaemonError::Model(e.to_string())))?;
    let engine_cfg = cfg.engine_config();
    let profile = cfg.board();
    let mut cpus = Vec::new();
    if let Some(p) = profile {
        // Before the engine allocates anything: a refusal now, not an OOM kill later.
        super::board::check_budget(p, &cfg, &m, &engine_cfg)
            .map_err(|e| refuse(DaemonError::Board(e)))?;
        cpus = super::board::usable_cpus(p);
    }
    let engine = Engine::pinned(Arc::new(m), engine_cfg, &cpus)
        .map_err(|e| refuse(DaemonError::Model(format!("{}: {e}", model.display()))))?;
    if let Some(p) = profile {
        super::board::check_kernels(p, engine.kernels().name());
        tracing::info!(
            board = %p.name,
            threads = engine.config().threads,
            cpus = %crate::board::cpu::format_cpu_list(engine.cpus()),
            kernels = engine.kernels().name(),
            "board profile applied"
        );
    }
    let mut board = StatusBoard::new(&engine, &model, cfg.model.board.clone(), started);
    let recorder = audit_opener(&cfg, &mut board);
    let service = Service::start_recorded(
        engine,
        crate::service::ServiceConfig {
            #[cfg(feature = "test-hooks")]
            test_stall: hooks.stall,
            formats: std::sync::Arc::new(formats),
            ..cfg.service_config()
        },
        recorder,
    )
    .map_err(|e| match e.code {
        // A configured format the grammar engine refuses: the configuration's fault.
        crate::service::ErrorCode::BadRequest => DaemonError::Config(e.message),
        _ => e.into(),
    })?;
    let handle = service.handle();
    tracing::info!(
        model = %model.display(),
        load_ms = started.elapsed().as_millis() as u64,
        "model loaded, service started"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("edgellm-io")
        .build()
        .map_err(DaemonError::Runtime)?;
    let result = rt.block_on(async {
        let signals = catch_signals();
        let (stop_tx, stop_rx) = watch::channel(false);
        let (limits_tx, limits_rx) = watch::channel(cfg.limits());
        let mut tasks = Vec::new();
        // Wakes the status publisher: the service and the serial ports call it on a change.
        let wake = Arc::new(tokio::sync::Notify::new());
        let ids = request_ids();
        let serial_ctx = crate::serial::driver::Context {
            handle: handle.clone(),
            model: board.model_name().to_owned(),
            started,
            ids: Arc::clone(&ids),
            sessions: session_names(&cfg),
            log_tail: Arc::clone(&reload.log_tail),
        };
        let (serial_tasks, ports) = super::serial::start(&cfg, &serial_ctx, &stop_rx)?;
        tasks.extend(serial_tasks);
        let modbus = super::modbus::start(&cfg, &handle, board.model_name(), &stop_rx)?;
        tasks.extend(modbus.tasks);
        board.ports = ports;
        board.ports.extend(modbus.ports);
        let serves_ports = !board.ports.is_empty();
        // The answer journal of the MQTT front end (none without MQTT).
        let journal = (cfg.mqtt.broker != Broker::Off)
            .then(|| Arc::new(std::sync::Mutex::new(open_journal(&cfg))));
        board.journal = journal
            .as_ref()
            .map(|j| j.lock().unwrap_or_else(|p| p.into_inner()).health());
        for p in &board.ports {
            let w = Arc::clone(&wake);
            p.observe(Arc::new(move || w.notify_one()));
        }
        // A storage fault that starts or ends shows in the status at once (the journal's is
        // only seen after the answer's job has ended).
        let healths = [
            Some(&handle.counters().saves),
            board.journal.as_deref(),
            board.audit.as_ref().map(|a| &a.health),
        ];
        for h in healths.into_iter().flatten() {
            let w = Arc::clone(&wake);
            h.observe(Arc::new(move || w.notify_one()));
        }
        let board = Arc::new(board);
        // After the ports are on the board: the first status shows them.
        let (status_tx, status_rx) = watch::channel(board.json(State::Online, &handle));
        let shown = board.key(&handle);

        #[cfg(feature = "embedded-broker")]
        let _broker = match &cfg.mqtt.broker {
            Broker::Embedded => Some(super::embedded::start(&cfg.mqtt)?),
            _ => None,
        };
        #[cfg(not(feature = "embedded-broker"))]
        if cfg.mqtt.broker == Broker::Embedded {
            return Err(DaemonError::Config(
                "mqtt.broker is \"embedded\" but this build has no embedded broker: point \
                 mqtt.broker at a broker (host:port)"
                    .into(),
            ));
        }
        let serving = format!("serving {} ({})", board.model_name(), board.kernels());
        // The last connection failure, until the broker accepts us: systemd's STATUS= says it.
        let trouble = Arc::new(std::sync::Mutex::new(None::<String>));
        let mut subscribed = None;
        if let Some(mut s) = settings(&cfg)? {
            #[cfg(feature = "test-hooks")]
            {
                s.test_kill_after_journal = hooks.kill_after_journal.clone();
            }
            s.on_link = Some(link_status(
                Arc::clone(&notifier),
                serving.clone(),
                Arc::clone(&trouble),
            ));
            // Made when it is published: the counters and uptime as the daemon leaves them.
            let offline: client::Offline = {
                let (board, handle) = (Arc::clone(&board), handle.clone());
                Arc::new(move || board.json(State::Offline, &handle))
            };
            let shared = client::Shared {
                service: handle.clone(),
                ids,
                journal: journal
                    .clone()
                    .unwrap_or_else(|| Arc::new(std::sync::Mutex::new(Journal::memory()))),
                limits: limits_rx,
            };
            // In a fleet, a second connection for the shared topic (see Role::Fleet).
            let fleet = s.topics.fleet_request.is_some().then(|| Settings {
                client_id: format!("{}-fleet", s.client_id),
                role: Role::Fleet,
                // The status line follows the device's own connection (the log has both).
                on_link: None,
                ..s.clone()
            });
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            subscribed = Some(ready_rx);
            tasks.push(tokio::spawn(client::run(
                s,
                shared.clone(),
                status_rx.clone(),
                offline.clone(),
                stop_rx.clone(),
                ready_tx,
            )));
            if let Some(f) = fleet {
                // Ready follows the device's own connection: the fleet's is an extra.
                let (fleet_ready, _) = tokio::sync::oneshot::channel();
                tasks.push(tokio::spawn(client::run(
                    f,
                    shared,
                    status_rx.clone(),
                    offline,
                    stop_rx.clone(),
                    fleet_ready,
                )));
            }
        }
        // The status follows the service: republished when the queue or the counters move.
        tasks.push(tokio::spawn(follow_status(
            Arc::clone(&board),
            handle.clone(),
            wake,
            shown,
            status_tx,
            stop_rx.clone(),
        )));
        if let Some(every) = notify::watchdog_interval() {
            tasks.push(tokio::spawn(watchdog(
                Arc::clone(&notifier),
                handle.clone(),
                every,
                stop_rx.clone(),
            )));
        }
        // Ready once requests can arrive: subscribed at the broker. A broker that cannot be
        // reached in time does not hold the service up (systemd would kill it): READY says
        // so, and the client keeps trying.
        let mut note = String::new();
        let mut signals = signals;
        // A stop asked for meanwhile is not kept waiting for the broker.
        let stopped_early = match subscribed {
            Some(rx) => tokio::select! {
                r = tokio::time::timeout(BROKER_WAIT, rx) => {
                    if r.is_err() {
                        // The reason when the broker gave one (credentials refused), rather
                        // than a guess that it is far away.
                        let why = trouble.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        note = match why {
                            Some(why) => {
                                tracing::warn!("MQTT: {why}: serving, and retrying");
                                format!("; MQTT: {why}")
                            }
                            None => {
                                tracing::warn!(
                                    "the MQTT broker is not reachable yet: serving, and retrying"
                                );
                                ", broker not reachable yet".into()
                            }
                        };
                    }
                    false
                }
                _ = stop_signal(&mut signals) => true,
            },
            None => false,
        };
        if !stopped_early {
            notifier.ready(&format!("{serving}{note}"));
            tracing::info!(ready_ms = started.elapsed().as_millis() as u64, "ready");
            let mut current = cfg.clone();
            wait_for_stop(signals, || {
                if apply_reload(&mut current, &reload, &handle, &limits_tx, serves_ports) {
                    notifier.status(&format!("{serving}, configuration reloaded"));
                }
            })
            .await;
        }
        notifier.stopping("stopping: finishing the answer in progress");
        tracing::info!("stopping");
        // No new requests, the running answer finishes or is cancelled within the grace
        // time, sessions are saved by the worker after each turn.
        let h = handle.clone();
        let stopper = tokio::task::spawn_blocking(move || service.shutdown(STOP_GRACE));
        let _ = stopper.await;
        drop(h);
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        Ok(())
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The MQTT client's settings, or `None` with `mqtt.broker = "off"`.
pub(super) fn settings(cfg: &Config) -> Result<Option<Settings>, DaemonError> {
    let m = &cfg.mqtt;
    let version = match m.protocol {
        super::config::Protocol::V5 => crate::mqtt::link::Version::V5,
        super::config::Protocol::V311 => crate::mqtt::link::Version::V311,
    };
    let (host, port) = match &m.broker {
        Broker::Off => return Ok(None),
        // rumqttd serves 3.1.1 on the port after the MQTT 5 one.
        Broker::Embedded if version == crate::mqtt::link::Version::V311 => {
            ("127.0.0.1".to_owned(), m.embedded_port + 1)
        }
        Broker::Embedded => ("127.0.0.1".to_owned(), m.embedded_port),
        Broker::Remote { host, port } => (host.clone(), *port),
    };
    let password = cfg
        .password()
        .map_err(|e| DaemonError::Config(e.to_string()))?;
    let credentials = match (&m.username, password) {
        (Some(u), p) => Some((
            u.clone(),
            p.map(|p| p.expose().to_owned()).unwrap_or_default(),
        )),
        (None, Some(_)) => {
            return Err(DaemonError::Config(
                "mqtt.password is set but mqtt.username is not".into(),
            ));
        }
        (None, None) => None,
    };
    let tls = match &m.tls {
        Some(t) => Some(super::tls::client_config(t).map_err(DaemonError::Config)?),
        None => None,
    };
    let topics = cfg
        .topics()
        .map_err(|e| DaemonError::Config(e.to_string()))?;
    let qos = match m.qos {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    };
    Ok(Some(Settings {
        host,
        port,
        client_id: format!("edgellm-{}", m.device),
        credentials,
        reread_password: m.password_file.is_some().then(|| reread(cfg)),
        tls,
        keepalive: m.keepalive(),
        topics,
        qos,
        limits: cfg.limits(),
        role: Role::Device,
        version,
        on_link: None,
        #[cfg(feature = "test-hooks")]
        test_kill_after_journal: None,
    }))
}

/// The answer journal: in the state directory, so that it outlives a crash; in memory without
/// one (or when its file cannot be opened: the daemon serves on, and says so).
fn open_journal(cfg: &Config) -> Journal {
    let Some(dir) = &cfg.state.dir else {
        return Journal::memory();
    };
    let path = dir.join("answers.journal");
    match Journal::open(&path) {
        Ok(j) => {
            tracing::info!(path = %path.display(), answers = j.len(), "answer journal opened");
            j
        }
        Err(e) => {
            tracing::error!(
                "{e}: answers are kept in memory only, a redelivery after a restart is computed again"
            );
            let j = Journal::memory();
            j.health().failed(e.to_string());
            j
        }
    }
}

/// Reads `mqtt.password_file` again, with the checks of the first time.
fn reread(cfg: &Config) -> client::Reread {
    let cfg = cfg.clone();
    Arc::new(move || match cfg.password() {
        Ok(p) => Ok(p.map(|p| p.expose().to_owned()).unwrap_or_default()),
        Err(e) => Err(e.to_string()),
    })
}

/// Puts the broker connection's trouble on systemd's status line (`systemctl status` shows
/// "serving …; MQTT: the broker refused the connection: bad user name or password; retrying
/// in 2000 ms"), and takes it off once connected again.
fn link_status(
    n: Arc<Notifier>,
    serving: String,
    trouble: Arc<std::sync::Mutex<Option<String>>>,
) -> client::OnLink {
    Arc::new(move |why: Option<&str>| {
        let mut t = trouble.lock().unwrap_or_else(|e| e.into_inner());
        match why {
            Some(w) => {
                n.status(&format!("{serving}; MQTT: {w}"));
                *t = Some(w.to_owned());
            }
            None if t.take().is_some() => n.status(&serving),
            None => {}
        }
    })
}

/// The names of the state directory's sessions, sorted (none without a state directory).
fn session_names(cfg: &Config) -> Arc<dyn Fn() -> Vec<String> + Send + Sync> {
    let dir = cfg.state.dir.as_ref().map(|d| d.join("sessions"));
    Arc::new(move || {
        let Some(Ok(rd)) = dir.as_ref().map(std::fs::read_dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                n.strip_suffix(".kv").map(str::to_owned)
            })
            .collect();
        names.sort();
        names
    })
}

/// Ids for requests that came without one: unique across restarts of this process.
fn request_ids() -> Arc<dyn Fn() -> String + Send + Sync> {
    let n = Arc::new(AtomicU64::new(0));
    let boot = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Arc::new(move || format!("gen-{boot:x}-{}", n.fetch_add(1, Ordering::Relaxed)))
}

/// SIGHUP: reads the configuration again and applies what can change while serving, the
/// limits and the log level; says which other changes wait for a restart (`ports`: serial
/// ports or Modbus servers are served). An invalid file changes nothing (`false`).
fn apply_reload(
    cur: &mut Config,
    reload: &Reload,
    handle: &crate::service::Handle,
    limits: &watch::Sender<crate::mqtt::contract::Limits>,
    ports: bool,
) -> bool {
    let new = match (reload.config)() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("SIGHUP: the configuration is not valid, nothing changed: {e}");
            return false;
        }
    };
    let mut applied = Vec::new();
    // Before the limits are taken: which of them the ports keep until a restart.
    let mut restart = if ports {
        cur.limits.kept_by_ports(&new.limits)
    } else {
        Vec::new()
    };
    if new.limits != cur.limits {
        let s = new.service_config();
        handle.set_limits(s.queue_depth, s.per_source, s.max_prompt_bytes);
        // The packet size was set at connection: the payload bound stays until a restart.
        let _ = limits.send(crate::mqtt::contract::Limits {
            max_payload: cur.limits().max_payload,
            ..new.limits()
        });
        cur.limits = new.limits.clone();
        applied.push("limits");
    }
    if new.log != cur.log {
        match (reload.log)(&new.log.level) {
            Ok(()) => {
                cur.log = new.log.clone();
                applied.push("log");
            }
            Err(e) => tracing::warn!("SIGHUP: log.level not changed: {e}"),
        }
    }
    restart.extend(cur.differs_from(&new));
    tracing::info!(
        applied = ?applied,
        need_restart = ?restart,
        "SIGHUP: configuration reloaded{}",
        if restart.is_empty() {
            ""
        } else {
            "; restart to apply the other changes"
        }
    );
    true
}

/// SIGTERM, SIGINT and SIGHUP, caught from when this is made: before READY, so that a stop
/// sent as soon as the daemon says it is ready (systemd, a test) is not the default action,
/// death without the offline status. `None`: the handlers could not be installed.
type Signals = Option<[tokio::signal::unix::Signal; 3]>;

fn catch_signals() -> Signals {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(term), Ok(int), Ok(hup)) => Some([term, int, hup]),
        _ => None,
    }
}

/// SIGTERM or SIGINT (a SIGHUP meanwhile stays pending for [`wait_for_stop`]).
async fn stop_signal(signals: &mut Signals) {
    match signals {
        Some([term, int, _]) => tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        },
        None => std::future::pending().await,
    }
}

/// SIGTERM or SIGINT; `on_hup` for each SIGHUP.
async fn wait_for_stop(signals: Signals, mut on_hup: impl FnMut()) {
    let Some([mut term, mut int, mut hup]) = signals else {
        tracing::error!("cannot install signal handlers: stop with SIGKILL");
        return std::future::pending().await;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => on_hup(),
        }
    }
}

/// Republishes the status when what it shows changes: woken by the service when a request is
/// queued, started or ended, never by a timer (an idle daemon sends nothing).
async fn follow_status(
    board: Arc<StatusBoard>,
    handle: crate::service::Handle,
    wake: Arc<tokio::sync::Notify>,
    // What the first status showed (a port may have opened since).
    mut last: super::status::Key,
    tx: watch::Sender<Vec<u8>>,
    mut stop: watch::Receiver<bool>,
) {
    let w = Arc::clone(&wake);
    handle.set_observer(Arc::new(move || w.notify_one()));
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = stop.changed() => return,
        }
        let key = board.key(&handle);
        if key != last {
            last = key;
            let state = if handle.running().is_some() || handle.queue_len() > 0 {
                State::Busy
            } else {
                State::Online
            };
            let _ = tx.send(board.json(state, &handle));
        }
    }
}

/// Pings systemd's watchdog while the worker is alive: idle, or busy and making progress.
/// A worker stuck inside one request stops the pings, and systemd restarts the daemon.
async fn watchdog(
    n: Arc<Notifier>,
    handle: crate::service::Handle,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if handle.stalled_for() < every * 2 {
            n.watchdog();
        } else {
            tracing::error!(
                stalled_ms = handle.stalled_for().as_millis() as u64,
                "the engine has made no progress: watchdog pings stopped"
            );
        }
    }
}
