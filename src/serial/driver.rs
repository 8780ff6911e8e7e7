//! The thin tokio loop of one port: open it, feed its bytes to the protocol core and the
//! service's events back, write what the core says, and open it again when it goes away.
//!
//! The port's request keeps running while the port is gone (an adapter unplugged for a
//! second): its events wait in its [`Ticket`] and are written once the port is back. A line
//! slower than the engine, or one that stays away, holds the answer back as any reader does:
//! the worker waits for room in the ticket until the request's deadline (the service's one
//! backpressure policy), so memory stays bounded.

use super::core::{Core, Env, StatusView};
use super::port::{PathWatch, Port, Settings};
use super::stats::{Count, PortState, PortStats};
use crate::service::{Canceller, Event, Handle, Refusal, Request, ServiceError, Ticket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a port's loop needs from the daemon.
#[derive(Clone)]
pub struct Context {
    pub handle: Handle,
    pub model: String,
    pub started: Instant,
    /// Fresh request ids.
    pub ids: Arc<dyn Fn() -> String + Send + Sync>,
    /// The state directory's session names.
    pub sessions: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
    /// The daemon's last log lines.
    pub log_tail: Arc<dyn Fn(usize) -> Vec<String> + Send + Sync>,
}

/// One port to serve.
pub struct Spec {
    pub path: PathBuf,
    pub settings: Settings,
}

/// Reopen delays: 250 ms doubling to 5 s, back to 250 ms once open.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Serves `spec` with `core` until `stop` turns true.
pub async fn run(
    spec: Spec,
    mut core: Box<dyn Core>,
    ctx: Context,
    stats: Arc<PortStats>,
    mut stop: watch::Receiver<bool>,
) {
    let mut env = PortEnv {
        out: Vec::new(),
        source: format!("serial:{}", spec.path.display()),
        ctx,
        submitted: None,
        cancel: None,
        stats: Arc::clone(&stats),
    };
    // The port's request, kept while the port is away.
    let mut ticket = None;
    let path = spec.path.display().to_string();
    let mut backoff = BACKOFF_MIN;
    let (mut opened_before, mut rs485_told, mut last_error) = (false, false, String::new());
    while !*stop.borrow() {
        // A port reopened through a link left behind may be another program's tty (a pty
        // whose number was taken again): once the link is pointed at the real device, that
        // one is the port, and the bytes its PLC sent meanwhile wait in it. Watched from
        // before the open, so that no change after it is missed.
        let watch = PathWatch::new(&spec.path);
        let port = match Port::open(&spec.path, &spec.settings) {
            Ok(p) => p,
            Err(e) => {
                let why = e.to_string();
                // Once per distinct reason: a port that stays away does not flood the log.
                if why != last_error {
                    tracing::warn!(port = path, "serial port not available, retrying: {why}");
                    last_error.clone_from(&why);
                }
                stats.set_state(PortState::Reopening, Some(why));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        if let Some(note) = &port.rs485_note
            && !rs485_told
        {
            tracing::warn!(port = path, "{note}");
            rs485_told = true;
        }
        // Without a watch (no inotify descriptor to be had) the port is served as before:
        // only a hang-up ends it.
        let watch = watch
            .inspect_err(|e| tracing::warn!(port = path, "the port's path is not watched: {e}"))
            .ok();
        if opened_before {
            stats.counters.reopens.fetch_add(1, Ordering::Relaxed);
        }
        core.on_open(&mut env);
        opened_before = true;
        last_error.clear();
        backoff = BACKOFF_MIN;
        stats.set_state(PortState::Open, None);
        tracing::info!(
            port = path,
            mode = stats.mode,
            baud = spec.settings.baud,
            device = %port.device().unwrap_or_default().display(),
            "serial port open"
        );
        let served = serve(
            &spec.path,
            &port,
            watch,
            core.as_mut(),
            &mut env,
            &mut ticket,
            &mut stop,
        );
        let Some(why) = served.await else {
            break;
        };
        tracing::warn!(port = path, "serial port lost, reopening: {why}");
        stats.set_state(PortState::Reopening, Some(why));
    }
    // Stopping: the service's shutdown finishes or cancels the running answer.
    tracing::debug!(port = path, "serial port closed");
}

/// Runs the port until it goes away or `path` names another device (asked each time `watch`
/// sees its directory change) (`Some(why)`), or the daemon stops (`None`).
async fn serve(
    path: &Path,
    port: &Port,
    mut watch: Option<PathWatch>,
    core: &mut dyn Core,
    env: &mut PortEnv,
    ticket: &mut Option<Ticket>,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    let mut buf = [0u8; 1024];
    loop {
        // What the last step submitted: its events are read from now on.
        if let Some(t) = env.submitted.take() {
            *ticket = Some(t);
        }
        // What the last step produced: written before anything else is read.
        if !env.out.is_empty() {
            if let Err(e) = port.write_all(&env.out).await {
                return Some(format!("write: {e}"));
            }
            let n = env.out.len() as u64;
            env.stats.counters.tx_bytes.fetch_add(n, Ordering::Relaxed);
            env.out.clear();
        }
        let tick = core.deadline();
        tokio::select! {
            r = port.read(&mut buf) => match r {
                Ok(0) => return Some("the other end closed the line".into()),
                Ok(n) => {
                    env.stats.counters.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    core.on_bytes(&buf[..n], env);
                }
                Err(e) => return Some(format!("read: {e}")),
            },
            ev = next_event(ticket) => match ev {
                Some(ev) => {
                    if matches!(ev, Event::Done(_) | Event::Error(_)) {
                        *ticket = None;
                        env.cancel = None;
                    }
                    core.on_event(ev, env);
                }
                // Ended: its last event was read above.
                None => *ticket = None,
            },
            _ = sleep_until(tick), if tick.is_some() => core.on_tick(env),
            r = changed(&watch) => {
                if let Err(e) = r {
                    tracing::warn!(port = %path.display(), "the port's path is no longer watched: {e}");
                    watch = None;
                }
                if let Some(why) = port.moved_from(path) {
                    return Some(why);
                }
            }
            _ = stop.changed() => return None,
        }
    }
}

/// The next event of the port's request; never without one.
async fn next_event(t: &mut Option<Ticket>) -> Option<Event> {
    match t {
        Some(t) => t.recv().await,
        None => std::future::pending().await,
    }
}

/// The next change of the watched directory; never without a watch.
async fn changed(w: &Option<PathWatch>) -> std::io::Result<()> {
    match w {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(t: Option<Instant>) {
    if let Some(t) = t {
        tokio::time::sleep_until(t.into()).await;
    }
}

struct PortEnv {
    out: Vec<u8>,
    source: String,
    ctx: Context,
    /// The ticket of a request the core just submitted, for the loop to read.
    submitted: Option<Ticket>,
    /// Cancels the port's request while it runs.
    cancel: Option<Canceller>,
    stats: Arc<PortStats>,
}

impl Env for PortEnv {
    fn write(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    fn submit(&mut self, req: Request) -> Result<(), ServiceError> {
        let t = self.ctx.handle.submit(req)?;
        self.cancel = Some(t.canceller());
        self.submitted = Some(t);
        Ok(())
    }

    fn refused(&mut self, r: Refusal) {
        self.ctx.handle.refused(r);
    }

    fn cancel(&mut self) {
        if let Some(c) = &self.cancel {
            c.cancel();
        }
    }

    fn new_id(&mut self) -> String {
        (self.ctx.ids)()
    }

    fn source(&self) -> &str {
        &self.source
    }

    fn status(&self) -> StatusView {
        let h = &self.ctx.handle;
        let c = h.counters();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let p = &self.stats.counters;
        let running = h.running().is_some();
        StatusView {
            state: if running || h.queue_len() > 0 {
                "busy"
            } else {
                "online"
            },
            model: self.ctx.model.clone(),
            queue: h.queue_len(),
            running,
            answered: n(&c.answered),
            failed: n(&c.failed),
            busy: n(&c.busy),
            uptime_s: self.ctx.started.elapsed().as_secs(),
            port_requests: n(&p.requests),
            port_bad_input: n(&p.bad_input),
            port_checksum_errors: n(&p.checksum_errors),
        }
    }

    fn sessions(&self) -> Vec<String> {
        (self.ctx.sessions)()
    }

    fn log_tail(&self, lines: usize) -> Vec<String> {
        (self.ctx.log_tail)(lines)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn count(&mut self, c: Count) {
        self.stats.bump(c);
    }
}
