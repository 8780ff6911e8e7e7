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
use crate::engine::Engine;
use crate::model::{LoadOptions, Model};
use crate::mqtt::client::{self, Settings};
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
    #[error("embedded broker: {0}")]
    Broker(String),
    #[error("cannot start the I/O runtime: {0}")]
    Runtime(std::io::Error),
}

/// How long a running answer may go on after SIGTERM before it is cancelled.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long start-up waits for the broker before it reports ready without it.
const BROKER_WAIT: Duration = Duration::from_secs(10);

/// Runs the daemon until SIGTERM or SIGINT. `model` is the resolved model path.
pub fn serve(cfg: Config, model: PathBuf) -> Result<(), DaemonError> {
    let started = Instant::now();
    let notifier = Arc::new(Notifier::from_env());
    notifier.status("loading the model");
    let m = Model::load(
        &model,
        &LoadOptions {
            mlock: cfg.model.mlock,
        },
    )
    .map_err(|e| DaemonError::Model(e.to_string()))?;
    let engine = Engine::new(Arc::new(m), cfg.engine_config())
        .map_err(|e| DaemonError::Model(format!("{}: {e}", model.display())))?;
    let board = StatusBoard::new(&engine, &model, cfg.model.board.clone(), started);
    let service = Service::start(engine, cfg.service_config())?;
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
        let (stop_tx, stop_rx) = watch::channel(false);
        let (status_tx, status_rx) = watch::channel(board.json(State::Online, &handle));
        let board = Arc::new(board);
        let mut tasks = Vec::new();

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
            s.on_link = Some(link_status(
                Arc::clone(&notifier),
                serving.clone(),
                Arc::clone(&trouble),
            ));
            let ids = request_ids();
            let offline = board.json(State::Offline, &handle);
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            subscribed = Some(ready_rx);
            tasks.push(tokio::spawn(client::run(
                s,
                handle.clone(),
                status_rx.clone(),
                offline,
                stop_rx.clone(),
                ids,
                ready_tx,
            )));
        }
        // The status follows the service: republished when the queue or the counters move.
        tasks.push(tokio::spawn(follow_status(
            Arc::clone(&board),
            handle.clone(),
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
        if let Some(rx) = subscribed
            && tokio::time::timeout(BROKER_WAIT, rx).await.is_err()
        {
            tracing::warn!("the MQTT broker is not reachable yet: serving, and retrying");
            note = match &*trouble.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(why) => format!("; MQTT: {why}"),
                None => ", broker not reachable yet".into(),
            };
        }
        notifier.ready(&format!("{serving}{note}"));
        tracing::info!(ready_ms = started.elapsed().as_millis() as u64, "ready");

        wait_for_stop().await;
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
fn settings(cfg: &Config) -> Result<Option<Settings>, DaemonError> {
    let m = &cfg.mqtt;
    if m.protocol != super::config::Protocol::V5 {
        return Err(DaemonError::Config(
            "mqtt.protocol = \"v311\": this version's client speaks MQTT 5 only (brokers \
             from Mosquitto 1.6 and EMQX 4 on do); 3.1.1 clients can still send requests"
                .into(),
        ));
    }
    let (host, port) = match &m.broker {
        Broker::Off => return Ok(None),
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
        on_link: None,
    }))
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

/// Ids for requests that came without one: unique across restarts of this process.
fn request_ids() -> Arc<dyn Fn() -> String + Send + Sync> {
    let n = Arc::new(AtomicU64::new(0));
    let boot = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Arc::new(move || format!("gen-{boot:x}-{}", n.fetch_add(1, Ordering::Relaxed)))
}

/// SIGTERM or SIGINT. SIGHUP is answered with a log line: nothing is reloaded yet.
async fn wait_for_stop() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers: stop with SIGKILL");
        return std::future::pending().await;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => tracing::warn!("SIGHUP: this version reloads nothing; restart to apply a changed configuration"),
        }
    }
}

/// Republishes the status when what it shows changes: woken by the service when a request is
/// queued, started or ended, never by a timer (an idle daemon sends nothing).
async fn follow_status(
    board: Arc<StatusBoard>,
    handle: crate::service::Handle,
    tx: watch::Sender<Vec<u8>>,
    mut stop: watch::Receiver<bool>,
) {
    let wake = Arc::new(tokio::sync::Notify::new());
    let w = Arc::clone(&wake);
    handle.set_observer(Arc::new(move || w.notify_one()));
    let mut last = board.key(&handle);
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
