//! The Modbus servers: tokio-modbus over a serial port (RTU) and over TCP, both around one
//! [`Mailbox`] each, both feeding the service.
//!
//! A request's [`Ticket`] is read by a task of its own, which puts each event into the mailbox
//! (a `std` mutex, held for one small update or one register access). A master that polls
//! slowly never holds up the engine: the task keeps the ticket drained.
//!
//! Unit ids. RTU: only requests for the configured unit id are answered; any other (the
//! broadcast address 0 included: a broadcast must not trigger a prompt on every appliance of a
//! bus) gets no reply at all, so other slaves can share the RS-485 bus. TCP: the configured
//! unit id and 0xFF (the "unit not used" value of the Modbus TCP guide) are served; any other
//! is answered with exception 0x0B (gateway target device failed to respond), so a
//! misconfigured master sees at once what is wrong instead of timing out.
//!
//! The RTU port is held for the life of the loop and reopened when it goes away (250 ms
//! doubling to 5 s between tries). tokio-modbus ends its server on a frame it cannot decode
//! (after dropping 20 bytes of garbage in a row); the loop then starts a new server on a
//! duplicate of the same descriptor, so line noise never costs a reopen.

use super::map::{Exception, Mailbox, MailboxConfig, Written};
use super::tcp_guard::{Guarded, tcp_unit_served};
use super::typed::Typed;
use crate::serial::stats::{Count, PortState, PortStats};
use crate::service::{Canceller, Handle, Ticket};
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;
use tokio_modbus::prelude::{
    ConformityLevel, DeviceIdObject, ReadCode, ReadDeviceIdentificationResponse,
};
use tokio_modbus::{ExceptionCode, Request, Response, SlaveRequest};
use tokio_serial::{DataBits, FlowControl, Parity, SerialStream, StopBits};

/// What a Modbus server is: its unit id, how it names itself, and the bounds of a request.
#[derive(Clone, Debug)]
pub struct ModbusConfig {
    /// The slave address (1–247).
    pub unit_id: u8,
    /// The model, as FC43/14's product code names it.
    pub model_name: String,
    /// The appliance's version, FC43/14's revision.
    pub version: String,
    /// Most tokens a request may ask for (and what `MAX_TOKENS` = 0 means).
    pub max_tokens: usize,
    /// A request is answered `timeout` once this passes.
    pub timeout: Option<Duration>,
    /// Most bytes of prompt (at most 65534).
    pub max_prompt_bytes: usize,
    /// Most bytes of answer kept.
    pub max_answer_bytes: usize,
    /// The answer formats a master selects with `FORMAT` (1 is the first).
    pub formats: Arc<[Typed]>,
}

/// How to set up an RTU line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtuSettings {
    pub baud: u32,
    /// Drive an RS-485 transceiver's direction line (`TIOCSRS485`), as line and frame ports do.
    pub rs485: bool,
    pub data_bits: DataBits,
    pub parity: Parity,
    pub stop_bits: StopBits,
    pub flow: FlowControl,
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("Modbus TCP: cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// How long the RTU loop waits before trying a port again: doubled on each failure.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The heartbeat stops counting when the worker has made no progress for this long.
const STALLED: Duration = Duration::from_secs(10);

/// A mailbox and what its requests need, shared by its server's calls and its sinks.
struct Shared {
    map: Arc<Mutex<Mailbox>>,
    handle: Handle,
    stats: Arc<PortStats>,
    /// Cancels the mailbox's request while it runs.
    cancel: Mutex<Option<Canceller>>,
    timeout: Option<Duration>,
    /// Where the heartbeat's last whole second fell.
    beat: Mutex<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every mutation of a mailbox is one call that leaves it consistent: serve on after a
    // panic rather than stop answering the PLC.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What names a mailbox in its request ids: `tcp`, or an RTU port's path without `/dev/`
/// (`ttyS1`, `serial-by-id-usb-FTDI…`), in the characters an id may hold.
fn id_tag(source: Option<&Path>) -> String {
    let Some(path) = source else {
        return "tcp".into();
    };
    let p = path.to_string_lossy();
    let p = p.strip_prefix("/dev/").unwrap_or(&p);
    let tag: String = p
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '-',
        })
        .collect();
    // The end of a long path tells ports apart (`…-port0`); ids stay well within their bound.
    let skip = tag.len().saturating_sub(48);
    tag[skip..].trim_matches('-').to_owned()
}

impl Shared {
    /// `rtu_path`: the RTU port this mailbox serves, `None` for TCP.
    fn new(
        cfg: &ModbusConfig,
        handle: Handle,
        stats: Arc<PortStats>,
        rtu_path: Option<&Path>,
    ) -> Arc<Shared> {
        // Unique across restarts (the boot time in seconds) and between mailboxes (the port
        // they serve), then a counter.
        let boot = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let map = Mailbox::new(MailboxConfig {
            max_prompt_bytes: cfg.max_prompt_bytes,
            max_tokens: cfg.max_tokens,
            max_answer_bytes: cfg.max_answer_bytes,
            id_prefix: format!("modbus-{}-{boot:x}", id_tag(rtu_path)),
            vendor: "edgellm".into(),
            product: cfg.model_name.clone(),
            version: cfg.version.clone(),
            formats: Arc::clone(&cfg.formats),
        });
        Arc::new(Shared {
            map: Arc::new(Mutex::new(map)),
            handle,
            stats,
            cancel: Mutex::new(None),
            timeout: cfg.timeout,
            beat: Mutex::new(Instant::now()),
        })
    }

    /// Brings the heartbeat up to the clock before a read: +1 for each whole second since
    /// the last, unless the worker is stuck. Counted when a master asks, not by a timer, so an
    /// idle appliance with a Modbus port still wakes for nothing.
    fn beat(&self, map: &mut Mailbox) {
        let mut last = lock(&self.beat);
        let secs = last.elapsed().as_secs();
        if secs == 0 {
            return;
        }
        *last += Duration::from_secs(secs);
        if self.handle.stalled_for() < STALLED {
            map.advance(secs);
        }
    }

    /// One PDU for this mailbox; `source` names the master.
    fn call(&self, req: Request<'_>, source: &str) -> Result<Option<Response>, Exception> {
        let mut map = lock(&self.map);
        self.beat(&mut map);
        if let Some(id) = map.current().map(str::to_owned)
            && self.handle.running().as_deref() == Some(id.as_str())
        {
            map.started(&id);
        }
        let r = match req {
            Request::ReadHoldingRegisters(a, n) => Response::ReadHoldingRegisters(map.read(a, n)?),
            Request::ReadInputRegisters(a, n) => Response::ReadInputRegisters(map.read(a, n)?),
            Request::WriteSingleRegister(a, v) => {
                let w = map.write(a, &[v])?;
                self.act(&mut map, w, source)?;
                Response::WriteSingleRegister(a, v)
            }
            Request::WriteMultipleRegisters(a, vs) => {
                let w = map.write(a, &vs)?;
                self.act(&mut map, w, source)?;
                Response::WriteMultipleRegisters(a, vs.len() as u16)
            }
            Request::ReadWriteMultipleRegisters(ra, n, wa, vs) => {
                let (w, regs) = map.read_write(ra, n, wa, &vs)?;
                self.act(&mut map, w, source)?;
                Response::ReadWriteMultipleRegisters(regs)
            }
            Request::ReadDeviceIdentification(code, object) => {
                let raw = match code {
                    ReadCode::Basic => 1,
                    ReadCode::Regular => 2,
                    ReadCode::Extended => 3,
                    ReadCode::Specific => 4,
                };
                let objects = map.device_id(raw, object)?;
                Response::ReadDeviceIdentification(ReadDeviceIdentificationResponse {
                    read_code: code,
                    conformity_level: ConformityLevel::BasicIdentification,
                    more_follows: false,
                    next_object_id: 0,
                    device_id_objects: objects
                        .into_iter()
                        .map(|(id, v)| DeviceIdObject {
                            id,
                            value: bytes::Bytes::from(v.into_bytes()),
                        })
                        .collect(),
                })
            }
            _ => return Err(Exception::IllegalFunction),
        };
        Ok(Some(r))
    }

    /// Does what a write asked beyond its registers: submit, cancel, count.
    fn act(&self, map: &mut Mailbox, w: Written, source: &str) -> Result<(), Exception> {
        match w {
            Written::Stored => Ok(()),
            Written::Duplicate => {
                self.stats.bump(Count::Duplicate);
                Ok(())
            }
            Written::Cancel => {
                if let Some(c) = lock(&self.cancel).as_ref() {
                    c.cancel();
                }
                Ok(())
            }
            Written::Submit(req) => {
                let mut req = *req;
                req.source = source.to_owned();
                req.deadline = self.timeout.map(|t| Instant::now() + t);
                tracing::info!(id = %req.id, source, "Modbus request");
                self.stats.bump(Count::Requests);
                match self.handle.submit(req) {
                    Ok(t) => {
                        *lock(&self.cancel) = Some(t.canceller());
                        tokio::spawn(into_mailbox(t, Arc::clone(&self.map)));
                        Ok(())
                    }
                    Err(e) => {
                        tracing::warn!(source, error = %e, "Modbus request refused");
                        map.refused(&e).map_or(Ok(()), Err)
                    }
                }
            }
        }
    }
}

/// Reads a request's events into its mailbox while it is still the mailbox's request; once
/// it is not (a newer request took its place), the ticket is dropped, which cancels it.
async fn into_mailbox(mut t: Ticket, map: Arc<Mutex<Mailbox>>) {
    while let Some(ev) = t.recv().await {
        if !lock(&map).on_event(t.id(), ev) {
            break;
        }
    }
}

fn exception_code(e: Exception) -> ExceptionCode {
    match e {
        Exception::IllegalFunction => ExceptionCode::IllegalFunction,
        Exception::IllegalDataAddress => ExceptionCode::IllegalDataAddress,
        Exception::IllegalDataValue => ExceptionCode::IllegalDataValue,
        Exception::ServerDeviceBusy => ExceptionCode::ServerDeviceBusy,
    }
}

/// Which unit ids a transport serves, and what others get.
#[derive(Clone, Copy)]
enum Units {
    /// RTU: this one; others get silence.
    Rtu(u8),
    /// TCP: this one and 0xFF; others get exception 0x0B.
    Tcp(u8),
}

/// The tokio-modbus service of one connection (RTU: the port; TCP: one master).
struct Service {
    shared: Arc<Shared>,
    units: Units,
    source: String,
}

impl tokio_modbus::server::Service for Service {
    type Request = SlaveRequest<'static>;
    type Response = Option<Response>;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Option<Response>, ExceptionCode>>;

    fn call(&self, req: SlaveRequest<'static>) -> Self::Future {
        let ours = match self.units {
            Units::Rtu(u) => req.slave == u,
            Units::Tcp(u) => tcp_unit_served(u, req.slave),
        };
        if !ours {
            return ready(match self.units {
                Units::Rtu(_) => Ok(None),
                Units::Tcp(_) => Err(ExceptionCode::GatewayTargetDevice),
            });
        }
        let r = self.shared.call(req.request, &self.source);
        if r.is_err() {
            self.shared.stats.bump(Count::BadInput);
        }
        ready(r.map_err(exception_code))
    }
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

fn open(path: &Path, s: &RtuSettings) -> Result<serialport::TTYPort, tokio_serial::Error> {
    let b = tokio_serial::new(path.to_string_lossy(), s.baud)
        .data_bits(s.data_bits)
        .parity(s.parity)
        .stop_bits(s.stop_bits)
        .flow_control(s.flow);
    serialport::TTYPort::open(&b)
}

/// Serves Modbus RTU on the serial port at `path` until `stop`, reopening it whenever it goes
/// away or cannot be opened. Its state and counters go to `stats`.
pub async fn serve_rtu(
    path: PathBuf,
    settings: RtuSettings,
    cfg: ModbusConfig,
    handle: Handle,
    stats: Arc<PortStats>,
    mut stop: watch::Receiver<bool>,
) {
    let shared = Shared::new(&cfg, handle, Arc::clone(&stats), Some(&path));
    let source = format!("modbus:{}", path.display());
    let mut backoff = BACKOFF_MIN;
    let mut opened_before = false;
    let mut rs485_told = false;
    'reopen: loop {
        let port = match open(&path, &settings) {
            Ok(p) => p,
            Err(e) => {
                let why = format!("{}: {e}", path.display());
                if stats.state().1.as_deref() != Some(why.as_str()) {
                    tracing::warn!(port = %path.display(), error = %e, "cannot open the Modbus port; retrying");
                }
                stats.set_state(PortState::Reopening, Some(why));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped(&mut stop) => break,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        if opened_before {
            stats.counters.reopens.fetch_add(1, Ordering::Relaxed);
        }
        opened_before = true;
        backoff = BACKOFF_MIN;
        // A port without the mode (a pty, a UART driver without RS-485) is served as is, and
        // said once, not at every reopen.
        if settings.rs485
            && let Err(e) =
                crate::serial::port::rs485::enable(std::os::fd::AsRawFd::as_raw_fd(&port))
            && !rs485_told
        {
            tracing::warn!(port = %path.display(), "{}", crate::serial::port::rs485::note(e));
            rs485_told = true;
        }
        stats.set_state(PortState::Open, None);
        tracing::info!(port = %path.display(), unit = cfg.unit_id, "Modbus RTU serving");
        // One server per run of good frames; a frame tokio-modbus cannot decode ends it, and
        // the next one starts on a duplicate of the same descriptor.
        loop {
            let stream = match port
                .try_clone_native()
                .map_err(std::io::Error::from)
                .and_then(|p| SerialStream::try_from(p).map_err(std::io::Error::from))
            {
                Ok(s) => s,
                Err(e) => {
                    stats.set_state(PortState::Reopening, Some(e.to_string()));
                    drop(port);
                    tokio::select! {
                        _ = tokio::time::sleep(BACKOFF_MIN) => {}
                        _ = stopped(&mut stop) => break 'reopen,
                    }
                    continue 'reopen;
                }
            };
            let service = Service {
                shared: Arc::clone(&shared),
                units: Units::Rtu(cfg.unit_id),
                source: source.clone(),
            };
            let served = tokio_modbus::server::rtu::Server::new(stream);
            let r = tokio::select! {
                r = served.serve_forever(service) => r,
                _ = stopped(&mut stop) => break 'reopen,
            };
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    stats.bump(Count::BadInput);
                    tracing::debug!(port = %path.display(), error = %e, "Modbus RTU: garbage on the line");
                }
                r => {
                    let why = match r {
                        Ok(()) => "the port closed".to_owned(),
                        Err(e) => e.to_string(),
                    };
                    tracing::warn!(port = %path.display(), error = %why, "Modbus port went away; reopening");
                    stats.set_state(
                        PortState::Reopening,
                        Some(format!("{}: {why}", path.display())),
                    );
                    drop(port);
                    tokio::select! {
                        _ = tokio::time::sleep(BACKOFF_MIN) => {}
                        _ = stopped(&mut stop) => break 'reopen,
                    }
                    continue 'reopen;
                }
            }
        }
    }
}

/// Binds the Modbus TCP listener (before the daemon reports ready, so a taken port fails
/// the start).
pub fn bind_tcp(addr: SocketAddr) -> Result<std::net::TcpListener, ServeError> {
    let l =
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
    l.set_nonblocking(true)
        .map_err(|source| ServeError::Bind { addr, source })?;
    Ok(l)
}

/// Serves Modbus TCP on `addr` until `stop`: binds, then [`serve_tcp_listener`].
pub async fn serve_tcp(
    addr: SocketAddr,
    cfg: ModbusConfig,
    handle: Handle,
    stats: Arc<PortStats>,
    stop: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let l = bind_tcp(addr)?;
    serve_tcp_listener(l, cfg, handle, stats, stop).await;
    Ok(())
}

/// Serves Modbus TCP on a bound listener until `stop`. All connections share one mailbox: a
/// PLC that reconnects between its writes finds its prompt where it left it.
pub async fn serve_tcp_listener(
    listener: std::net::TcpListener,
    cfg: ModbusConfig,
    handle: Handle,
    stats: Arc<PortStats>,
    mut stop: watch::Receiver<bool>,
) {
    let shared = Shared::new(&cfg, handle, Arc::clone(&stats), None);
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            stats.set_state(PortState::Reopening, Some(e.to_string()));
            tracing::error!(error = %e, "Modbus TCP: cannot use the listener");
            return;
        }
    };
    if let Ok(a) = listener.local_addr() {
        tracing::info!(addr = %a, unit = cfg.unit_id, "Modbus TCP serving");
    }
    stats.set_state(PortState::Open, None);
    let server = tokio_modbus::server::tcp::Server::new(listener);
    let unit = cfg.unit_id;
    let on_connected = |stream, peer: SocketAddr| {
        let (shared, stats) = (Arc::clone(&shared), Arc::clone(&stats));
        async move {
            let accepted =
                tokio_modbus::server::tcp::accept_tcp_connection(stream, peer, |peer| {
                    Ok(Some(Service {
                        shared: Arc::clone(&shared),
                        units: Units::Tcp(unit),
                        source: format!("modbus:{peer}"),
                    }))
                })?;
            // A request longer than the protocol allows is answered, not a dropped connection.
            Ok(accepted.map(|(service, stream)| (service, Guarded::new(stream, unit, stats))))
        }
    };
    let on_error = |e: std::io::Error| tracing::debug!(error = %e, "Modbus TCP connection ended");
    tokio::select! {
        r = server.serve(&on_connected, on_error) => {
            if let Err(e) = r {
                stats.set_state(PortState::Reopening, Some(e.to_string()));
                tracing::error!(error = %e, "Modbus TCP listener failed");
            }
        }
        _ = stopped(&mut stop) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::id_tag;
    use std::path::Path;

    #[test]
    fn every_mailbox_names_its_request_ids_after_its_own_port() {
        let tags: Vec<String> = [
            None,
            Some("/dev/ttyS1"),
            Some("/dev/ttyS2"),
            Some("/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0"),
            Some("/tmp/pty a"),
        ]
        .into_iter()
        .map(|p| id_tag(p.map(Path::new)))
        .collect();
        assert_eq!(tags[..3], ["tcp", "ttyS1", "ttyS2"]);
        assert!(
            tags[3].ends_with("usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0")
                && tags[3].len() <= 48
                && !tags[3].starts_with('-'),
            "{}",
            tags[3]
        );
        assert_eq!(tags[4], "tmp-pty-a");
        for t in &tags {
            assert!(crate::service::check_id(&format!("modbus-{t}-6b12ee7a-1"), &[]).is_ok());
        }
    }
}
